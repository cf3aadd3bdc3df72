// Rearranging the newest versions: the latest becomes keyframes and the version before a reverse
// delta against them, so restoring the latest decodes one payload per chunk, no version ever
// needs more than keyframe_every, and no version restores to a different byte.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ckpt/storage/retention.h"
#include "store_fixture.h"
#include "test_support.h"
#include "write/model_locks.h"

namespace ckpt {
namespace {

using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::Sha256Hex;

class RearrangeTest : public CheckpointStoreTest {
 protected:
  // Pushes `count` versions of `drift` to `model`, rearranging after each push when `rearrange`;
  // returns version -> SHA-256 of the body a restore sends.
  std::map<uint64_t, std::string> PushAll(std::string_view model, DriftingModel& drift,
                                          uint64_t count, bool rearrange) {
    std::map<uint64_t, std::string> sha;
    for (uint64_t v = 1; v <= count; ++v) {
      auto info = Push(model, v, drift.Next());
      EXPECT_TRUE(info.ok()) << info.status().ToString();
      if (!info.ok()) break;
      sha[v] = info->sha256;
      if (rearrange) {
        auto report = store_->RearrangeLatest(model, nullptr);
        EXPECT_TRUE(report.ok()) << report.status().ToString();
      }
    }
    return sha;
  }

  void ExpectRestores(std::string_view model, const std::map<uint64_t, std::string>& sha) {
    for (const auto& [v, digest] : sha) {
      auto body = Restore(model, v);
      ASSERT_TRUE(body.ok()) << "version " << v << ": " << body.status().ToString();
      EXPECT_EQ(Sha256Hex(*body), digest) << "version " << v;
    }
  }

  // Payloads decoded to restore `version` of `model` from storage alone (the store reopened,
  // so that its reference cache is empty).
  uint64_t LinksToRestore(std::string_view model, std::optional<uint64_t> version) {
    Reopen();
    const uint64_t before = store_->Stats().restore_links_decoded;
    auto body = Restore(model, version);
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    return store_->Stats().restore_links_decoded - before;
  }

  // Payloads per restore of a version stored as keyframes only: one per chunk.
  uint64_t ChunksPerVersion(DriftingModel drift) {
    EXPECT_TRUE(Push("chunks", 1, drift.Next()).ok());
    return LinksToRestore("chunks", 1);
  }
};

TEST_F(RearrangeTest, LosslessLatestIsOneDecodeAwayAndEveryVersionRestoresExactly) {
  DriftingModel drift(7, 6000);
  const uint64_t chunks = ChunksPerVersion(drift);
  ASSERT_GT(chunks, 4u);
  // Chains longer than the pushes: one forward chain, one reverse chain.
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", testing::kLongLosslessChains));
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("forward", testing::kLongLosslessChains));
  DriftingModel forward_drift = drift;
  auto sha = PushAll("m", drift, 10, /*rearrange=*/true);
  auto forward_sha = PushAll("forward", forward_drift, 10, /*rearrange=*/false);
  EXPECT_EQ(sha, forward_sha);

  auto detail = store_->GetVersionDetail("m", std::nullopt);
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  EXPECT_EQ(detail->info.kind, "keyframe");
  auto before = store_->GetVersionDetail("m", 9);
  ASSERT_TRUE(before.ok());
  for (const TensorDetail& t : before->tensors) {
    if (t.raw_bytes == 0) continue;  // a tensor without elements is a keyframe of nothing
    EXPECT_EQ(t.kind, "delta") << t.name;
    EXPECT_EQ(t.chain_length, 1u) << t.name;
  }
  EXPECT_EQ(LinksToRestore("m", std::nullopt), chunks);
  EXPECT_GT(LinksToRestore("forward", std::nullopt), 5 * chunks);
  ExpectRestores("m", sha);

  // The reverse chain costs what the forward one did: the keyframe moved to the newest version.
  const double rearranged = static_cast<double>(store_->GetModel("m")->stored_bytes);
  const double forward = static_cast<double>(store_->GetModel("forward")->stored_bytes);
  EXPECT_LT(rearranged, 1.03 * forward);
  EXPECT_GT(rearranged, 0.9 * forward);

  // After a restart the next push is a delta against the (keyframe) reference.
  Reopen();
  auto next = Push("m", 11, drift.Next());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->kind, "delta");
  sha[11] = next->sha256;
  ASSERT_TRUE(store_->RearrangeLatest("m", nullptr).ok());
  ExpectRestores("m", sha);
}

TEST_F(RearrangeTest, OldestFirstSweepOfAReverseChainDecodesOneLinkPerChunk) {
  DriftingModel drift(5, 6000);
  const uint64_t chunks = ChunksPerVersion(drift);
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", testing::kLongLosslessChains));
  auto sha = PushAll("m", drift, 8, /*rearrange=*/true);
  // Version 1 is at the far end of the reverse chain: a walk from the keyframe of version 8.
  EXPECT_GE(LinksToRestore("m", 1), 7 * chunks);
  // Each next version is one symmetric (XOR) delta away from the one just restored.
  for (uint64_t v = 2; v <= 8; ++v) {
    const uint64_t before = store_->Stats().restore_links_decoded;
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(Sha256Hex(*body), sha[v]) << "version " << v;
    EXPECT_EQ(store_->Stats().restore_links_decoded - before, chunks) << "version " << v;
  }
  // Deleting the version in between leaves no neighbour one link away: the walk decides.
  ASSERT_TRUE(store_->DeleteVersion("m", 4).ok());
  EXPECT_GE(LinksToRestore("m", 3), 5 * chunks);
  auto body = Restore("m", 5);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_EQ(Sha256Hex(*body), sha[5]);
}

TEST_F(RearrangeTest, NoVersionNeedsMoreThanKeyframeEveryDecodes) {
  DriftingModel drift(11, 6000);
  const uint64_t chunks = ChunksPerVersion(drift);
  SetCodecPolicy("m", R"({"keyframe_every":4})");
  auto sha = PushAll("m", drift, 13, /*rearrange=*/true);
  for (uint64_t v = 1; v <= 13; ++v) {
    auto detail = store_->GetVersionDetail("m", v);
    ASSERT_TRUE(detail.ok());
    for (const TensorDetail& t : detail->tensors) EXPECT_LE(t.chain_length, 3u) << "version " << v;
    EXPECT_LE(LinksToRestore("m", v), 4 * chunks) << "version " << v;
  }
  EXPECT_EQ(LinksToRestore("m", std::nullopt), chunks);
  ExpectRestores("m", sha);
}

TEST_F(RearrangeTest, DeletingVersionsOfAReverseChainKeepsTheOthersAndFreesSpace) {
  DriftingModel drift(13, 6000);
  auto sha = PushAll("m", drift, 12, /*rearrange=*/true);
  const uint64_t full = store_->GetModel("m")->stored_bytes;
  for (uint64_t v : {2, 3, 5, 6, 8}) {
    ASSERT_TRUE(store_->DeleteVersion("m", v).ok()) << v;
    sha.erase(v);
  }
  auto gc = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_GT(gc->bytes_freed, 0u);
  const uint64_t collected = store_->GetModel("m")->stored_bytes;
  EXPECT_LT(collected, full);
  ExpectRestores("m", sha);
  // The latest, the base of the reverse chain: its data leaves with it.
  ASSERT_TRUE(store_->DeleteVersion("m", 12).ok());
  sha.erase(12);
  EXPECT_LT(store_->GetModel("m")->stored_bytes, collected);
  ExpectRestores("m", sha);
  auto next = Push("m", 13, drift.Next());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  sha[13] = next->sha256;
  ASSERT_TRUE(store_->RearrangeLatest("m", nullptr).ok());
  ExpectRestores("m", sha);
  Reopen();
  ExpectRestores("m", sha);
}

TEST_F(RearrangeTest, LossyOnAPlainLatticeIsRearrangedAdditiveChainsAreLeftForward) {
  const char* kLossy = R"({"mode":"lossy","max_abs_error":1e-3})";
  DriftingModel drift(17, 6000);
  DriftingModel additive_drift = drift;
  // A retention policy with rules makes the lattice chains plain (no element history).
  SetCodecPolicy("plain", kLossy);
  ASSERT_TRUE(
      store_->SetRetentionPolicy("plain", *RetentionPolicy::FromJson(R"({"keep_last":100})")).ok());
  // Additive reconstructions carry every rounding of their chain: exact backwards, they would
  // cost several deltas.
  SetCodecPolicy("additive", R"({"mode":"lossy","max_abs_error":1e-3,"reclaimable":false})");
  std::map<uint64_t, std::string> plain, additive;
  for (uint64_t v = 1; v <= 6; ++v) {
    auto p = Push("plain", v, drift.Next());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    plain[v] = p->sha256;
    auto h = Push("additive", v, additive_drift.Next());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    additive[v] = h->sha256;
    auto rp = store_->RearrangeLatest("plain", nullptr);
    ASSERT_TRUE(rp.ok()) << rp.status().ToString();
    auto rh = store_->RearrangeLatest("additive", nullptr);
    ASSERT_TRUE(rh.ok()) << rh.status().ToString();
    if (v > 1) {
      EXPECT_GT(rp->tensors_keyframed, 0u) << v;
      EXPECT_GT(rp->tensors_reversed, 0u) << v;
      EXPECT_LE(rp->bytes_after, rp->bytes_before * 1.03) << v;
      EXPECT_GT(rh->tensors_left, 0u) << v;
      EXPECT_LE(rh->bytes_after, rh->bytes_before * 1.03) << v;
    }
  }
  ExpectRestores("plain", plain);
  ExpectRestores("additive", additive);
  auto detail = store_->GetVersionDetail("plain", std::nullopt);
  ASSERT_TRUE(detail.ok());
  for (const TensorDetail& t : detail->tensors) {
    if (t.codec == "lossy") {
      EXPECT_EQ(t.kind, "keyframe") << t.name;
    }
  }
  Reopen();
  ExpectRestores("plain", plain);
  ExpectRestores("additive", additive);
}

// "fast_latest" puts a lossy model without retention rules on the plain lattice, so its latest
// is one decode away like a lossless model's; the default lattice (element history, low-rank
// shifts) keeps its chains forward.
TEST_F(RearrangeTest, FastLatestMakesALossyLatestOneDecodeAway) {
  // Element history needs chunks of at least 4096 elements.
  constexpr uint64_t kChunkBytes = 1 << 16;
  Reopen(kChunkBytes);
  DriftingModel drift(23, 20000);
  ASSERT_TRUE(Push("chunks", 1, DriftingModel(drift).Next()).ok());
  DriftingModel default_drift = drift;
  SetCodecPolicy("fast", R"({"mode":"lossy","max_abs_error":1e-3,"fast_latest":true})");
  SetCodecPolicy("default", R"({"mode":"lossy","max_abs_error":1e-3})");
  auto fast = PushAll("fast", drift, 6, /*rearrange=*/true);
  auto by_default = PushAll("default", default_drift, 6, /*rearrange=*/true);
  const uint64_t chunks = LinksToRestore("chunks", 1);
  EXPECT_EQ(LinksToRestore("fast", std::nullopt), chunks);
  EXPECT_GT(LinksToRestore("default", std::nullopt), chunks);
  auto detail = store_->GetVersionDetail("fast", 5);
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  for (const TensorDetail& t : detail->tensors) {
    if (t.raw_bytes == 0) continue;
    EXPECT_EQ(t.kind, "delta") << t.name;
    EXPECT_EQ(t.chain_length, 1u) << t.name;
  }
  ExpectRestores("fast", fast);
  ExpectRestores("default", by_default);
}

// "fast_latest" defaults to "auto": the default lattice for a checkpoint the reference cache
// keeps, the plain lattice (rearranged, its latest one decode away) for one it does not, whose
// latest and next reference would otherwise be decoded from storage through a forward chain.
TEST_F(RearrangeTest, ALossyCheckpointLargerThanTheCacheGetsItsLatestOneDecodeAway) {
  constexpr uint64_t kChunkBytes = 1 << 16;
  DriftingModel drift(31, 20000);
  const uint64_t checkpoint_bytes = DriftingModel(drift).Next().size();
  ASSERT_NO_FATAL_FAILURE(Reopen(kChunkBytes, /*reference_cache_bytes=*/checkpoint_bytes));
  ASSERT_TRUE(Push("chunks", 1, DriftingModel(drift).Next()).ok());
  DriftingModel forward_drift = drift, kept_drift = drift;
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("auto", R"({"mode":"lossy","max_abs_error":1e-3})"));
  ASSERT_NO_FATAL_FAILURE(
      SetCodecPolicy("forward", R"({"mode":"lossy","max_abs_error":1e-3,"fast_latest":false})"));
  auto by_default = PushAll("auto", drift, 6, /*rearrange=*/true);
  auto forward = PushAll("forward", forward_drift, 6, /*rearrange=*/true);
  const uint64_t chunks = LinksToRestore("chunks", 1);
  EXPECT_EQ(LinksToRestore("auto", std::nullopt), chunks);
  EXPECT_GT(LinksToRestore("forward", std::nullopt), chunks);
  ExpectRestores("auto", by_default);
  ExpectRestores("forward", forward);

  // The same checkpoints where the cache keeps them (exactly half its budget, the most it keeps
  // of one version): the default lattice, chains forward.
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("kept", R"({"mode":"lossy","max_abs_error":1e-3})"));
  ASSERT_NO_FATAL_FAILURE(Reopen(kChunkBytes, /*reference_cache_bytes=*/2 * checkpoint_bytes));
  auto kept = PushAll("kept", kept_drift, 6, /*rearrange=*/true);
  EXPECT_GT(LinksToRestore("kept", std::nullopt), chunks);
  ExpectRestores("kept", kept);
}

// Each pass deletes the keyframes the pass before wrote and the push's forward deltas; the
// records that live on (reverse deltas) went to blob files of their own, so the dead ones leave
// the disk with whole files, at once: what the blob files hold stays what the model stores.
TEST_F(RearrangeTest, ReplacedKeyframesLeaveTheDiskWithTheirBlobFiles) {
  CKPT_LOCAL_BACKEND_ONLY("measures the store's RocksDB blob files");
  Reopen(1 << 16);  // chunks whose payloads are blobs (above the family's min_blob_size)
  DriftingModel drift(29, 200000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 8; ++v) {
    auto info = Push("m", v, drift.Next());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    sha[v] = info->sha256;
    // The push's records reach files before the pass deletes them, as when a large push fills
    // the memtables (closing the store flushes them).
    Reopen(1 << 16);
    auto report = store_->RearrangeLatest("m", nullptr);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
  }
  Reopen(1 << 16);
  const uint64_t stored = store_->GetModel("m")->stored_bytes;
  const uint64_t blob_bytes = store_->Stats().blob_bytes;
  EXPECT_GT(blob_bytes, stored / 2);
  EXPECT_LT(blob_bytes, stored * 5 / 4) << "stored " << stored;
  ExpectRestores("m", sha);
}

// Pushes back to back, then one pass: each push's records went to blob files of its own (the
// commit seals them), so the forward deltas the pass replaces leave with their files, never
// sitting in a file shared with the versions before. A model whose large tensors keep their
// chains (lossy with element history) has them copied under the pass's new seqs: the copied
// originals leave with the push's files too.
TEST_F(RearrangeTest, APassAfterABurstOfPushesLeavesNoDeadBytesInBlobFiles) {
  CKPT_LOCAL_BACKEND_ONLY("measures the store's RocksDB blob files");
  Reopen(1 << 16);  // chunks whose payloads are blobs (above the family's min_blob_size)
  uint64_t stored = 0;
  for (const std::string model : {"lossless", "lossy"}) {
    SCOPED_TRACE(model);
    ASSERT_NO_FATAL_FAILURE(
        SetCodecPolicy(model, model == "lossless" ? R"({"mode":"lossless"})"
                                                  : R"({"mode":"lossy","max_abs_error":1e-3})"));
    DriftingModel drift(31, 200000);
    std::map<uint64_t, std::string> sha;
    for (uint64_t v = 1; v <= 8; ++v) {
      auto info = Push(model, v, drift.Next());
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      sha[v] = info->sha256;
    }
    auto report = store_->RearrangeLatest(model, nullptr);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    Reopen(1 << 16);
    stored += store_->GetModel(model)->stored_bytes;
    const uint64_t blob_bytes = store_->Stats().blob_bytes;
    // Blob files add a header, a footer and a record header (with its key) per payload.
    EXPECT_LT(blob_bytes, stored + stored / 50) << "stored " << stored;
    EXPECT_GT(blob_bytes, stored / 2);
    ExpectRestores(model, sha);
  }
}

TEST_F(RearrangeTest, NothingToDoForAKeyframeOrAnEmptyModel) {
  DriftingModel drift(19, 600);
  ASSERT_TRUE(Push("m", 1, drift.Next()).ok());
  auto report = store_->RearrangeLatest("m", nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->tensors_keyframed, 0u);
  EXPECT_EQ(store_->RearrangeLatest("missing", nullptr).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->RearrangeLatest("bad/name", nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(RearrangeTest, GivesWayToAPushAndLosesNothing) {
  DriftingModel drift(23, 6000);
  auto sha = PushAll("m", drift, 3, /*rearrange=*/false);
  // A push holding the model's lock makes the pass fail fast.
  const std::string body = drift.Next();
  auto session = store_->BeginPush("m", 4, body.size());
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(store_->RearrangeLatest("m", nullptr).status().code(), StatusCode::kAborted);
  ASSERT_TRUE((*session)->Write(testing::Bytes(body)).ok());
  auto info = (*session)->Commit();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  sha[4] = info->sha256;
  session->reset();
  ASSERT_TRUE(store_->RearrangeLatest("m", nullptr).ok());
  ExpectRestores("m", sha);
}

TEST(ModelLocksTest, AHolderLearnsThatAnotherWriterAsked) {
  ModelLocks locks;
  ModelLocks::Guard held = locks.TryLock("m");
  ASSERT_TRUE(held);
  EXPECT_FALSE(held.Contended());
  EXPECT_FALSE(locks.TryLock("m"));
  EXPECT_TRUE(held.Contended());
  EXPECT_TRUE(locks.TryLock("other"));
  held = ModelLocks::Guard();
  ModelLocks::Guard again = locks.TryLock("m");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again.Contended());
}

}  // namespace
}  // namespace ckpt
