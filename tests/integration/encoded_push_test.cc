// Pushes encoded at the edge, through the real daemon: the plan route, the encoded body on the
// version's PUT, and the refusals a client can meet (a stale plan, a damaged body).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "daemon_process.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::DriftingModel;
using testing::RawHttp;
using testing::RawResponse;
using testing::TempDir;

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class EncodedPushDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }

  // Starts (or restarts) the daemon on the test's directory, with `config` as its file if given.
  void Start(const std::string& config = "") {
    std::vector<std::string> args;
    if (!config.empty()) {
      const auto path = dir_.path() / "encoded.toml";
      std::ofstream(path) << config;
      args = {"--config", path.string()};
    }
    daemon_.reset();
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(), std::move(args));
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }
  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  RawResponse Send(std::string_view method, std::string_view target, std::string_view body,
                   std::string_view content_type = {}) {
    RawHttp http(daemon_->port());
    std::string head =
        std::string(method) + " " + std::string(target) +
        " HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (!content_type.empty()) head += "Content-Type: " + std::string(content_type) + "\r\n";
    head += "\r\n";
    RawResponse failed;
    failed.error = "send failed";
    if (!http.Send(head) || !http.Send(body)) return failed;
    return http.Read();
  }

  // The plan of pushing `body` as `version`.
  Result<CodingPlan> Plan(uint64_t version, const std::string& body) {
    CKPT_ASSIGN_OR_RETURN(const CheckpointView view, CheckpointView::Parse(Bytes(body)));
    const RawResponse r = Send("POST", "/v1/models/m/versions/" + std::to_string(version) + "/plan",
                               view.raw_header());
    if (r.status != 200) return Status::Internal("plan: " + std::to_string(r.status) + r.body);
    return CodingPlan::FromJson(r.body);
  }

  // Encodes `body` by `plan` against the reconstruction the client holds.
  std::string Encode(const CodingPlan& plan, const std::string& body) {
    const auto view = CheckpointView::Parse(Bytes(body));
    EXPECT_TRUE(view.ok());
    std::optional<CheckpointView> reference;
    if (!held_.empty()) reference = CheckpointView::Parse(held_).value();
    std::string encoded;
    auto done = EncodeByPlan(
        plan, *view, reference ? &*reference : nullptr, 2,
        [&](std::string_view piece) {
          encoded.append(piece);
          return Status::Ok();
        },
        CollectInto(&next_held_));
    EXPECT_TRUE(done.ok()) << done.status().ToString();
    return encoded;
  }

  RawResponse PushEncoded(uint64_t version, std::string_view encoded) {
    return Send("PUT", "/v1/models/m/versions/" + std::to_string(version), encoded,
                kEncodedBodyMediaType);
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::vector<uint8_t> held_, next_held_;  // the reconstruction of the client's last push
};

// A lossy run pushed encoded: each version restores to the client's reconstruction, within
// the bound, and the wire carries a fraction of the checkpoint.
TEST_F(EncodedPushDaemonTest, EncodedVersionsRestoreToTheClientsReconstruction) {
  ASSERT_EQ(Send("PUT", "/v1/models/m/policy", R"({"mode":"lossy","max_abs_error":5e-3})").status,
            200);
  DriftingModel drift(21, 200000);
  uint64_t raw = 0, sent = 0;
  for (uint64_t v = 1; v <= 4; ++v) {
    const std::string body = drift.Next();
    auto plan = Plan(v, body);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->base.has_value(), v > 1);
    const std::string encoded = Encode(*plan, body);
    const RawResponse pushed = PushEncoded(v, encoded);
    ASSERT_EQ(pushed.status, 201) << pushed.body;
    held_ = next_held_;
    raw += body.size();
    sent += encoded.size();
    const RawResponse restored = Send("GET", "/v1/models/m/versions/" + std::to_string(v), "");
    ASSERT_EQ(restored.status, 200);
    EXPECT_EQ(restored.body, std::string(held_.begin(), held_.end())) << v;
    EXPECT_EQ(testing::CheckWithinBound(body, restored.body, 5e-3).error, "") << v;
  }
  EXPECT_LT(sent * 4, raw) << sent << " bytes sent for " << raw;
}

// A plan another push made stale is refused with 409 saying what to do; a damaged or
// malformed body with 400; the daemon keeps serving and stores nothing of them.
TEST_F(EncodedPushDaemonTest, StalePlansAndDamagedBodiesAreRefused) {
  DriftingModel drift(22, 20000);
  const std::string v1 = drift.Next(), v2 = drift.Next();
  auto plan = Plan(1, v1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::string encoded = Encode(*plan, v1);
  ASSERT_EQ(Send("PUT", "/v1/models/m/versions/1", v1).status, 201);  // pushed raw meanwhile
  auto late = PushEncoded(2, encoded);
  EXPECT_EQ(late.status, 409) << late.body;
  EXPECT_NE(late.body.find("ask for a new plan"), std::string::npos) << late.body;
  EXPECT_NE(late.body.find(R"("reason":"STALE_PLAN")"), std::string::npos) << late.body;

  auto garbage = PushEncoded(2, std::string(100, 'x'));
  EXPECT_EQ(garbage.status, 400) << garbage.body;
  EXPECT_NE(garbage.body.find("CKPTENC"), std::string::npos) << garbage.body;
  auto bad_header = Send("POST", "/v1/models/m/versions/2/plan", "not a header");
  EXPECT_EQ(bad_header.status, 400) << bad_header.body;
  auto latest = Send("POST", "/v1/models/m/versions/latest/plan", v2.substr(0, 16));
  EXPECT_EQ(latest.status, 400) << latest.body;
  auto shard = Send("PUT", "/v1/models/m/versions/2/shards/0?of=2", encoded, kEncodedBodyMediaType);
  EXPECT_EQ(shard.status, 400) << shard.body;

  const RawResponse versions = Send("GET", "/v1/models/m/versions", "");
  ASSERT_EQ(versions.status, 200);
  EXPECT_EQ(nlohmann::json::parse(versions.body)["versions"].size(), 1u);
  // And a fresh plan works, its media type written with a parameter and in another case.
  held_.assign(v1.begin(), v1.end());  // lossless default: the reconstruction is the file
  auto fresh = Plan(2, v2);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(Send("PUT", "/v1/models/m/versions/2", Encode(*fresh, v2),
                 "Application/Vnd.Ckpt.Encoded-Push; charset=binary")
                .status,
            201);
  // A restore answers by Accept: q=0 refuses the encoded body.
  RawHttp http(daemon_->port());
  ASSERT_TRUE(
      http.Send("GET /v1/models/m/versions/2 HTTP/1.1\r\nHost: x\r\nAccept: "
                "application/vnd.ckpt.encoded-pull;q=0, */*\r\n\r\n"));
  const RawResponse plain = http.Read();
  EXPECT_EQ(plain.status, 200);
  EXPECT_EQ(plain.body, v2);
  EXPECT_EQ(plain.headers.count("vary"), 1u);
}

// server.decode_encoded_payloads: a daemon that decodes refuses a body coded against a drifted
// reference; one that trusts its writers stores it (the client's digests, unchecked).
TEST_F(EncodedPushDaemonTest, TrustedWritersPayloadsAreNotDecoded) {
  ASSERT_EQ(Send("PUT", "/v1/models/m/policy", R"({"mode":"lossy","max_abs_error":5e-3})").status,
            200);
  DriftingModel drift(23, 20000);
  const std::string v1 = drift.Next(), v2 = drift.Next();
  auto first = Plan(1, v1);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(PushEncoded(1, Encode(*first, v1)).status, 201);
  // The client holds the file it pushed instead of its reconstruction.
  held_.assign(v1.begin(), v1.end());
  auto second = Plan(2, v2);
  ASSERT_TRUE(second.ok());
  second->base->restored_sha256.clear();  // and skips its own check
  const std::string drifted = Encode(*second, v2);
  const RawResponse refused = PushEncoded(2, drifted);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("pull the base version"), std::string::npos) << refused.body;

  Start("[server]\ndecode_encoded_payloads = false\n");
  EXPECT_EQ(PushEncoded(2, drifted).status, 201);
}

}  // namespace
}  // namespace ckpt
