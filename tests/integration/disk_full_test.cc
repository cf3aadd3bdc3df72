// A data directory on a small real file system (a tmpfs the test mounts in a mount namespace of
// its own, so nothing outlives the test process) filled by pushes through the real daemon:
// pushes are refused with 507 before the volume is full (and once another file takes it to the
// reserve), every acknowledged version restores
// identical, DELETE and GC free space through the API, and pushes are taken again without a
// restart, and after one. Skipped, with the reason, where the test may not mount (no
// CAP_SYS_ADMIN).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "daemon_process.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::Request;
using testing::Sha256Hex;
using testing::TempDir;

constexpr uint64_t kVolumeBytes = 384ull << 20;
// Above the memtables a push fills before its commit flushes them (store_schema.cc) and the
// engine's open log file.
constexpr uint64_t kReserveBytes = 128ull << 20;
constexpr uint64_t kCheckpointBytes = 12ull << 20;  // incompressible: stored whole

uint64_t FreeBytes(const std::filesystem::path& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A private mount namespace: the tmpfs disappears with this process, however it ends.
    if (unshare(CLONE_NEWNS) != 0) {
      GTEST_SKIP() << "cannot create a mount namespace (" << std::strerror(errno)
                   << "): needs CAP_SYS_ADMIN";
    }
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0)
        << std::strerror(errno);
    data_ = dir_.path() / "data";
    std::filesystem::create_directories(data_);
    const std::string size = "size=" + std::to_string(kVolumeBytes);
    if (mount("tmpfs", data_.c_str(), "tmpfs", 0, size.c_str()) != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << ")";
    }
    config_ = (dir_.path() / "small.toml").string();
    std::ofstream(config_) << "[storage]\nmin_free_bytes = " << kReserveBytes
                           << "\nrearrange_latest = false\n"
                           << "[retention]\nafter_push = false\ninterval_seconds = 0\n";
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(),
                                              std::vector<std::string>{"--config", config_});
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
    daemon_.reset();
    if (!data_.empty()) umount2(data_.c_str(), MNT_DETACH);
  }

  testing::RawResponse Call(std::string_view method, const std::string& target,
                            std::string_view body = {}) {
    return Request(daemon_->port(), method, target, body);
  }

  std::string Checkpoint() {
    return testing::Serialize(
        {{"w", DType::kU8, {kCheckpointBytes}, testing::RandomBytes(rng_, kCheckpointBytes)}});
  }

  // Pushes new versions until one is refused; returns the refusal.
  testing::RawResponse FillUp() {
    for (int i = 0; i < 100; ++i) {
      const std::string body = Checkpoint();
      const uint64_t version = next_version_++;
      auto r = Call("PUT", "/v1/models/m/versions/" + std::to_string(version), body);
      if (r.status != 201) return r;
      acked_[version] = Sha256Hex(body);
    }
    ADD_FAILURE() << "the volume never filled";
    return {};
  }

  void ExpectAckedIntact() {
    auto listing = Call("GET", "/v1/models/m/versions");
    ASSERT_EQ(listing.status, 200) << listing.body;
    EXPECT_EQ(json::parse(listing.body)["versions"].size(), acked_.size()) << listing.body;
    for (const auto& [version, sha] : acked_) {
      auto r = Call("GET", "/v1/models/m/versions/" + std::to_string(version));
      ASSERT_EQ(r.status, 200) << "version " << version << ": " << r.body;
      EXPECT_EQ(Sha256Hex(r.body), sha) << "version " << version;
    }
  }

  // Pushes `body` as `version`, which must be taken.
  void PushAcked(uint64_t version, const std::string& body) {
    auto r = Call("PUT", "/v1/models/m/versions/" + std::to_string(version), body);
    ASSERT_EQ(r.status, 201) << r.body;
    acked_[version] = Sha256Hex(body);
  }

  // Polls GET /v1/status until pushes are accepted (the log's space returns as it flushes).
  void WaitPushesAccepted() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Status()["pushes_accepted"] != true && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(Status()["pushes_accepted"], true) << Status();
  }

  json Status() {
    auto r = Call("GET", "/v1/status");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  TempDir dir_;
  std::filesystem::path data_;
  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::mt19937_64 rng_{11};
  std::map<uint64_t, std::string> acked_;
  uint64_t next_version_ = 1;
};

TEST_F(DiskFullTest, PushesAreRefusedBeforeTheVolumeFillsAndSpaceIsFreedThroughTheApi) {
  const testing::RawResponse refused = FillUp();
  ASSERT_EQ(refused.status, 507) << refused.body;
  const json error = json::parse(refused.body)["error"];
  EXPECT_EQ(error["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(error["reason"], "NO_SPACE");
  EXPECT_NE(error["message"].get<std::string>().find("storage.min_free_bytes"), std::string::npos);
  EXPECT_EQ(error["message"].get<std::string>().find(data_.string()), std::string::npos);
  EXPECT_GE(acked_.size(), 5u);
  // Refused before the volume was full: the reserve is still (nearly all) there.
  EXPECT_GT(FreeBytes(data_), kReserveBytes / 2);

  // The refused push would have cut into the reserve; smaller ones still fit. Another file on
  // the volume takes it the rest of the way to the reserve (the pushes' records reach the
  // volume at their commits, so a push of known length never crosses it).
  {
    const uint64_t free = FreeBytes(data_);
    ASSERT_GT(free, kReserveBytes - (1 << 20));
    std::ofstream(data_ / "filler", std::ios::binary)
        << std::string(free - kReserveBytes + (1 << 20), '\0');
  }

  // Alive, reads served, and the reason stated.
  auto health = Call("GET", "/healthz?detail=1");
  EXPECT_EQ(health.status, 200);
  const json status = Status();
  EXPECT_EQ(status["pushes_accepted"], false) << status;
  EXPECT_EQ(status["deletes_accepted"], true) << status;
  EXPECT_EQ(status["reserved_bytes"], kReserveBytes);
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
  auto metrics = Call("GET", "/metrics");
  EXPECT_NE(metrics.body.find("ckptd_storage_reserved_bytes " + std::to_string(kReserveBytes)),
            std::string::npos);
  auto page = Call("GET", "/");
  EXPECT_NE(page.body.find("storage-warning"), std::string::npos);

  // A push of unknown length (chunked) is cut off as well.
  {
    testing::RawHttp http(daemon_->port());
    const std::string body = Checkpoint();
    ASSERT_TRUE(http.Send("PUT /v1/models/m/versions/" + std::to_string(next_version_++) +
                          " HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"));
    http.Send(testing::Chunked(body, 1 << 20));
    EXPECT_EQ(http.Read().status, 507);
  }

  // Free space through the API: delete all but the newest two versions, then collect. (Blob
  // files shared with kept versions stay while the volume is at the reserve: deleting most
  // versions frees whole files whatever their boundaries.)
  size_t to_delete = acked_.size() - 2;
  for (auto it = acked_.begin(); to_delete > 0; --to_delete) {
    auto r = Call("DELETE", "/v1/models/m/versions/" + std::to_string(it->first));
    ASSERT_EQ(r.status, 204) << r.body;
    it = acked_.erase(it);
  }
  auto gc = Call("POST", "/v1/admin/gc");
  ASSERT_EQ(gc.status, 200) << gc.body;
  ASSERT_NO_FATAL_FAILURE(WaitPushesAccepted());

  // Pushes are taken again, without a restart; and after one.
  ASSERT_NO_FATAL_FAILURE(PushAcked(next_version_++, Checkpoint()));
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());

  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
  const testing::RawResponse refused_again = FillUp();
  EXPECT_EQ(refused_again.status, 507) << refused_again.body;
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
}

// Another process fills the volume to the last byte: the daemon keeps serving reads, refuses
// writes with 507, and takes them again once that space is freed, without a restart.
TEST_F(DiskFullTest, AVolumeFilledByAnotherProcessSuspendsWritesUntilSpaceIsFreed) {
  for (int i = 0; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(PushAcked(next_version_++, Checkpoint()));
  const std::filesystem::path filler = data_ / "filler";
  {
    std::ofstream out(filler, std::ios::binary);
    const std::string block(1 << 20, '\0');
    while (out.write(block.data(), block.size()) && FreeBytes(data_) > 0) {
    }
  }
  ASSERT_LT(FreeBytes(data_), 1u << 20);
  const std::string body = Checkpoint();
  const uint64_t version = next_version_++;
  auto refused = Call("PUT", "/v1/models/m/versions/" + std::to_string(version), body);
  EXPECT_EQ(refused.status, 507) << refused.body;
  // A deletion may still fit in the space left, or be refused: never a 500.
  auto deleted = Call("DELETE", "/v1/models/m/versions/" + std::to_string(acked_.begin()->first));
  EXPECT_TRUE(deleted.status == 204 || deleted.status == 507) << deleted.body;
  if (deleted.status == 204) acked_.erase(acked_.begin());
  // Background work meets the full volume too; the daemon lives on and serves reads.
  auto gc = Call("POST", "/v1/admin/gc");
  EXPECT_NE(gc.status, 0) << "the daemon died";
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
  EXPECT_EQ(Status()["pushes_accepted"], false);

  std::filesystem::remove(filler);
  ASSERT_NO_FATAL_FAILURE(WaitPushesAccepted());
  ASSERT_NO_FATAL_FAILURE(PushAcked(version, body));
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(ExpectAckedIntact());
}

}  // namespace
}  // namespace ckpt
