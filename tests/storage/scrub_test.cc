// Scrub: every stored chunk read and verified, every version restored, leftovers counted.
#include <gtest/gtest.h>

#include "records/keys.h"
#include "store_fixture.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::CheckpointStoreTest;
using testing::DriftingModel;

class ScrubTest : public CheckpointStoreTest {
 protected:
  // Versions 1..count of a model large enough that its chunks live in blob files.
  void PushVersions(uint64_t count) {
    Reopen(64 << 10);
    DriftingModel drift(61, 60000);
    for (uint64_t v = 1; v <= count; ++v) ASSERT_TRUE(Push("m", v, drift.Next()).ok());
    ASSERT_TRUE(store_->Flush().ok());
  }
};

TEST_F(ScrubTest, CleanStoreScrubsClean) {
  ASSERT_NO_FATAL_FAILURE(PushVersions(5));
  ASSERT_TRUE(store_->DeleteVersion("m", 2).ok());
  auto report = store_->Scrub("m");
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->clean()) << (report->problems.empty() ? "" : report->problems[0]);
  EXPECT_EQ(report->versions_checked, 4u);
  EXPECT_GT(report->chunks_checked, 5u);
  EXPECT_GT(report->bytes_checked, 100000u);
  EXPECT_EQ(store_->Scrub("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(ScrubTest, AByteFlippedOnDiskIsFoundAndTheDamagedVersionsNamed) {
  CKPT_LOCAL_BACKEND_ONLY("flips a byte in the store's RocksDB files");
  ASSERT_NO_FATAL_FAILURE(PushVersions(4));
  store_.reset();
  ASSERT_NE(testing::FlipByteInLargestFile(dir_.str(), ".blob"), "");
  Reopen(64 << 10);
  auto report = store_->Scrub("m");
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->clean());
  ASSERT_FALSE(report->damaged_versions.empty());
  // Each damaged version fails to restore, and the problems name model and version.
  for (uint64_t v : report->damaged_versions) {
    auto restored = store_->OpenRestore("m", v);
    Status s = restored.status();
    while (s.ok()) {
      auto piece = (*restored)->Next();
      if (!piece.ok()) s = piece.status();
      if (!piece.ok() || piece->empty()) break;
    }
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "version " << v;
  }
  bool named = false;
  for (const std::string& p : report->problems) {
    named |= p.find("model 'm' version " + std::to_string(report->damaged_versions[0])) !=
             std::string::npos;
  }
  EXPECT_TRUE(named) << report->problems[0];
}

TEST_F(ScrubTest, LeftoverChunksAreCountedAsOrphans) {
  CKPT_LOCAL_BACKEND_ONLY(
      "writes a chunk record into the store's RocksDB (shared backends: "
      "CheckpointStoreTest.RecoveryRemovesChunksOfInterruptedPush)");
  ASSERT_NO_FATAL_FAILURE(PushVersions(2));
  store_.reset();
  // Seq 0 is never allocated: a chunk there belongs to no stored push.
  ASSERT_TRUE(testing::PutKey(dir_.str(), "chunks", storage_keys::ChunkKey("m", 0, 0, 0), "x"));
  Reopen(64 << 10);
  auto report = store_->Scrub("m");
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->orphaned_chunks, 1u);
  EXPECT_TRUE(report->damaged_versions.empty());
  EXPECT_FALSE(report->clean());
}

}  // namespace
}  // namespace ckpt
