// Garbage collection: deleting versions frees their space (rebasing kept versions whose chains
// ran through them) and never changes a byte any kept version restores to.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "records/records.h"
#include "store_fixture.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::Sha256Hex;

class GarbageCollectionTest : public CheckpointStoreTest {
 protected:
  // Pushes versions 1..count of `drift` as model "m"; returns version -> SHA-256 of the body a
  // restore sends (the pushed body's, or the lossy reconstruction's).
  std::map<uint64_t, std::string> PushAll(DriftingModel& drift, uint64_t count) {
    std::map<uint64_t, std::string> sha;
    for (uint64_t v = 1; v <= count; ++v) {
      auto info = Push("m", v, drift.Next());
      EXPECT_TRUE(info.ok()) << info.status().ToString();
      if (info.ok()) sha[v] = info->sha256;
    }
    return sha;
  }

  void ExpectRestores(const std::map<uint64_t, std::string>& sha) {
    for (const auto& [v, digest] : sha) {
      auto body = Restore("m", v);
      ASSERT_TRUE(body.ok()) << "version " << v << ": " << body.status().ToString();
      EXPECT_EQ(Sha256Hex(*body), digest) << "version " << v;
    }
  }

  uint64_t StoredBytes() { return store_->GetModel("m")->stored_bytes; }

  // After a collection: every kept version restores as before, also after reopening the store
  // (with `chunk_bytes`), and the next push (version `next`) is still a delta.
  void ExpectRebasedChainsHold(DriftingModel& drift, std::map<uint64_t, std::string>* sha,
                               uint64_t next, uint64_t chunk_bytes = 4096) {
    ExpectRestores(*sha);
    Reopen(chunk_bytes);
    ExpectRestores(*sha);
    auto pushed = Push("m", next, drift.Next());
    ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
    EXPECT_EQ(pushed->kind, "delta");
    (*sha)[next] = pushed->sha256;
    ExpectRestores(*sha);
  }

  // Deletes versions first..last of "m" for which `deleted(v)` holds, forgetting their SHA-256.
  void DeleteVersions(
      uint64_t first, uint64_t last, std::map<uint64_t, std::string>* sha,
      const std::function<bool(uint64_t)>& deleted = [](uint64_t) { return true; }) {
    for (uint64_t v = first; v <= last; ++v) {
      if (!deleted(v)) continue;
      ASSERT_TRUE(store_->DeleteVersion("m", v).ok()) << "version " << v;
      sha->erase(v);
    }
  }
};

TEST_F(GarbageCollectionTest, DeletingNinetyPercentFreesAtLeastEightyPercentOfTheirBytes) {
  // Chains long enough that kept versions run through deleted ones.
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", testing::kLongLosslessChains));
  DriftingModel drift(31, 6000);
  auto sha = PushAll(drift, 40);
  const uint64_t before = StoredBytes();
  uint64_t deleted_bytes = 0;
  for (uint64_t v = 1; v <= 40; ++v) {
    if (v % 10 == 0) continue;
    deleted_bytes += store_->GetVersion("m", v)->stored_bytes;
    ASSERT_TRUE(store_->DeleteVersion("m", v).ok());
    sha.erase(v);
  }
  // Kept versions' chains still run through most deleted versions: little is freed yet.
  EXPECT_GT(StoredBytes(), before - deleted_bytes / 2);

  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->versions_rebased, 0u);
  EXPECT_GT(report->bytes_freed, 0u);
  EXPECT_EQ(report->bytes_retained, 0u);
  EXPECT_EQ(report->compacted, testing::TestStoreIsLocal());  // compaction is RocksDB's
  const uint64_t freed = before - StoredBytes();
  EXPECT_GE(freed, deleted_bytes * 8 / 10) << "freed " << freed << " of " << deleted_bytes;
  ExpectRestores(sha);
  Reopen();
  ExpectRestores(sha);

  // Nothing left to do; and the chain continues: the next push is a delta.
  auto again = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->versions_rebased, 0u);
  EXPECT_EQ(again->bytes_freed, 0u);
  auto next = Push("m", 41, drift.Next());
  ASSERT_TRUE(next.ok());
  sha[41] = next->sha256;
  ExpectRestores(sha);
}

TEST_F(GarbageCollectionTest, RebasingTheLatestVersionKeepsTheNextPushADelta) {
  DriftingModel drift(32, 3000);
  auto sha = PushAll(drift, 6);
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(1, 5, &sha));
  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->versions_rebased, 1u);
  EXPECT_EQ(store_->GetVersion("m", 6)->kind, "keyframe");
  // The reference cache followed the rebased manifest: no keyframe for lack of a reference.
  auto next = Push("m", 7, drift.Next());
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->kind, "delta");
  sha[7] = next->sha256;
  ExpectRestores(sha);
}

// Lossy tensors coded on the lattice (the default, "reclaimable") are rebased exactly like
// lossless ones: deleting 90% of the versions frees at least 80% of their bytes.
TEST_F(GarbageCollectionTest, LossyLatticeChainsAreRebasedAndFreeTheirSpace) {
  ASSERT_NO_FATAL_FAILURE(
      SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})"));
  DriftingModel drift(33, 6000);
  auto sha = PushAll(drift, 40);
  const uint64_t before = StoredBytes();
  uint64_t deleted_bytes = 0;
  for (uint64_t v = 1; v <= 40; ++v) {
    if (v % 10 != 0) deleted_bytes += store_->GetVersion("m", v)->stored_bytes;
  }
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(1, 40, &sha, [](uint64_t v) { return v % 10 != 0; }));
  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->versions_rebased, 0u);
  EXPECT_EQ(report->bytes_retained, 0u);
  const uint64_t freed = before - StoredBytes();
  EXPECT_GE(freed, deleted_bytes * 8 / 10) << "freed " << freed << " of " << deleted_bytes;
  // Still lossy, same bound: the rebased versions restore to the same bytes.
  auto kept = store_->GetVersion("m", 40);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->lossy);
  ExpectRebasedChainsHold(drift, &sha, 41);
}

// Lattice chains with element history (large chunks, a model without retention rules) rebase
// exactly too: the re-encoded versions carry their elements' history states, so that they and
// the versions after them restore to the same bytes, before and after a reopen.
TEST_F(GarbageCollectionTest, LossyLatticeChainsWithElementHistoryRebaseExactly) {
  Reopen(1 << 16);
  ASSERT_NO_FATAL_FAILURE(
      SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})"));
  DriftingModel drift(35, 32768);
  auto sha = PushAll(drift, 12);
  const uint64_t before = StoredBytes();
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(1, 11, &sha, [](uint64_t v) { return v % 4 != 0; }));
  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->versions_rebased, 0u);
  EXPECT_LT(StoredBytes(), before);
  ExpectRebasedChainsHold(drift, &sha, 13, 1 << 16);
}

// A weight matrix (512 x 64) whose versions drift along a few fresh directions, as Adam's do,
// next to a bias: what the low-rank shift of the lattice is for.
class LowRankDrift {
 public:
  explicit LowRankDrift(uint64_t seed) : rng_(seed), weights_(512 * 64), bias_(64) {
    std::normal_distribution<float> init(0.0f, 0.05f);
    for (float& w : weights_) w = init(rng_);
    for (float& b : bias_) b = init(rng_);
  }

  std::string Next() {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> u(512 * 3), v(64 * 3);
    for (float& x : u) x = normal(rng_);
    for (float& x : v) x = normal(rng_);
    for (size_t i = 0; i < 512; ++i) {
      for (size_t j = 0; j < 64; ++j) {
        float s = 0;
        for (size_t k = 0; k < 3; ++k) s += u[i * 3 + k] * v[j * 3 + k];
        weights_[i * 64 + j] += 1.5e-3f * s + 2e-4f * normal(rng_);
      }
    }
    for (float& b : bias_) b += 1e-3f * normal(rng_);
    return testing::Serialize({{"w", DType::kF32, {512, 64}, testing::FloatBytes(weights_)},
                               {"b", DType::kF32, {64}, testing::FloatBytes(bias_)}},
                              {});
  }

 private:
  std::mt19937_64 rng_;
  std::vector<float> weights_, bias_;
};

// With "low_rank" (the default), lattice deltas of the weight matrix take the low-rank shift
// (payload version 4, smaller than with "low_rank": false), every version restores within the bound
// after a reopen, and after deleting versions and collecting, the kept ones restore to the same
// bytes (before and after a reopen) and the next push is still a delta.
TEST_F(GarbageCollectionTest, LowRankLatticeChainsKeepTheirVersionsThroughCollection) {
  Reopen(1 << 20);
  std::map<std::string, uint64_t> stored;
  std::map<uint64_t, std::string> sha;
  std::vector<std::string> bodies;
  for (const char* model : {"flat", "m"}) {
    ASSERT_NO_FATAL_FAILURE(SetCodecPolicy(
        model, std::string(R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[])") +
                   (std::string(model) == "m" ? "}" : R"(,"low_rank":false})")));
    LowRankDrift drift(61);
    for (uint64_t v = 1; v <= 10; ++v) {
      const std::string body = drift.Next();
      auto info = Push(model, v, body);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      if (std::string(model) == "m") {
        sha[v] = info->sha256;
        bodies.push_back(body);
      }
    }
    stored[model] = store_->GetModel(model)->stored_bytes;
  }
  EXPECT_LT(stored["m"], stored["flat"] * 9 / 10) << stored["m"] << " vs " << stored["flat"];
  Reopen(1 << 20);
  for (uint64_t v = 1; v <= 10; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(Sha256Hex(*body), sha[v]);
    EXPECT_EQ(testing::CheckWithinBound(bodies[v - 1], *body, 1e-3).error, "") << v;
  }
  const uint64_t before = StoredBytes();
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(1, 9, &sha, [](uint64_t v) { return v % 3 != 0; }));
  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  // An exact re-encoding on the fine lattice costs more than the deleted deltas it would free
  // (the shifts accumulate over the gap), so collection keeps what the kept versions need.
  EXPECT_EQ(report->versions_rebased, 0u);
  EXPECT_GT(report->bytes_retained, 0u);
  EXPECT_LE(StoredBytes(), before);
  ExpectRestores(sha);
  Reopen(1 << 20);
  ExpectRestores(sha);
  LowRankDrift more(62);
  auto pushed = Push("m", 11, more.Next());
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ(pushed->kind, "delta");
}

// An exact re-encoding of a lattice version with element history carries every element's state,
// so a model whose retention rules delete versions is coded on the lattice without history; a
// model without rules gets the history contexts (smaller deltas). Both restore within bound.
TEST_F(GarbageCollectionTest, ModelsWithRetentionRulesAreCodedWithoutElementHistory) {
  CKPT_LOCAL_BACKEND_ONLY("reads the chunk records from the store's RocksDB");
  Reopen(1 << 16);  // chunks of 16384 F32 elements: large enough for contexts and history
  const char* lossy = R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})";
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("plain", lossy));
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("retained", lossy));
  auto retention = RetentionPolicy::FromJson(R"({"keep_last": 10})");
  ASSERT_TRUE(retention.ok());
  ASSERT_TRUE(store_->SetRetentionPolicy("retained", *retention).ok());
  DriftingModel plain(34, 20000), retained(34, 20000);
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(Push("plain", v, plain.Next()).ok());
    ASSERT_TRUE(Push("retained", v, retained.Next()).ok());
  }
  for (const char* model : {"plain", "retained"}) {
    auto body = Restore(model, 3);
    ASSERT_TRUE(body.ok()) << model << ": " << body.status().ToString();
  }
  store_.reset();
  // Model -> the payload versions of its lossy chunks (3: lattice with history, 2: without).
  std::map<std::string, std::set<int>> payload_versions;
  for (const auto& [key, value] : testing::ReadAll(dir_.str(), "chunks")) {
    auto record = ChunkRecord::DecodeFrom(value);
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    if (record->codec_id != static_cast<uint16_t>(CodecId::kLossyQuantized)) continue;
    payload_versions[key.substr(0, key.find('\0'))].insert(
        static_cast<uint8_t>(record->payload[0]));
  }
  // (Small tensors never carry history: both models have version 2 payloads.)
  EXPECT_TRUE(payload_versions["plain"].count(3));
  EXPECT_TRUE(payload_versions["retained"].count(2));
  EXPECT_FALSE(payload_versions["retained"].count(3));
}

// Lossy chains written without the lattice ("reclaimable": false, or by releases before it)
// re-encode exactly only at a high cost: the collector rebases where that frees more than it
// writes and otherwise keeps the deltas (reported as retained). The store never grows.
TEST_F(GarbageCollectionTest, LossyChainsWithoutTheLatticeNeverGrowTheStore) {
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy(
      "m", R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[],"reclaimable":false})"));
  DriftingModel drift(34, 8192);  // chunks large enough for element history
  auto sha = PushAll(drift, 12);
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(1, 12, &sha, [](uint64_t v) { return v % 4 != 0; }));
  const uint64_t before = StoredBytes();
  auto report = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(StoredBytes(), before);
  EXPECT_GT(report->bytes_freed, 0u);
  ExpectRestores(sha);
  Reopen();
  ExpectRestores(sha);

  // One deleted delta between two kept versions: re-encoding the later one exactly against the
  // earlier costs more than the delta it would free, so the delta stays.
  for (uint64_t v = 13; v <= 15; ++v) {
    auto info = Push("m", v, drift.Next());
    ASSERT_TRUE(info.ok());
    sha[v] = info->sha256;
  }
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(14, 14, &sha));
  const uint64_t with_dead_delta = StoredBytes();
  GcOptions eager;
  eager.rebase_min_dead_fraction = 0;
  report = store_->CollectGarbage("m", eager);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->versions_rebased, 0u);
  EXPECT_GT(report->bytes_retained, 0u);
  EXPECT_EQ(StoredBytes(), with_dead_delta);
  ExpectRestores(sha);
}

TEST_F(GarbageCollectionTest, NegativeThresholdOnlyRemovesWhatNothingNeeds) {
  DriftingModel drift(34, 3000);
  auto sha = PushAll(drift, 8);
  ASSERT_NO_FATAL_FAILURE(DeleteVersions(2, 7, &sha));
  GcOptions no_rebase;
  no_rebase.rebase_min_dead_fraction = -1;
  auto report = store_->CollectGarbage("m", no_rebase);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->versions_rebased, 0u);
  EXPECT_GT(report->bytes_retained, 0u);
  ExpectRestores(sha);
}

// The latest version deleted: its manifest stays as the reference, and goes with the commit of
// the next push that no longer needs it (a push that starts new chains), so a scrub right after
// finds nothing orphaned and the store holds no more than its versions need.
// Deleting the latest version hands the reference to the newest version that stays and frees
// the deleted one's data at once, also when the versions before it were re-encoded against it
// (RearrangeLatest): the model never reports more stored than raw bytes, and the next push is
// a delta against the new latest.
TEST_F(GarbageCollectionTest, DeletingTheLatestVersionFreesItsDataAtOnce) {
  for (const bool rearranged : {false, true}) {
    SCOPED_TRACE(rearranged ? "rearranged" : "forward chain");
    ASSERT_TRUE(store_->DeleteModel("m").ok() ||
                store_->GetModel("m").status().code() == StatusCode::kNotFound);
    DriftingModel drift(41, 6000);
    auto sha = PushAll(drift, 3);
    if (rearranged) {
      auto report = store_->RearrangeLatest("m", nullptr);
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      ASSERT_GT(report->tensors_keyframed, 0u);
    }
    ASSERT_TRUE(store_->DeleteVersion("m", 3).ok());
    sha.erase(3);
    auto model = store_->GetModel("m");
    ASSERT_TRUE(model.ok());
    EXPECT_LE(model->stored_bytes, model->raw_bytes);
    uint64_t versions_stored = 0;
    auto versions = store_->ListVersions("m");
    ASSERT_TRUE(versions.ok());
    for (const VersionInfo& v : *versions) versions_stored += v.stored_bytes;
    EXPECT_EQ(model->stored_bytes, versions_stored) << "nothing kept beyond the versions";
    auto scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
    // (On a shared backend, removals deferred before the previous case's reopen were forgotten
    // with it: those chunks are orphans for garbage collection.)
    const uint64_t orphaned_chunks = testing::TestStoreIsLocal() ? scrub->orphaned_chunks : 0;
    EXPECT_TRUE(scrub->damaged_versions.empty() && scrub->problems.empty() &&
                scrub->orphaned_manifests == 0 && orphaned_chunks == 0)
        << "orphaned manifests " << scrub->orphaned_manifests << ", orphaned chunks "
        << scrub->orphaned_chunks << ", damaged " << scrub->damaged_versions.size();
    ASSERT_NO_FATAL_FAILURE(ExpectRebasedChainsHold(drift, &sha, 4));
  }
}

// The data directory accounts for itself (StoreStats): its files are what the models store,
// the garbage compactions give back, and the engine's own. A delete shows as garbage until the
// collection's compaction takes it off the disk; then the directory holds the stored bytes and
// the engine's files again.
TEST_F(GarbageCollectionTest, TheDataDirectoryIsStoredPlusGarbagePlusTheEnginesFiles) {
  CKPT_LOCAL_BACKEND_ONLY("accounts for the local data directory");
  Reopen(1 << 16);  // chunks whose payloads are blobs (above the family's min_blob_size)
  DriftingModel drift(43, 200000);
  auto sha = PushAll(drift, 6);
  ASSERT_TRUE(store_->RearrangeLatest("m", nullptr).ok());
  Reopen(1 << 16);  // a clean close flushes the log
  auto expect_adds_up = [&](std::string_view when) -> StoreStats {
    SCOPED_TRACE(when);
    const StoreStats s = store_->Stats();
    EXPECT_TRUE(s.space_known);
    EXPECT_EQ(s.stored_bytes, StoredBytes());
    EXPECT_EQ(s.data_directory_bytes, s.stored_bytes + s.garbage_bytes + s.metadata_bytes);
    return s;
  };
  StoreStats s = expect_adds_up("after the pushes and their pass");
  EXPECT_EQ(s.garbage_bytes, 0u);
  // The engine's fixed files (its options, manifest, identity) and the tables' keys and indexes.
  EXPECT_LT(s.metadata_bytes, s.stored_bytes / 100 + (128u << 10));

  const uint64_t stored = StoredBytes();
  DeleteVersions(1, 4, &sha);  // a whole chain: nothing kept needs it
  ASSERT_LT(StoredBytes(), stored);
  s = expect_adds_up("after deletes");
  EXPECT_EQ(s.garbage_bytes, stored - StoredBytes()) << "what the deletes removed, still on disk";

  GcOptions gc;
  gc.compaction = GcOptions::Compaction::kTables;
  auto report = store_->CollectGarbage("m", gc);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  s = expect_adds_up("after the collection");
  EXPECT_LT(s.garbage_bytes, s.stored_bytes / 100) << "whole blob files went with the removals";
  EXPECT_LT(s.metadata_bytes, s.stored_bytes / 100 + (128u << 10));
  ExpectRestores(sha);
}

// What a delete removed awaits compaction across a restart: the account still shows it as
// garbage, and the next collection compacts it away and reports it reclaimed.
TEST_F(GarbageCollectionTest, SpaceAwaitingCompactionIsKeptAcrossARestart) {
  CKPT_LOCAL_BACKEND_ONLY("accounts for the local data directory");
  Reopen(1 << 16);
  DriftingModel drift(53, 200000);
  auto sha = PushAll(drift, 6);
  ASSERT_TRUE(store_->RearrangeLatest("m", nullptr).ok());
  const uint64_t stored = StoredBytes();
  DeleteVersions(1, 4, &sha);
  const uint64_t awaiting = stored - StoredBytes();
  ASSERT_GT(awaiting, 0u);
  ASSERT_EQ(store_->Stats().garbage_bytes, awaiting);

  Reopen(1 << 16);
  StoreStats s = store_->Stats();
  EXPECT_EQ(s.garbage_bytes, awaiting) << "the count outlives the process";
  EXPECT_EQ(s.data_directory_bytes, s.stored_bytes + s.garbage_bytes + s.metadata_bytes);
  const uint64_t directory_before = s.data_directory_bytes;

  GcOptions gc;
  gc.compaction = GcOptions::Compaction::kTables;
  auto report = store_->CollectGarbage("m", gc);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->bytes_reclaimed, awaiting);
  s = store_->Stats();
  EXPECT_LT(s.garbage_bytes, s.stored_bytes / 100);
  EXPECT_LT(s.data_directory_bytes + awaiting / 2, directory_before) << "the space came back";

  Reopen(1 << 16);
  EXPECT_EQ(store_->Stats().garbage_bytes, s.garbage_bytes) << "nothing awaits any more";
  ExpectRestores(sha);

  // A deleted model's count goes with it, across a restart too.
  DeleteVersions(5, 5, &sha);
  ASSERT_GT(store_->Stats().garbage_bytes, s.garbage_bytes);
  ASSERT_TRUE(store_->DeleteModel("m").ok());
  EXPECT_EQ(store_->Stats().garbage_bytes, s.garbage_bytes);
  Reopen(1 << 16);
  EXPECT_EQ(store_->Stats().garbage_bytes, s.garbage_bytes);
}

// The engine's MANIFEST gets a record per flush and compaction: a long-running daemon's small
// store keeps a bounded log of them.
TEST_F(GarbageCollectionTest, TheEnginesManifestStaysSmallAcrossManyFlushes) {
  CKPT_LOCAL_BACKEND_ONLY("looks at the local data directory");
  DriftingModel drift(47, 2000);
  constexpr uint64_t kVersions = 1300;  // over 1 MiB of engine changes
  for (uint64_t v = 1; v <= kVersions; ++v) {
    ASSERT_TRUE(Push("m", v, drift.Next()).ok()) << "version " << v;
    ASSERT_TRUE(store_->Flush().ok());
  }
  uint64_t manifest_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    if (entry.path().filename().string().starts_with("MANIFEST-")) {
      manifest_bytes += entry.file_size();
    }
  }
  // Rolled past 1 MiB; what follows a roll is a snapshot of the few live files.
  EXPECT_LT(manifest_bytes, (1u << 20) + (64u << 10));
  EXPECT_GT(manifest_bytes, 0u);
}

// Lossy: after the latest is deleted, the next push deltas against the new latest's
// reconstruction and every element stays within the bound (the closed loop goes on from it).
TEST_F(GarbageCollectionTest, ALossyModelGoesOnFromTheNewLatestAfterADelete) {
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", R"({"mode":"lossy","max_abs_error":1e-3})"));
  DriftingModel drift(43, 6000);
  auto sha = PushAll(drift, 3);
  ASSERT_TRUE(store_->DeleteVersion("m", 3).ok());
  sha.erase(3);
  const std::string next = drift.Next();
  auto pushed = Push("m", 4, next);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ(pushed->kind, "delta");
  sha[4] = pushed->sha256;
  auto restored = Restore("m", 4);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(testing::CheckWithinBound(next, *restored, 1e-3).error, "");
  ExpectRestores(sha);
  Reopen();
  ExpectRestores(sha);
}

TEST_F(GarbageCollectionTest, BusyModelIsAborted) {
  DriftingModel drift(35, 1000);
  PushAll(drift, 2);
  auto session = store_->BeginPush("m", 3, std::nullopt);
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(store_->CollectGarbage("m", GcOptions{}).status().code(), StatusCode::kAborted);
  EXPECT_EQ(store_->CollectGarbage("nope", GcOptions{}).status().code(), StatusCode::kNotFound);
}

// The property: any sequence of pushes, deletes, retention passes (random policies), garbage
// collections and reopens, over lossless and lossy models, leaves every kept version restoring
// to exactly the bytes it restored to before.
TEST_F(GarbageCollectionTest, RandomPushDeleteRetentionCollectSequencesNeverChangeKeptVersions) {
  struct Case {
    const char* policy_json;
    uint64_t chunk_bytes;
    size_t elements;
  };
  for (const Case& c : {
           Case{R"({"mode":"lossless","keyframe_every":6})", 4096, 2000},
           Case{R"({"mode":"lossy","max_abs_error":1e-3,"keyframe_every":5})", 4096, 2000},
           Case{R"({"mode":"lossy","max_abs_error":1e-3})", 4096, 2000},
           Case{R"({"mode":"lossy","max_rel_error":1e-2,"reclaimable":false})", 4096, 2000},
           // Chunks large enough for element history: lattice chains with history.
           Case{R"({"mode":"lossy","max_abs_error":1e-3,"keyframe_every":5})", 1 << 16, 8192},
       }) {
    SCOPED_TRACE(c.policy_json);
    Reopen(c.chunk_bytes);
    (void)store_->DeleteModel("m");  // NotFound on the first pass
    ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", c.policy_json));
    DriftingModel drift(36, c.elements);
    std::mt19937_64 rng(36);
    std::map<uint64_t, std::string> sha;
    uint64_t next_version = 1;
    for (int step = 0; step < 80; ++step) {
      const unsigned action = rng() % 10;
      if (action < 5 || sha.empty()) {
        auto info = Push("m", next_version, drift.Next());
        ASSERT_TRUE(info.ok()) << info.status().ToString();
        sha[next_version++] = info->sha256;
      } else if (action < 8) {
        auto it = sha.begin();
        std::advance(it, rng() % sha.size());
        ASSERT_TRUE(store_->DeleteVersion("m", it->first).ok());
        sha.erase(it);
      } else if (action < 9 && rng() % 2) {
        const std::string rules[] = {R"({"keep_last":3})", R"({"keep_every":4})",
                                     R"({"keep_last":1,"keep_every":7})", R"({"max_bytes":1})"};
        RetentionRun run;
        run.policy = *RetentionPolicy::FromJson(rules[rng() % 4]);
        run.gc.rebase_min_dead_fraction = (rng() % 2) ? 0.0 : 0.5;
        const uint64_t latest = sha.rbegin()->first;
        auto report = store_->ApplyRetention("m", run);
        ASSERT_TRUE(report.ok()) << report.status().ToString();
        for (uint64_t v : report->deleted) sha.erase(v);
        ASSERT_TRUE(sha.count(latest));  // the latest is never deleted
      } else if (action < 9) {
        GcOptions options;
        options.rebase_min_dead_fraction = (rng() % 2) ? 0.0 : 0.5;
        options.compaction = static_cast<GcOptions::Compaction>(rng() % 3);
        auto report = store_->CollectGarbage("m", options);
        ASSERT_TRUE(report.ok()) << report.status().ToString();
      } else {
        Reopen(c.chunk_bytes);
      }
      ExpectRestores(sha);
    }
  }
}

}  // namespace
}  // namespace ckpt
