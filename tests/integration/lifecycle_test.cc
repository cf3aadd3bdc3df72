// Integration tests of the checkpoint lifecycle over HTTP: metrics and tags on pushes, retention
// policies, previews, background and explicit garbage collection, offline `ckptd gc`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
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

// Bytes the files under `dir` occupy on disk (as du counts them).
uint64_t DiskUsage(const std::filesystem::path& dir) {
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (entry.is_regular_file() && ::stat(entry.path().c_str(), &st) == 0) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

// Runs a ckptd subcommand; returns its exit code and output.
std::pair<int, std::string> RunCkptd(const std::string& arguments) {
  FILE* pipe = popen((std::string(CKPTD_BINARY) + " " + arguments + " 2>&1").c_str(), "r");
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class LifecycleDaemonTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> args = {}) {
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(), std::move(args));
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  testing::RawResponse Call(std::string_view method, const std::string& target,
                            std::string_view body = {}) {
    return Request(daemon_->port(), method, target, body);
  }

  json CallJson(std::string_view method, const std::string& target, std::string_view body = {},
                int expected_status = 200) {
    auto r = Call(method, target, body);
    EXPECT_EQ(r.status, expected_status) << method << " " << target << ": " << r.body;
    return r.body.empty() ? json() : json::parse(r.body, nullptr, false);
  }

  std::set<uint64_t> Versions(const std::string& model) {
    std::set<uint64_t> out;
    const json listing = CallJson("GET", "/v1/models/" + model + "/versions");
    for (const auto& v : listing["versions"]) out.insert(v["version"].get<uint64_t>());
    return out;
  }

  // Runs `ckptd gc` on the data directory; returns its exit code and output.
  std::pair<int, std::string> OfflineGc() {
    return RunCkptd("gc --data-dir " + (dir_.path() / "data").string());
  }

  // Pushes versions first..last of `drift` as `model`; returns version -> SHA-256 of the body.
  std::map<uint64_t, std::string> PushVersions(const std::string& model, DriftingModel& drift,
                                               uint64_t first, uint64_t last) {
    std::map<uint64_t, std::string> sha;
    for (uint64_t v = first; v <= last; ++v) {
      const std::string body = drift.Next();
      CallJson("PUT", "/v1/models/" + model + "/versions/" + std::to_string(v), body, 201);
      sha[v] = Sha256Hex(body);
    }
    return sha;
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(LifecycleDaemonTest, MetricsTagsRetentionPreviewAndApply) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // Keep everything while pushing (retention also runs after each push); the real policy is
  // previewed and applied below.
  EXPECT_EQ(CallJson("PUT", "/v1/models/run/retention", "{}"), json::object());
  EXPECT_EQ(CallJson("GET", "/v1/models/run/retention"), json::object());

  DriftingModel drift(51, 20000);
  std::map<uint64_t, std::string> sha;
  const double loss[] = {5, 4, 1.5, 3, 2.5, 2, 1.75, 1.6};
  for (uint64_t v = 1; v <= 8; ++v) {
    std::string body = drift.Next();
    std::string target = "/v1/models/run/versions/" + std::to_string(v * 10) +
                         "?metric.loss=" + std::to_string(loss[v - 1]) + "&label.host=n%201";
    if (v == 2) target += "&tag=release";
    auto pushed = CallJson("PUT", target, body, 201);
    sha[v * 10] = Sha256Hex(body);
    EXPECT_EQ(pushed["metrics"]["loss"], loss[v - 1]);
    EXPECT_EQ(pushed["labels"]["host"], "n 1");
  }
  // Restore by tag; the tag shows on the version.
  auto by_tag = Call("GET", "/v1/models/run/versions/tag:release");
  ASSERT_EQ(by_tag.status, 200) << by_tag.body;
  EXPECT_EQ(Sha256Hex(by_tag.body), sha[20]);
  EXPECT_EQ(CallJson("GET", "/v1/models/run/versions/20?detail=1")["tags"], json({"release"}));
  // A tagged version is pinned.
  EXPECT_EQ(Call("DELETE", "/v1/models/run/versions/20").status, 409);
  CallJson("PUT", "/v1/models/run/versions/50/tags/candidate");
  EXPECT_EQ(Call("DELETE", "/v1/models/run/versions/40/tags/candidate").status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/models/run/versions/50/tags/candidate").status, 204);
  EXPECT_EQ(Call("GET", "/v1/models/run/versions/tag:candidate").status, 404);
  EXPECT_EQ(Call("PUT", "/v1/models/run/versions/50/tags/bad%20tag").status, 400);
  EXPECT_EQ(Call("PUT", "/v1/models/run/versions/90?metric.loss=abc", "x").status, 400);
  EXPECT_EQ(Call("PUT", "/v1/models/run/versions/90?colour=red", "x").status, 400);

  // Preview a policy without storing it: exactly what it would delete, with reasons.
  const std::string real = R"({"keep_last":2,"keep_best":{"count":1,"metric":"loss"}})";
  auto preview = CallJson("POST", "/v1/models/run/retention:preview", real);
  EXPECT_EQ(preview["deleted"], json({10, 40, 50, 60}));
  EXPECT_EQ(preview["dry_run"], true);
  EXPECT_EQ(Versions("run").size(), 8u);
  bool saw_best = false;
  for (const auto& k : preview["kept"]) {
    if (k["version"] == 30) saw_best = k["kept_by"] == json({"keep_best"});
  }
  EXPECT_TRUE(saw_best) << preview.dump();
  const std::string typo = CallJson("POST", "/v1/models/run/retention:preview",
                                    R"({"keep_lats":2})", 400)["error"]["message"];
  EXPECT_NE(typo.find("'keep_lats'"), std::string::npos) << typo;

  EXPECT_EQ(CallJson("PUT", "/v1/models/run/retention", real)["keep_last"], 2);
  auto applied = CallJson("POST", "/v1/models/run/retention:apply");
  EXPECT_EQ(applied["deleted"], json({10, 40, 50, 60}));
  EXPECT_EQ(Versions("run"), (std::set<uint64_t>{20, 30, 70, 80}));
  for (uint64_t v : {20, 30, 70, 80}) {
    auto r = Call("GET", "/v1/models/run/versions/" + std::to_string(v));
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(Sha256Hex(r.body), sha[v]) << v;
  }
  EXPECT_EQ(Call("PATCH", "/v1/models/run/retention").status, 405);
}

TEST_F(LifecycleDaemonTest, RetentionRunsAfterEachPushAndLatestIsNeverDeleted) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  CallJson("PUT", "/v1/models/job/retention", R"({"keep_last":3})");
  DriftingModel drift(52, 5000);
  for (uint64_t v = 1; v <= 10; ++v) {
    CallJson("PUT", "/v1/models/job/versions/" + std::to_string(v), drift.Next(), 201);
  }
  // The pass after the last push runs in the background: wait (bounded) until it has run.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Versions("job").size() > 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Versions("job"), (std::set<uint64_t>{8, 9, 10}));
  EXPECT_EQ(CallJson("GET", "/v1/models/job")["latest_version"], 10);
}

// What admin/gc reports is what left the disk in that call: the versions a background pass
// deleted (its data removed, the space still in blob files) are reclaimed by the call's
// compaction, and counted as such, but not what the rearrangements after the pushes gave back
// themselves. Deleting the latest version leaves the model with no more stored than raw bytes.
TEST_F(LifecycleDaemonTest, GcReportsTheSpaceItReclaimsAfterABackgroundPass) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  CallJson("PUT", "/v1/models/job/retention", R"({"keep_last":2})");
  DriftingModel drift(57, 200000);
  PushVersions("job", drift, 1, 8);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Versions("job").size() > 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(Versions("job"), (std::set<uint64_t>{7, 8}));
  const uint64_t before = DirectoryBytes(daemon_->data_dir());
  const json gc = CallJson("POST", "/v1/admin/gc");
  const uint64_t after = DirectoryBytes(daemon_->data_dir());
  EXPECT_EQ(gc["deleted_versions"], 0) << gc.dump();
  EXPECT_EQ(gc["bytes_freed"], 0) << gc.dump();
  EXPECT_GT(gc["bytes_reclaimed"].get<uint64_t>(), 4u * 200000) << gc.dump();
  ASSERT_GT(before, after);
  EXPECT_LT(gc["bytes_reclaimed"].get<uint64_t>(), (before - after) * 11 / 10 + (64u << 10))
      << "the data directory shrank by " << before - after << ": " << gc.dump();
  EXPECT_EQ(gc["models"][0]["gc"]["bytes_reclaimed"], gc["bytes_reclaimed"]) << gc.dump();
  ASSERT_EQ(Call("DELETE", "/v1/models/job/versions/8").status, 204);
  const json model = CallJson("GET", "/v1/models/job");
  EXPECT_LE(model["stored_bytes"].get<uint64_t>(), model["raw_bytes"].get<uint64_t>())
      << model.dump();
}

// Tensor rules through the daemon: after each push the background pass drops the optimizer
// state of all but the newest two versions; those versions restore their weights as a body of
// their own, say so in the listing and the detail, and the newest restore whole.
TEST_F(LifecycleDaemonTest, TensorRulesDropOptimizerStateFromOlderVersions) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  CallJson("PUT", "/v1/models/full/retention",
           R"({"tensor_rules":[{"tensors":["optim.*"],"keep_last":2}]})");
  std::map<uint64_t, std::string> weights;
  for (uint64_t v = 1; v <= 5; ++v) {
    std::vector<float> w(1024), m(1024);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = 0.01f * static_cast<float>(i % 97) + 0.001f * static_cast<float>(v);
      m[i] = 1e-3f * static_cast<float>((i * v) % 13);
    }
    weights[v] = testing::FloatBytes(w);
    const std::string body =
        testing::Serialize({{"model.w", DType::kF32, {32, 32}, weights[v]},
                            {"optim.w.exp_avg", DType::kF32, {32, 32}, testing::FloatBytes(m)}});
    CallJson("PUT", "/v1/models/full/versions/" + std::to_string(v), body, 201);
  }
  // The pass after the last push runs in the background: wait (bounded) until version 3 lost
  // its moments.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (CallJson("GET", "/v1/models/full/versions/3?detail=1")["dropped_tensors"] != 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (uint64_t v = 1; v <= 5; ++v) {
    const json detail =
        CallJson("GET", "/v1/models/full/versions/" + std::to_string(v) + "?detail=1");
    const bool dropped = v <= 3;
    EXPECT_EQ(detail["dropped_tensors"], dropped ? 1 : 0) << v;
    EXPECT_EQ(detail["tensors"][1]["dropped"], dropped) << v;
    auto r = Call("GET", "/v1/models/full/versions/" + std::to_string(v));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(Sha256Hex(r.body), detail["sha256"]) << v;
    EXPECT_EQ(r.body.size(), detail["raw_bytes"]) << v;
    EXPECT_NE(r.body.find(weights[v]), std::string::npos) << v << ": the weights, unchanged";
    EXPECT_EQ(r.body.find("optim.w.exp_avg") == std::string::npos, dropped) << v;
  }
  auto preview = CallJson("POST", "/v1/models/full/retention:preview");
  EXPECT_EQ(preview["tensors_dropped"], json::array()) << "nothing left to drop";
  // The Hugging Face view of a version lists what it restores.
  const json index = CallJson("GET", "/v1/models/full/versions/1/hf/model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"].size(), 1u) << index.dump();
  EXPECT_TRUE(index["weight_map"].contains("model.w"));
}

TEST_F(LifecycleDaemonTest, PeriodicPassAppliesPoliciesSetAfterThePushes) {
  const std::string config = (dir_.path() / "periodic.toml").string();
  std::ofstream(config) << "[retention]\ninterval_seconds = 1\nafter_push = false\n";
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--config", config}));
  DriftingModel drift(56, 5000);
  PushVersions("idle", drift, 1, 6);
  CallJson("PUT", "/v1/models/idle/retention", R"({"keep_last":2})");
  // No push follows: only the periodic pass can apply it. Wait (bounded) for it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Versions("idle").size() > 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Versions("idle"), (std::set<uint64_t>{5, 6}));
}

TEST_F(LifecycleDaemonTest, AdminAndOfflineGcFreeTheDiskSpaceOfDeletedVersions) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel drift(53, 100000);
  std::map<uint64_t, std::string> sha = PushVersions("big", drift, 1, 30);
  daemon_->Stop();
  const uint64_t before = DiskUsage(dir_.path() / "data");

  // Offline: nothing to do without a policy; refuses to run beside a live daemon.
  auto [code, output] = OfflineGc();
  EXPECT_EQ(code, 0) << output;
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  auto [busy_code, busy_output] = OfflineGc();
  EXPECT_NE(busy_code, 0);
  EXPECT_NE(busy_output.find("is ckptd running"), std::string::npos) << busy_output;

  CallJson("PUT", "/v1/models/big/retention", R"({"keep_every":10})");
  auto gc = CallJson("POST", "/v1/admin/gc");
  EXPECT_EQ(gc["deleted_versions"], 27);
  EXPECT_GT(gc["bytes_freed"].get<uint64_t>(), 0u);
  EXPECT_EQ(Versions("big"), (std::set<uint64_t>{10, 20, 30}));
  for (uint64_t v : {10, 20, 30}) {
    auto r = Call("GET", "/v1/models/big/versions/" + std::to_string(v));
    EXPECT_EQ(Sha256Hex(r.body), sha[v]) << v;
  }
  daemon_->Stop();
  const uint64_t after = DiskUsage(dir_.path() / "data");
  // 3 of 30 versions kept: the data directory shrinks to well under a third.
  EXPECT_LT(after, before / 3) << "before " << before << " after " << after;

  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  for (uint64_t v : {10, 20, 30}) {
    auto r = Call("GET", "/v1/models/big/versions/" + std::to_string(v));
    EXPECT_EQ(Sha256Hex(r.body), sha[v]) << v;
  }
}

TEST_F(LifecycleDaemonTest, OnlineBackupWhilePushingRestoresEveryVersionIdentically) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel drift(54, 50000);
  std::map<uint64_t, std::string> sha = PushVersions("run", drift, 1, 8);
  // Pushes continue while the backup is taken.
  std::atomic<uint64_t> pushed_during{0};
  std::mutex sha_mu;
  std::thread pusher([&] {
    DriftingModel more(55, 50000);
    for (uint64_t v = 100; v < 112; ++v) {
      std::string body = more.Next();
      auto r = Call("PUT", "/v1/models/other/versions/" + std::to_string(v), body);
      if (r.status != 201) break;
      std::lock_guard lock(sha_mu);
      sha[v] = Sha256Hex(body);
      ++pushed_during;
    }
  });
  const std::string backups = (dir_.path() / "backups").string();
  auto backup = CallJson("POST", "/v1/admin/backup", R"({"to":")" + backups + R"("})");
  pusher.join();
  EXPECT_GE(backup["backup_id"].get<int>(), 1);
  EXPECT_GT(backup["size_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(Call("POST", "/v1/admin/backup", R"({"to":"relative/dir"})").status, 400);
  EXPECT_EQ(Call("POST", "/v1/admin/backup", "{}").status, 400);
  auto scrub = CallJson("POST", "/v1/admin/scrub");
  EXPECT_EQ(scrub["clean"], true) << scrub.dump();

  TempDir restored;
  auto [code, output] = RunCkptd("restore-backup --from " + backups + " --data-dir " +
                                 (restored.path() / "data").string());
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(RunCkptd("restore-backup --from " + backups + " --data-dir " +
                     (restored.path() / "data").string())
                .first,
            0);  // never over existing data
  DaemonProcess copy(CKPTD_BINARY, restored.path());
  ASSERT_TRUE(copy.Start()) << copy.log();
  // Every version pushed before the backup is there, identical; of those pushed during it, a
  // prefix is (the backup is one consistent point in time).
  for (const std::string model : {"run", "other"}) {
    auto listing = Request(copy.port(), "GET", "/v1/models/" + model + "/versions");
    if (model == "other" && listing.status == 404) continue;  // backed up before its 1st push
    ASSERT_EQ(listing.status, 200) << listing.body;
    const json versions = json::parse(listing.body);
    std::set<uint64_t> present;
    for (const auto& v : versions["versions"]) present.insert(v["version"].get<uint64_t>());
    if (model == "run") {
      EXPECT_EQ(present.size(), 8u);
    }
    uint64_t expected_next = 100;
    for (uint64_t v : present) {
      auto body =
          Request(copy.port(), "GET", "/v1/models/" + model + "/versions/" + std::to_string(v));
      EXPECT_EQ(Sha256Hex(body.body), sha[v]) << model << " " << v;
      if (model == "other") {
        EXPECT_EQ(v, expected_next++);
      }
    }
  }
  EXPECT_EQ(copy.Stop(), 0);
  auto [scrub_code, scrub_output] =
      RunCkptd("scrub --data-dir " + (restored.path() / "data").string());
  EXPECT_EQ(scrub_code, 0) << scrub_output;
}

// The offline tools work on an existing store only: a mistyped or missing --data-dir, or a
// directory holding something else, is an error naming it, and nothing is created there (a
// scheduled scrub with a typo must not report "clean" forever).
TEST(OfflineToolsTest, RefuseADirectoryWithoutAStore) {
  TempDir dir;
  const std::string missing = (dir.path() / "typo").string();
  for (const std::string& command :
       std::vector<std::string>{"scrub", "gc", "backup --to " + (dir.path() / "b").string()}) {
    auto [code, output] = RunCkptd(command + " --data-dir " + missing);
    EXPECT_EQ(code, 2) << command << ": " << output;
    EXPECT_NE(output.find("no ckptd store in '" + missing + "'"), std::string::npos) << output;
    EXPECT_FALSE(std::filesystem::exists(missing)) << command;
  }
  std::filesystem::create_directories(dir.path() / "empty");
  auto [code, output] = RunCkptd("scrub --data-dir " + (dir.path() / "empty").string());
  EXPECT_EQ(code, 2) << output;
  EXPECT_NE(output.find("holds no database"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() / "empty"));
  auto [from_code, from_output] =
      RunCkptd("restore-backup --from " + missing + " --data-dir " + (dir.path() / "new").string());
  EXPECT_EQ(from_code, 2) << from_output;
  EXPECT_NE(from_output.find("does not exist"), std::string::npos) << from_output;
  // Each command's help shows where the store is read from.
  for (const std::string command : {"scrub", "gc", "backup", "restore-backup"}) {
    auto [help_code, help] = RunCkptd(command + " --help");
    EXPECT_EQ(help_code, 0);
    EXPECT_NE(help.find("--data-dir"), std::string::npos) << command << ": " << help;
  }
}

// A backup into a directory whose parents do not exist creates them, online and offline; a
// path that cannot be made is a 400 naming it, never a 500.
TEST_F(LifecycleDaemonTest, BackupCreatesTheParentsOfItsDirectory) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel drift(56, 20000);
  PushVersions("run", drift, 1, 2);
  const std::string nested = (dir_.path() / "backups" / "ckptd" / "online").string();
  auto online = CallJson("POST", "/v1/admin/backup", R"({"to":")" + nested + R"("})");
  EXPECT_EQ(online["backup_id"], 1) << online.dump();
  std::ofstream(dir_.path() / "a-file") << "x";
  const std::string blocked = (dir_.path() / "a-file" / "backup").string();
  auto refused = Call("POST", "/v1/admin/backup", R"({"to":")" + blocked + R"("})");
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("cannot create the backup directory"), std::string::npos)
      << refused.body;
  EXPECT_EQ(daemon_->Stop(), 0);
  const std::string offline_dir = (dir_.path() / "deep" / "er" / "offline").string();
  auto [code, output] =
      RunCkptd("backup --to " + offline_dir + " --data-dir " + (dir_.path() / "data").string());
  EXPECT_EQ(code, 0) << output;
  EXPECT_TRUE(std::filesystem::is_directory(offline_dir));
}

}  // namespace
}  // namespace ckpt
