// Sharded versions through the real daemon, killed with SIGKILL while the shards of a version
// arrive (four at once, as four ranks send them): after each restart no version is ever
// visible in part, the shards stored before the kill are kept for the upload to continue,
// sending every shard again commits the version exactly, and nothing is left behind (scrub
// clean, the spool empty once every version is committed). Also: an abandoned upload expires.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "ckpt/base/tensor_slices.h"
#include "daemon_process.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::Request;
using testing::TempDir;

constexpr uint32_t kShards = 4;
constexpr uint64_t kRows = 1024, kColumns = 512;  // 2 MiB of F32 per version

// Version `version`'s global tensor (values drift a little from version to version) and rank
// `shard`'s rows of it as a shard body.
std::vector<float> GlobalValues(uint64_t version) {
  std::vector<float> v(kRows * kColumns);
  std::mt19937_64 rng(17);
  std::normal_distribution<float> base(0, 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = base(rng) + 1e-4f * static_cast<float>(version);
  return v;
}

std::string ShardBody(const std::vector<float>& global, uint32_t shard) {
  auto [offset, rows] = SplitExtent(kRows, shard, kShards);
  std::vector<float> part(global.begin() + offset * kColumns,
                          global.begin() + (offset + rows) * kColumns);
  std::map<std::string, SliceDeclaration> slices = {{"w", {{kRows, kColumns}, {offset, 0}}}};
  return testing::Serialize({{"w", DType::kF32, {rows, kColumns}, testing::FloatBytes(part)}},
                            {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(slices)}});
}

std::string ShardTarget(uint64_t version, uint32_t shard) {
  return "/v1/models/tp/versions/" + std::to_string(version) + "/shards/" + std::to_string(shard) +
         "?of=" + std::to_string(kShards);
}

class ShardCrashTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  void Start(const std::string& config_text = "") {
    std::vector<std::string> args;
    if (!config_text.empty()) {
      const std::string config = (dir_.path() / "shards.toml").string();
      std::ofstream(config) << config_text;
      args = {"--config", config};
    }
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(), args);
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  // Sends every shard of `version` at once, one connection each; returns their statuses
  // (0: no answer).
  std::vector<int> SendShards(uint64_t version, const std::vector<std::string>& bodies) {
    std::vector<int> statuses(kShards, 0);
    std::vector<std::thread> threads;
    for (uint32_t shard = 0; shard < kShards; ++shard) {
      threads.emplace_back([&, shard] {
        auto r = Request(daemon_->port(), "PUT", ShardTarget(version, shard), bodies[shard]);
        statuses[shard] = r.status;
        if (r.status >= 300) std::cerr << "shard " << shard << ": " << r.status << " " << r.body;
      });
    }
    for (auto& t : threads) t.join();
    return statuses;
  }

  // The latest version restores to exactly `global` of `version`, or is `previous`.
  void ExpectWholeOrPrevious(uint64_t version, uint64_t previous, bool* committed) {
    auto r = Request(daemon_->port(), "GET", "/v1/models/tp/versions/latest");
    if (previous == 0 && r.status == 404) {
      *committed = false;
      return;
    }
    ASSERT_EQ(r.status, 200) << r.body;
    const uint64_t latest = std::stoull(r.headers.at("x-ckpt-version"));
    ASSERT_TRUE(latest == version || latest == previous) << latest;
    *committed = latest == version;
    ExpectRestoresTo(r.body, GlobalValues(latest));
  }

  static void ExpectRestoresTo(const std::string& body, const std::vector<float>& values) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(body[i]);
    auto header = ParseSafetensorsHeader(std::string_view(body).substr(8, n), body.size());
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    ASSERT_EQ(header->tensors.size(), 1u);
    ASSERT_EQ(header->tensors[0].shape, (std::vector<uint64_t>{kRows, kColumns}));
    EXPECT_TRUE(body.substr(8 + n) == testing::FloatBytes(values));
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ShardCrashTest, SigkillWhileShardsArriveNeverShowsAPartialVersionAndTheUploadGoesOn) {
  ASSERT_NO_FATAL_FAILURE(Start("[retention]\nafter_push = false\ninterval_seconds = 0\n"));
  // How long four shards take here: the window the kills are spread over.
  using Clock = std::chrono::steady_clock;
  std::vector<std::string> bodies;
  for (uint32_t s = 0; s < kShards; ++s) bodies.push_back(ShardBody(GlobalValues(1), s));
  const auto start = Clock::now();
  for (int status : SendShards(1, bodies)) ASSERT_TRUE(status == 202 || status == 201) << status;
  const auto window = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  uint64_t previous = 1;
  int committed_before_kill = 0, resumed = 0;
  std::mt19937_64 rng(4);
  constexpr int kRounds = 20;
  for (uint64_t version = 2; version < 2 + kRounds; ++version) {
    bodies.clear();
    for (uint32_t s = 0; s < kShards; ++s) bodies.push_back(ShardBody(GlobalValues(version), s));
    std::thread sender([&] { SendShards(version, bodies); });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (window.count() + 1)));
    daemon_->Kill();
    sender.join();
    ASSERT_NO_FATAL_FAILURE(Start("[retention]\nafter_push = false\ninterval_seconds = 0\n"));
    bool committed = false;
    ASSERT_NO_FATAL_FAILURE(ExpectWholeOrPrevious(version, previous, &committed));
    if (committed) {
      ++committed_before_kill;
    } else {
      // The shards stored before the kill are still there; the rest complete the version.
      auto upload = Request(daemon_->port(), "GET",
                            "/v1/models/tp/versions/" + std::to_string(version) + "/shards");
      if (upload.status == 200) {
        // Only whole shards count: their bytes add up to the bodies of those sent.
        const json state = json::parse(upload.body);
        uint64_t expected_bytes = 0;
        for (const auto& shard : state["received"]) {
          expected_bytes += bodies.at(shard.get<uint32_t>()).size();
        }
        EXPECT_EQ(state["received_bytes"].get<uint64_t>(), expected_bytes) << upload.body;
        ++resumed;
      } else {
        EXPECT_EQ(upload.status, 404) << upload.body;
      }
    }
    // Every rank sends its shard again (after a failure, ranks retry): the version commits.
    for (int status : SendShards(version, bodies)) {
      EXPECT_TRUE(status == 200 || status == 201 || status == 202) << status;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectWholeOrPrevious(version, previous, &committed));
    ASSERT_TRUE(committed) << "version " << version;
    previous = version;
    if (version % 5 == 0) {
      auto scrub = Request(daemon_->port(), "POST", "/v1/admin/scrub");
      ASSERT_EQ(scrub.status, 200) << scrub.body;
      EXPECT_EQ(json::parse(scrub.body)["clean"], true) << scrub.body;
    }
  }
  std::cout << "window " << window.count() << " us; " << committed_before_kill
            << " versions committed before their kill, " << resumed
            << " uploads resumed after it\n";
  EXPECT_GT(resumed, 0);
  EXPECT_EQ(daemon_->Stop(), 0);
  // Nothing left in the spool: every version is committed.
  size_t spooled_files = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir_.path() / "data" / "uploads")) {
    spooled_files += e.is_regular_file();
  }
  EXPECT_EQ(spooled_files, 0u);
}

TEST_F(ShardCrashTest, AnAbandonedUploadExpiresWithItsData) {
  ASSERT_NO_FATAL_FAILURE(Start("[storage]\nupload_expiry_seconds = 1\n"));
  const std::string body = ShardBody(GlobalValues(1), 0);
  ASSERT_EQ(Request(daemon_->port(), "PUT", ShardTarget(1, 0), body).status, 202);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int status = 200;
  while (status == 200 && std::chrono::steady_clock::now() < deadline) {
    status = Request(daemon_->port(), "GET", "/v1/models/tp/versions/1/shards").status;
    if (status == 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 404);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path() / "data" / "uploads"));
  EXPECT_NE(daemon_->log().find("removed the uncommitted upload of model 'tp' version 1"),
            std::string::npos)
      << daemon_->log();
}

}  // namespace
}  // namespace ckpt
