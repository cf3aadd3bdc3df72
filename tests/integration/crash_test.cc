// The crash loop: the real daemon is killed with SIGKILL at random moments while a client
// pushes (lossless and lossy models), deletes, applies retention and collects garbage; after
// each restart every acknowledged version must restore exactly as acknowledged, nothing
// unacknowledged may be visible, and (checked by scrub) no orphaned data may remain.
//
// "Acknowledged" is what the client got an answer for. An operation in flight when the daemon
// died may or may not have taken effect (its commit may precede the lost answer): a push in
// flight may appear, complete and correct, or not at all; a delete or retention pass in flight
// may or may not have removed what it would remove. Nothing else may change.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "daemon_process.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::DirectoryBytes;
using testing::DriftingModel;
using testing::Request;
using testing::Sha256Hex;
using testing::TempDir;

constexpr int kKillPoints = 50;
constexpr double kLossyBound = 1e-3;
constexpr uint64_t kKeepLast = 4;

// What the client knows of one model's versions.
struct ModelState {
  ModelState(std::string model, bool quantized, uint64_t seed)
      : name(std::move(model)), lossy(quantized), drift(seed, 60000) {}
  std::string name;
  bool lossy = false;
  DriftingModel drift;
  uint64_t next_version = 1;
  std::map<uint64_t, std::string> acked;          // version -> SHA-256 a restore must send
  std::map<uint64_t, std::string> pushed_bodies;  // lossy: the pushed bodies (bound check)
  std::map<uint64_t, std::string> in_flight;      // version -> pushed body, answer lost
  std::set<uint64_t> maybe_deleted;               // acked, a delete/retention in flight
};

class CrashLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Retention runs only when the client asks, so the test knows what may have deleted what.
    config_ = (dir_.path() / "crash.toml").string();
    // The latest version is rearranged right after each push, so that kills land inside that too.
    std::ofstream(config_) << "[storage]\nrearrange_delay_ms = 0\n"
                           << "[retention]\nafter_push = false\ninterval_seconds = 0\n";
    models_.emplace_back("plain", false, 71);
    models_.emplace_back("quant", true, 72);
  }

  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  void Start() {
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(),
                                              std::vector<std::string>{"--config", config_});
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  testing::RawResponse Call(std::string_view method, const std::string& target,
                            std::string_view body = {}) {
    return Request(daemon_->port(), method, target, body);
  }

  // One random operation; returns false once the daemon stopped answering.
  bool Step(std::mt19937_64& rng) {
    ModelState& m = models_[rng() % models_.size()];
    const unsigned action = rng() % 10;
    std::unique_lock lock(mu_);
    if (action < 6 || m.acked.size() < 2) {
      const uint64_t version = m.next_version++;
      std::string body = m.drift.Next();
      m.in_flight[version] = body;
      lock.unlock();
      auto r = Call("PUT", "/v1/models/" + m.name + "/versions/" + std::to_string(version), body);
      lock.lock();
      if (r.status == 0) return false;
      EXPECT_EQ(r.status, 201) << r.body;
      m.in_flight.erase(version);
      if (r.status == 201) {
        ++pushes_acked_;
        m.acked[version] = json::parse(r.body)["sha256"];
        if (m.lossy) m.pushed_bodies[version] = body;
      }
      return true;
    }
    if (action < 8) {
      auto it = m.acked.begin();
      std::advance(it, rng() % (m.acked.size() - 1));  // never the latest
      const uint64_t version = it->first;
      m.maybe_deleted.insert(version);
      lock.unlock();
      auto r = Call("DELETE", "/v1/models/" + m.name + "/versions/" + std::to_string(version));
      lock.lock();
      if (r.status == 0) return false;
      EXPECT_EQ(r.status, 204) << r.body;
      m.maybe_deleted.erase(version);
      m.acked.erase(version);
      return true;
    }
    // Retention: one model now, or every model (admin GC). Until answered, every version but
    // the newest kKeepLast may be gone.
    const bool all = action == 9;
    for (ModelState& each : models_) {
      if (!all && &each != &m) continue;
      size_t newest = 0;
      for (auto v = each.acked.rbegin(); v != each.acked.rend(); ++v) {
        if (++newest > kKeepLast) each.maybe_deleted.insert(v->first);
      }
    }
    lock.unlock();
    auto r = all ? Call("POST", "/v1/admin/gc")
                 : Call("POST", "/v1/models/" + m.name + "/retention:apply");
    lock.lock();
    if (r.status == 0) return false;
    EXPECT_EQ(r.status, 200) << r.body;
    const json answer = json::parse(r.body);
    for (ModelState& each : models_) {
      if (!all && &each != &m) continue;
      const json* report = &answer;
      if (all) {
        for (const auto& one : answer["models"]) {
          if (one["model"] == each.name) report = &one;
        }
      }
      for (const auto& v : (*report)["deleted"]) each.acked.erase(v.get<uint64_t>());
      each.maybe_deleted.clear();
    }
    return true;
  }

  // After a restart: the server's versions against what the client knows.
  void Verify(int round) {
    bool interrupted = false;
    for (const ModelState& m : models_) {
      interrupted |= !m.in_flight.empty() || !m.maybe_deleted.empty();
    }
    kills_mid_operation_ += interrupted;
    for (ModelState& m : models_) {
      SCOPED_TRACE("round " + std::to_string(round) + " model " + m.name);
      auto listing = Call("GET", "/v1/models/" + m.name + "/versions");
      std::set<uint64_t> present;
      if (listing.status == 200) {
        const json versions = json::parse(listing.body);
        for (const auto& v : versions["versions"]) present.insert(v["version"].get<uint64_t>());
      } else {
        ASSERT_EQ(listing.status, 404) << listing.body;  // never pushed yet
      }
      for (const auto& [version, sha] : m.acked) {
        if (!m.maybe_deleted.count(version)) {
          EXPECT_TRUE(present.count(version)) << "acknowledged version " << version << " lost";
        }
      }
      for (uint64_t version : present) {
        const bool acked = m.acked.count(version) > 0;
        const bool in_flight = m.in_flight.count(version) > 0;
        ASSERT_TRUE(acked || in_flight) << "unacknowledged version " << version << " visible";
        auto body = Call("GET", "/v1/models/" + m.name + "/versions/" + std::to_string(version));
        ASSERT_EQ(body.status, 200) << "version " << version << ": " << body.body;
        if (acked) {
          EXPECT_EQ(Sha256Hex(body.body), m.acked[version]) << "version " << version;
        } else if (!m.lossy) {
          EXPECT_EQ(Sha256Hex(body.body), Sha256Hex(m.in_flight[version])) << version;
        }
        const std::string& pushed = acked ? m.pushed_bodies[version] : m.in_flight[version];
        if (m.lossy && !pushed.empty()) {
          auto check = testing::CheckWithinBound(pushed, body.body, kLossyBound);
          EXPECT_EQ(check.error, "") << "version " << version;
        }
        if (in_flight) {  // it made it: acknowledged from now on
          ++committed_unanswered_;
          m.acked[version] = Sha256Hex(body.body);
          if (m.lossy) m.pushed_bodies[version] = m.in_flight[version];
        }
      }
      for (uint64_t version : m.maybe_deleted) {
        if (!present.count(version)) m.acked.erase(version);
      }
      m.maybe_deleted.clear();
      m.in_flight.clear();
    }
  }

  void ExpectScrubClean() {
    auto r = Call("POST", "/v1/admin/scrub");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["clean"], true) << r.body;
  }

  TempDir dir_;
  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::mutex mu_;  // guards models_ between the client thread and the verifier
  std::vector<ModelState> models_;
  int pushes_acked_ = 0;          // pushes answered 201 (guarded by mu_)
  int kills_mid_operation_ = 0;   // rounds whose kill interrupted an operation
  int committed_unanswered_ = 0;  // pushes committed whose answer the kill lost
};

TEST_F(CrashLoopTest, SigkillAtRandomMomentsLosesNothingAcknowledgedAndLeavesNothingBehind) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_EQ(
      Call("PUT", "/v1/models/plain/policy", R"({"mode":"lossless","keyframe_every":4})").status,
      200);
  ASSERT_EQ(Call("PUT", "/v1/models/quant/policy",
                 R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[],)"
                 R"("keyframe_every":6})")
                .status,
            200);
  const std::string keep = R"({"keep_last":)" + std::to_string(kKeepLast) + "}";
  ASSERT_EQ(Call("PUT", "/v1/models/plain/retention", keep).status, 200);
  ASSERT_EQ(Call("PUT", "/v1/models/quant/retention", keep).status, 200);

  // The kill window scales with how long one push takes here (sanitizer builds are many times
  // slower), so that every round has time for a few operations.
  std::mt19937_64 warm_up(0);
  const auto push_start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Step(warm_up));  // the first step of a model is a push
  const auto push_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - push_start)
                           .count();
  const int64_t window_ms = std::max<int64_t>(120, 8 * push_ms);
  std::mt19937_64 rng(70);
  for (int round = 0; round < kKillPoints; ++round) {
    std::atomic<bool> stop{false};
    std::mt19937_64 client_rng(rng());
    std::thread client([&] {
      while (!stop.load() && Step(client_rng)) {
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % window_ms));
    daemon_->Kill();
    stop.store(true);
    client.join();
    ASSERT_NO_FATAL_FAILURE(Start());
    ASSERT_NO_FATAL_FAILURE(Verify(round));
    if (round % 10 == 9) {
      ASSERT_NO_FATAL_FAILURE(ExpectScrubClean());
    }
  }
  // The kills must land inside operations, not only between them, and the workload must have
  // made progress between them, for the test to mean much.
  std::cout << "kill points " << kKillPoints << ", inside an operation " << kills_mid_operation_
            << ", pushes acknowledged " << pushes_acked_ << ", committed but unanswered "
            << committed_unanswered_ << "\n";
  EXPECT_GE(pushes_acked_, kKillPoints / 5);
  EXPECT_GE(kills_mid_operation_, kKillPoints / 2);
  EXPECT_EQ(daemon_->Stop(), 0);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(ExpectScrubClean());
}

// Kill points inside the rearrangement that follows a push (the latest version re-encoded as
// keyframes, the one before as deltas against them): the daemon is killed at a random moment
// of the window in which that runs, after every acknowledged push. Whether or not the switch
// happened, every acknowledged version restores exactly as acknowledged (lossy: within the
// bound), and scrub finds nothing damaged or orphaned.
TEST_F(CrashLoopTest, SigkillWhileTheLatestIsRearrangedLosesNothingAndLeavesNothingBehind) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_EQ(
      Call("PUT", "/v1/models/plain/policy", R"({"mode":"lossless","keyframe_every":4})").status,
      200);
  // A model with retention rules is coded on a plain lattice, which rearranges too.
  ASSERT_EQ(Call("PUT", "/v1/models/quant/policy",
                 R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})")
                .status,
            200);
  ASSERT_EQ(Call("PUT", "/v1/models/quant/retention", R"({"keep_last":1000})").status, 200);
  auto push = [&](ModelState& m) {
    const uint64_t version = m.next_version++;
    const std::string body = m.drift.Next();
    auto r = Call("PUT", "/v1/models/" + m.name + "/versions/" + std::to_string(version), body);
    ASSERT_EQ(r.status, 201) << r.body;
    m.acked[version] = json::parse(r.body)["sha256"];
    if (m.lossy) m.pushed_bodies[version] = body;
  };
  // Whether the latest version has been rearranged: a push stores deltas against the version
  // before (whose chain is far from its bound here), the rearrangement keyframes (a lossy model
  // may keep some tensors forward: those without a plain lattice).
  auto rearranged = [&](const ModelState& m) {
    auto r = Call("GET", "/v1/models/" + m.name + "/versions/latest?detail=1");
    if (r.status != 200) return false;
    const json detail = json::parse(r.body);
    for (const auto& t : detail["tensors"]) {
      if (t["raw_bytes"] != 0 && t["kind"] == "keyframe") return true;
    }
    return false;
  };
  // How long a rearrangement takes here: the window the kills are spread over.
  using Clock = std::chrono::steady_clock;
  auto window = std::chrono::microseconds(0);
  for (ModelState& m : models_) {
    ASSERT_NO_FATAL_FAILURE(push(m));
    ASSERT_NO_FATAL_FAILURE(push(m));
    const auto start = Clock::now();
    while (!rearranged(m) && Clock::now() - start < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(rearranged(m)) << m.name;
    window = std::max(window,
                      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start));
  }
  // The window measured once is only an estimate on a shared machine: while every kill so far
  // landed on the same side of the switch, the range the delays are drawn from moves towards the
  // other side, so that both sides are reached whatever the load.
  std::mt19937_64 rng(90);
  int before_switch = 0, after_switch = 0;
  double delay_bound_us = static_cast<double>(window.count()) / 2 + 1;
  constexpr int kRounds = 30;
  for (int round = 0; round < kRounds; ++round) {
    ModelState& m = models_[round % models_.size()];
    ASSERT_NO_FATAL_FAILURE(push(m));
    std::this_thread::sleep_for(
        std::chrono::microseconds(rng() % (static_cast<uint64_t>(delay_bound_us) + 1)));
    daemon_->Kill();
    ASSERT_NO_FATAL_FAILURE(Start());
    const bool switched = rearranged(m);
    (switched ? after_switch : before_switch) += 1;
    if (switched && before_switch == 0) delay_bound_us *= 0.75;
    if (!switched && after_switch == 0) delay_bound_us *= 1.3;
    ASSERT_NO_FATAL_FAILURE(Verify(round));
    if (round % 10 == 9) {
      ASSERT_NO_FATAL_FAILURE(ExpectScrubClean());
    }
  }
  std::cout << "rearrangement window " << window.count() << " us, delays up to "
            << static_cast<int64_t>(delay_bound_us) << " us; killed before its switch "
            << before_switch << ", after " << after_switch << "\n";
  EXPECT_GT(before_switch, 0);
  EXPECT_GT(after_switch, 0);
  EXPECT_EQ(daemon_->Stop(), 0);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(ExpectScrubClean());
}

TEST(CrashSpaceTest, SigkillMidPushGivesItsSpaceBackAtRestart) {
  TempDir dir;
  DaemonProcess daemon(CKPTD_BINARY, dir.path());
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::mt19937_64 rng(5);
  std::map<uint64_t, std::string> pushed;
  for (uint64_t v = 1; v <= 2; ++v) {
    pushed[v] =
        testing::Serialize({{"w", DType::kU8, {32u << 20}, testing::RandomBytes(rng, 32u << 20)}});
    auto r = Request(daemon.port(), "PUT", "/v1/models/m/versions/" + std::to_string(v), pushed[v]);
    ASSERT_EQ(r.status, 201) << r.body;
  }
  ASSERT_EQ(daemon.Stop(), 0);  // a clean stop flushes: the directory holds tables and blobs
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::filesystem::path data = dir.path() / "data";
  const uint64_t before = DirectoryBytes(data);

  // A push of 192 MiB, cut off by SIGKILL once 128 MiB of it reached the daemon's disk.
  constexpr uint64_t kBody = 192u << 20;
  const std::string body =
      testing::Serialize({{"w", DType::kU8, {kBody}, testing::RandomBytes(rng, kBody)}});
  testing::RawHttp http(daemon.port());
  ASSERT_TRUE(http.Send(testing::PutHeader("/v1/models/m/versions/3", body.size())));
  size_t sent = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  // All but the last MiB is sent, and then the daemon's writes are awaited: a slow build
  // (sanitizers) stores the body well after it arrives.
  while (DirectoryBytes(data) < before + (128u << 20) &&
         std::chrono::steady_clock::now() < deadline) {
    if (sent + (1u << 20) < body.size()) {
      ASSERT_TRUE(http.Send(std::string_view(body).substr(sent, 1u << 20)));
      sent += 1u << 20;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const uint64_t at_kill = DirectoryBytes(data);
  ASSERT_GE(at_kill, before + (128u << 20)) << "the push never reached the disk";
  daemon.Kill();

  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const uint64_t after = DirectoryBytes(data);
  std::cout << "data directory: " << before << " bytes before the push, " << at_kill
            << " at the kill, " << after << " after the restart\n";
  EXPECT_LE(after, before + before / 20) << "the interrupted push's data stayed on disk";
  auto listing = Request(daemon.port(), "GET", "/v1/models/m/versions");
  ASSERT_EQ(listing.status, 200);
  EXPECT_EQ(json::parse(listing.body)["versions"].size(), 2u) << listing.body;
  for (const auto& [version, bytes] : pushed) {
    auto r = Request(daemon.port(), "GET", "/v1/models/m/versions/" + std::to_string(version));
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(Sha256Hex(r.body), Sha256Hex(bytes)) << "version " << version;
  }
}

}  // namespace
}  // namespace ckpt
