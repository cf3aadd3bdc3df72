// Pushes encoded at the edge (PushBodyFormat::kEncoded): a client follows the store's plan and
// sends chunk records; the store checks them and stores what a push it encoded would store.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "store_fixture.h"

namespace ckpt {
namespace {

using testing::Bytes;
using testing::CheckpointStoreTest;
using testing::DriftingModel;

constexpr std::string_view kLossyPolicy = R"({"mode":"lossy","max_abs_error":5e-3})";

class EncodedPushTest : public CheckpointStoreTest {
 protected:
  // What a client does: asks for the plan, encodes against the reference it holds (the
  // reconstruction of its previous push), and returns the encoded body; `reference_` becomes
  // this version's reconstruction.
  Result<std::string> Encode(std::string_view model, uint64_t version, const std::string& body,
                             CodingPlan* plan_out = nullptr) {
    CKPT_ASSIGN_OR_RETURN(const CheckpointView view, CheckpointView::Parse(Bytes(body)));
    CKPT_ASSIGN_OR_RETURN(CodingPlan plan,
                          store_->PlanPush(model, version, std::string(view.raw_header())));
    std::optional<CheckpointView> reference;
    if (!reference_.empty()) {
      CKPT_ASSIGN_OR_RETURN(reference, CheckpointView::Parse(reference_));
    }
    std::string encoded;
    std::vector<uint8_t> reconstruction;
    CKPT_RETURN_IF_ERROR(EncodeByPlan(
                             plan, view, reference ? &*reference : nullptr, 2,
                             [&](std::string_view piece) {
                               encoded.append(piece);
                               return Status::Ok();
                             },
                             CollectInto(&reconstruction))
                             .status());
    next_reference_ = std::move(reconstruction);
    if (plan_out) *plan_out = plan;
    return encoded;
  }

  Result<VersionInfo> PushEncoded(std::string_view model, uint64_t version,
                                  std::string_view encoded, bool decode = true,
                                  size_t piece = 777) {
    PushOptions options;
    options.body_format = PushBodyFormat::kEncoded;
    options.decode_encoded_payloads = decode;
    CKPT_ASSIGN_OR_RETURN(auto session, store_->BeginPush(model, version, encoded.size(), options));
    for (size_t off = 0; off < encoded.size(); off += piece) {
      CKPT_RETURN_IF_ERROR(session->Write(Bytes(encoded.substr(off, piece))));
    }
    CKPT_ASSIGN_OR_RETURN(VersionInfo info, session->Commit());
    reference_ = std::move(next_reference_);
    return info;
  }

  std::vector<uint8_t> reference_;  // the reconstruction of the client's last push
  std::vector<uint8_t> next_reference_;
};

// The same checkpoints pushed by a client that encodes and by one that does not: the same
// versions, restored bodies, digests and stored bytes, whether the store decodes the payloads
// or trusts them.
TEST_F(EncodedPushTest, StoresWhatAPushTheStoreEncodesStores) {
  int run = 0;
  for (const std::string_view policy : {std::string_view(R"({"mode":"lossless"})"), kLossyPolicy}) {
    SCOPED_TRACE(policy);
    for (bool decode : {true, false}) {
      SCOPED_TRACE(decode ? "decoded" : "trusted");
      reference_.clear();
      const std::string server_model = "server-" + std::to_string(++run);
      const std::string edge_model = "edge-" + std::to_string(run);
      SetCodecPolicy(server_model, policy);
      SetCodecPolicy(edge_model, policy);
      DriftingModel drift(11, 30000);
      for (uint64_t v = 1; v <= 5; ++v) {
        const std::string body = drift.Next();
        auto server = Push(server_model, v, body);
        ASSERT_TRUE(server.ok()) << server.status().ToString();
        auto encoded = Encode(edge_model, v, body);
        ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
        auto edge = PushEncoded(edge_model, v, *encoded, decode);
        ASSERT_TRUE(edge.ok()) << "version " << v << ": " << edge.status().ToString();
        EXPECT_EQ(edge->stored_bytes, server->stored_bytes) << v;
        EXPECT_EQ(edge->raw_bytes, server->raw_bytes) << v;
        EXPECT_EQ(edge->pushed_sha256, server->pushed_sha256) << v;
        EXPECT_EQ(edge->sha256, server->sha256) << v;
        // The wire carries about what is stored, not the checkpoint.
        EXPECT_LT(encoded->size(), edge->stored_bytes + 4096) << v;
        // The same figures per tensor as the store's own coding reports.
        auto edge_detail = store_->GetVersionDetail(edge_model, v);
        auto server_detail = store_->GetVersionDetail(server_model, v);
        ASSERT_TRUE(edge_detail.ok() && server_detail.ok());
        ASSERT_EQ(edge_detail->tensors.size(), server_detail->tensors.size());
        for (size_t i = 0; i < edge_detail->tensors.size(); ++i) {
          const TensorDetail& e = edge_detail->tensors[i];
          const TensorDetail& d = server_detail->tensors[i];
          EXPECT_EQ(e.kind, d.kind) << e.name;
          EXPECT_EQ(e.codec, d.codec) << e.name;
          EXPECT_EQ(e.quantizer, d.quantizer) << e.name;
          EXPECT_EQ(e.bound, d.bound) << e.name;
          EXPECT_EQ(e.exact_elements, d.exact_elements) << e.name;
          EXPECT_EQ(e.stored_bytes, d.stored_bytes) << e.name;
          EXPECT_DOUBLE_EQ(e.entropy_bits_per_element, d.entropy_bits_per_element) << e.name;
        }
        auto restored = Restore(edge_model, v);
        ASSERT_TRUE(restored.ok()) << restored.status().ToString();
        EXPECT_EQ(*restored, *Restore(server_model, v)) << v;
        EXPECT_EQ(*restored, std::string(reference_.begin(), reference_.end())) << v;
      }
    }
  }
}

// A plan that the model's state has moved past is refused, and so is a body whose reference
// drifted: nothing is stored either time.
TEST_F(EncodedPushTest, StaleOrDriftedReferencesAreRefused) {
  SetCodecPolicy("m", kLossyPolicy);
  DriftingModel drift(12, 20000);
  const std::string v1 = drift.Next(), v2 = drift.Next(), v3 = drift.Next();
  auto first = Encode("m", 1, v1);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(PushEncoded("m", 1, *first).ok());
  // Encoded for version 3 against version 1; version 2 commits first.
  auto stale = Encode("m", 3, v3);
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(Push("m", 2, v2).ok());
  auto refused = PushEncoded("m", 3, *stale);
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("ask for a new plan"), std::string::npos);

  // A client holding the checkpoint instead of its reconstruction (a lossy reference drifts).
  const std::string v2_file = v2;
  reference_.assign(v2_file.begin(), v2_file.end());
  CodingPlan plan;
  auto view = CheckpointView::Parse(Bytes(v3));
  ASSERT_TRUE(view.ok());
  auto planned = store_->PlanPush("m", 3, std::string(view->raw_header()));
  ASSERT_TRUE(planned.ok());
  ASSERT_TRUE(planned->base);
  planned->base->restored_sha256.clear();  // the client skips its own check
  auto held = CheckpointView::Parse(reference_);
  ASSERT_TRUE(held.ok());
  std::string drifted;
  ASSERT_TRUE(EncodeByPlan(*planned, *view, &*held, 1, [&](std::string_view p) {
                drifted.append(p);
                return Status::Ok();
              }).ok());
  auto wrong = PushEncoded("m", 3, drifted);
  ASSERT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("pull the base version"), std::string::npos)
      << wrong.status().ToString();
  auto versions = store_->ListVersions("m");
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->size(), 2u);
  // Trusted payloads are not decoded: the drift goes unseen, which is why decoding is the default.
}

// Bodies that do not follow the plan, or are damaged, are refused with a message naming what.
TEST_F(EncodedPushTest, BodiesThatDoNotFollowThePlanAreRefused) {
  SetCodecPolicy("m", kLossyPolicy);
  DriftingModel drift(13, 20000);
  const std::string v1 = drift.Next();
  auto good = Encode("m", 1, v1);
  ASSERT_TRUE(good.ok());
  struct Damage {
    std::string name;
    std::string body;
    std::string message;
  };
  std::vector<Damage> damages;
  // The first chunk frame starts after the preamble: magic+format (8), digest, reference,
  // header length (24), the header.
  const auto view = CheckpointView::Parse(Bytes(v1));
  ASSERT_TRUE(view.ok());
  const size_t frame = 32 + view->raw_header().size();
  const size_t record = frame + 1 + 41;
  std::string body = *good;
  body[frame + 1] = 1;  // tensor 1 where tensor 0 comes
  damages.push_back({"out of order", body, "where the plan has chunk 0 of tensor 0"});
  body = *good;
  body[record + 30] ^= 1;  // a payload byte
  damages.push_back({"payload", body, "payload checksum mismatch"});
  body = *good;
  body[record + 3] = 2;  // keyframe -> delta
  damages.push_back({"kind", body, "a delta where the plan has a keyframe"});
  body = *good;
  body[record + 1] = 9;  // codec id
  damages.push_back({"codec", body, "codec 9 is not the plan's"});
  body = *good;
  for (size_t i = 26; i < 34; ++i) body[frame + i] = '\xff';  // the entropy reported: a NaN
  damages.push_back({"figures", body, "coding figures"});
  body = *good;
  body[8] ^= 1;  // the plan digest
  damages.push_back({"plan", body, "model 'm' no longer codes by"});
  damages.push_back({"truncated", good->substr(0, good->size() - 10), "truncated"});
  {
    // Coded with a bound twice the plan's.
    auto plan = store_->PlanPush("m", 1, std::string(view->raw_header()));
    ASSERT_TRUE(plan.ok());
    CodingPlan looser = *plan;
    for (PlannedTensor& t : looser.tensors) t.lossy_options.bound.value *= 2;
    std::string loose;
    ASSERT_TRUE(EncodeByPlan(looser, *view, nullptr, 1, [&](std::string_view p) {
                  loose.append(p);
                  return Status::Ok();
                }).ok());
    // Under the digest of the plan handed out, so that the payloads' own check is what refuses.
    const std::string preamble =
        EncodePreamble({plan->Digest(), 0, std::string(view->raw_header())});
    damages.push_back({"looser bound", preamble + loose.substr(preamble.size()),
                       "bound is larger than the plan's"});
  }
  damages.push_back({"raw safetensors", v1, "does not start with CKPTENC"});
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    auto pushed = PushEncoded("m", 1, d.body);
    ASSERT_FALSE(pushed.ok());
    EXPECT_TRUE(pushed.status().code() == StatusCode::kInvalidArgument ||
                pushed.status().code() == StatusCode::kFailedPrecondition)
        << pushed.status().ToString();
    EXPECT_NE(pushed.status().message().find(d.message), std::string::npos)
        << pushed.status().ToString();
    EXPECT_EQ(store_->GetModel("m")->version_count, 0u);
  }
  ASSERT_TRUE(PushEncoded("m", 1, *good).ok());
}

}  // namespace
}  // namespace ckpt
