#include "ckpt/storage/checkpoint_store.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "store_fixture.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::Bytes;
using testing::CheckpointStoreTest;
using testing::DriftingModel;
using testing::LossyPolicy;
using testing::Sha256Hex;

TEST_F(CheckpointStoreTest, PushedVersionsRestoreBitIdenticalAcrossReopen) {
  DriftingModel model(1, 3000);
  std::vector<std::string> bodies;
  for (uint64_t v = 1; v <= 20; ++v) {
    bodies.push_back(model.Next());
    auto info = Push("m", v * 10, bodies.back());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->sha256, Sha256Hex(bodies.back()));
    EXPECT_EQ(info->raw_bytes, bodies.back().size());
    // The lossless default keyframe_every: versions 1, 1 + N, ... start new chains.
    const uint64_t every = CodecPolicy::kLosslessKeyframeEvery;
    EXPECT_EQ(info->kind, (v - 1) % every == 0 ? "keyframe" : "delta") << v;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t v = 1; v <= 20; ++v) {
      auto body = Restore("m", v * 10);
      ASSERT_TRUE(body.ok()) << body.status().ToString();
      EXPECT_EQ(Sha256Hex(*body), Sha256Hex(bodies[v - 1])) << "version " << v * 10;
    }
    auto latest = Restore("m", std::nullopt);
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, bodies.back());
    Reopen();
  }
}

// After a restart, restoring `latest` leaves its chunks in the reference cache: the next push is
// a delta again (with the default keyframe-on-miss), and still restores exactly.
TEST_F(CheckpointStoreTest, RestoringLatestWarmsTheReferenceCache) {
  DriftingModel model(34, 3000);
  std::vector<std::string> bodies;
  ASSERT_NO_FATAL_FAILURE(PushVersions(model, 1, 3, &bodies));
  Reopen();
  auto latest = Restore("m", std::nullopt);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, bodies.back());
  bodies.push_back(model.Next());
  auto info = Push("m", 4, bodies.back());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->kind, "delta");
  Reopen();
  for (uint64_t v = 1; v <= 4; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok());
    EXPECT_EQ(*body, bodies[v - 1]) << v;
  }
  // A restore of the latest fills the cache: the next one decodes nothing.
  Reopen();
  ASSERT_TRUE(Restore("m", std::nullopt).ok());
  const uint64_t links = store_->Stats().restore_links_decoded;
  EXPECT_GT(links, 0u);
  ASSERT_TRUE(Restore("m", std::nullopt).ok());
  EXPECT_EQ(store_->Stats().restore_links_decoded, links);
}

// Restoring the versions of a chain in turn (an evaluation sweep) replays one link per chunk:
// each restore keeps its decoded chunks in the cache, where the next version's deltas start.
// Cold, a version replays its whole chain. Every body is exact either way.
TEST_F(CheckpointStoreTest, RestoringVersionsInTurnReplaysOneLinkPerChunk) {
  ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(R"({"mode":"lossy","max_abs_error":1e-3})")).ok());
  DriftingModel model(35, 6000);
  std::vector<std::string> bodies;
  ASSERT_NO_FATAL_FAILURE(PushVersions(model, 1, 10, &bodies));
  std::vector<std::string> restored_then;
  for (uint64_t v = 1; v <= 10; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    restored_then.push_back(*body);
  }
  Reopen();
  auto links = [&] { return store_->Stats().restore_links_decoded; };
  ASSERT_TRUE(Restore("m", 1).ok());
  const uint64_t chunks = links();  // version 1 is all keyframes: one link per chunk
  ASSERT_GT(chunks, 3u);
  for (uint64_t v = 2; v <= 9; ++v) {
    const uint64_t before = links();
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(*body, restored_then[v - 1]) << v;
    EXPECT_EQ(links() - before, chunks) << "version " << v;
  }
  Reopen();
  auto cold = Restore("m", 9);
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(*cold, restored_then[8]);
  EXPECT_EQ(links(), 9 * chunks);
  EXPECT_EQ(store_->Stats().restores, 1u);
  // A push keeps the former reference's chunks as restored chunks: rolling back to the version
  // before the latest (after a loss spike, say) replays nothing, and restored chunks survive.
  Reopen();
  ASSERT_TRUE(Restore("m", 5).ok());
  ASSERT_TRUE(Restore("m", 10).ok());  // latest: refills the reference
  ASSERT_NO_FATAL_FAILURE(PushVersions(model, 11, 11, &bodies));
  uint64_t before = links();
  auto body = Restore("m", 10);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(*body, restored_then[9]);
  EXPECT_EQ(links() - before, 0u);
  before = links();
  body = Restore("m", 6);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(*body, restored_then[5]);
  EXPECT_EQ(links() - before, chunks);
  // Deleting the model drops everything.
  ASSERT_TRUE(store_->DeleteModel("m").ok());
  EXPECT_EQ(store_->OpenRestore("m", 6).status().code(), StatusCode::kNotFound);
}

// A restore that outlives its model (deleted, created again under the same name, which reuses
// the seqs) must not leave its decoded chunks where the new model's restores find them.
TEST_F(CheckpointStoreTest, RestoreOutlivingItsDeletedModelCachesNothing) {
  DriftingModel old_model(36, 6000), new_model(37, 6000);
  std::vector<std::string> old_bodies, new_bodies;
  ASSERT_NO_FATAL_FAILURE(PushVersions(old_model, 1, 3, &old_bodies));
  auto stream = store_->OpenRestore("m", 2);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  std::string old_body;
  auto read = [&] {
    auto piece = (*stream)->Next();
    EXPECT_TRUE(piece.ok()) << piece.status().ToString();
    if (!piece.ok() || piece->empty()) return false;
    old_body.append(reinterpret_cast<const char*>(piece->data()), piece->size());
    return true;
  };
  ASSERT_TRUE(read());  // the header
  ASSERT_TRUE(store_->DeleteModel("m").ok());
  ASSERT_NO_FATAL_FAILURE(PushVersions(new_model, 1, 3, &new_bodies));
  while (read()) {  // the old stream reads its snapshot to the end
  }
  stream->reset();
  EXPECT_EQ(old_body, old_bodies[1]);
  for (uint64_t v = 1; v <= 3; ++v) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << "version " << v << ": " << body.status().ToString();
    EXPECT_EQ(*body, new_bodies[v - 1]) << v;
  }
}

TEST_F(CheckpointStoreTest, DeltasAreSmallerThanKeyframes) {
  DriftingModel model(2, 20000);
  auto first = Push("m", 1, model.Next());
  auto second = Push("m", 2, model.Next());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_LT(second->stored_bytes, first->stored_bytes);
  EXPECT_LT(first->stored_bytes, first->raw_bytes);
}

TEST_F(CheckpointStoreTest, KeyframeEveryBoundsTheChain) {
  CodecPolicy policy;
  policy.keyframe_every = 4;
  ASSERT_TRUE(store_->SetPolicy("m", policy).ok());
  DriftingModel model(3, 500);
  std::vector<std::string> kinds;
  for (uint64_t v = 1; v <= 9; ++v) {
    auto info = Push("m", v, model.Next());
    ASSERT_TRUE(info.ok());
    kinds.push_back(info->kind);
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"keyframe", "delta", "delta", "delta", "keyframe",
                                             "delta", "delta", "delta", "keyframe"}));
}

// With a cold reference cache (after a restart, or a model larger than the cache) a push
// decodes its reference from storage and stores deltas, which restore exactly.
TEST_F(CheckpointStoreTest, PushWithAColdCacheDecodesTheReferenceAndStoresDeltas) {
  DriftingModel model(18, 3000);
  std::vector<std::string> bodies;
  ASSERT_NO_FATAL_FAILURE(SetCodecPolicy("m", testing::kLongLosslessChains));
  ASSERT_NO_FATAL_FAILURE(PushVersions(model, 1, 3, &bodies));
  Reopen();
  bodies.push_back(model.Next());
  auto cold = Push("m", 4, bodies.back());
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(cold->kind, "delta");
  Reopen(4096, /*reference_cache_bytes=*/0);
  bodies.push_back(model.Next());
  auto uncached = Push("m", 5, bodies.back());
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(uncached->kind, "delta");
  for (uint64_t v = 1; v <= bodies.size(); ++v) EXPECT_EQ(*Restore("m", v), bodies[v - 1]) << v;
}

TEST_F(CheckpointStoreTest, RejectsNonIncreasingVersionsAndBadNames) {
  DriftingModel model(4, 100);
  ASSERT_TRUE(Push("m", 5, model.Next()).ok());
  auto again = store_->BeginPush("m", 5, std::nullopt);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("latest version 5"), std::string::npos);
  EXPECT_EQ(store_->BeginPush("m", 4, std::nullopt).status().code(),
            StatusCode::kFailedPrecondition);
  for (const char* bad : {"", "-x", ".hidden", "a/b", "a b", "ü"}) {
    EXPECT_EQ(store_->BeginPush(bad, 1, std::nullopt).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(store_->BeginPush(std::string(129, 'a'), 1, std::nullopt).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->BeginPush(std::string(128, 'a'), 1, std::nullopt).ok());
}

TEST_F(CheckpointStoreTest, ConcurrentPushToSameModelIsRefusedUntilTheFirstEnds) {
  auto first = store_->BeginPush("m", 1, std::nullopt);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(store_->BeginPush("m", 2, std::nullopt).status().code(), StatusCode::kAborted);
  EXPECT_EQ(store_->DeleteModel("m").code(), StatusCode::kAborted);
  EXPECT_TRUE(store_->BeginPush("other", 1, std::nullopt).ok());
  first->reset();  // the first push ends (aborted): the model is free again
  EXPECT_TRUE(store_->BeginPush("m", 2, std::nullopt).ok());
}

TEST_F(CheckpointStoreTest, AbortedPushLeavesNothingVisibleOrStored) {
  DriftingModel model(5, 5000);
  std::string v1 = model.Next();
  ASSERT_TRUE(Push("m", 1, v1).ok());
  const size_t chunks_before = CountChunkKeys();
  std::string v2 = model.Next();
  {
    auto session = store_->BeginPush("m", 2, v2.size());
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE((*session)->Write(Bytes(v2.substr(0, v2.size() / 2))).ok());
  }  // destroyed without Commit
  EXPECT_EQ(store_->GetVersion("m", 2).status().code(), StatusCode::kNotFound);
  auto info = store_->GetModel("m");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->latest_version, 1u);
  EXPECT_EQ(info->version_count, 1u);
  if (testing::TestStoreIsLocal()) {
    EXPECT_EQ(CountChunkKeys(), chunks_before);
  }
  ASSERT_TRUE(Push("m", 2, v2).ok());
  EXPECT_EQ(*Restore("m", 2), v2);
  // A shared backend removed the aborted push's chunks as it ended: none is an orphan now.
  auto scrub = store_->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks";
}

// A tensor may change dtype or shape between versions, leave and come back, and others may
// appear or be empty: each such tensor starts a new keyframe (a delta needs the same dtype,
// shape and chunk geometry), tensors that stay the same keep their chain, and every version
// restores (lossless: bit-exactly; lossy: within the bound), from the cache and after a reopen.
TEST_F(CheckpointStoreTest, TensorsChangingDtypeShapeOrPresenceRestore) {
  using testing::OwnedTensor;
  std::mt19937_64 rng(47);
  std::normal_distribution<double> normal(0, 0.1);
  auto floats = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(normal(rng));
    return testing::FloatBytes(v);
  };
  auto halves = [&](size_t n) {  // BF16: the upper halves of floats
    const std::string f = floats(n);
    std::string out;
    for (size_t i = 0; i < n; ++i) out += f.substr(i * 4 + 2, 2);
    return out;
  };
  const std::string stable = floats(3000);
  const std::vector<std::vector<OwnedTensor>> versions = {
      {{"w", DType::kF32, {60, 50}, floats(3000)}, {"s", DType::kF32, {3000}, stable}},
      {{"w", DType::kBF16, {60, 50}, halves(3000)}, {"s", DType::kF32, {3000}, stable}},
      {{"w", DType::kF32, {50, 60}, floats(3000)}, {"s", DType::kF32, {3000}, stable}},
      {{"s", DType::kF32, {3000}, stable}, {"e", DType::kF32, {0, 7}, ""}},
      {{"w", DType::kF32, {60, 50}, floats(3000)},
       {"s", DType::kF32, {3000}, stable},
       {"n", DType::kI64, {4}, std::string(32, '\x07')}},
      {{"w", DType::kF32, {3000}, floats(3000)}, {"s", DType::kF32, {3000}, stable}},
  };
  for (const char* policy :
       {testing::kLongLosslessChains,
        R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})",
        R"({"mode":"lossy","max_abs_error":1e-3,"reclaimable":false,"lossless_tensors":[]})"}) {
    SCOPED_TRACE(policy);
    (void)store_->DeleteModel("m");  // NotFound on the first pass
    ASSERT_TRUE(store_->SetPolicy("m", LossyPolicy(policy)).ok());
    std::vector<std::string> bodies;
    for (size_t v = 0; v < versions.size(); ++v) {
      bodies.push_back(testing::Serialize(versions[v]));
      auto info = Push("m", v + 1, bodies.back());
      ASSERT_TRUE(info.ok()) << "version " << v + 1 << ": " << info.status().ToString();
    }
    // "s" never changed: after its keyframe it is a delta in every version.
    for (uint64_t v = 2; v <= versions.size(); ++v) {
      auto detail = store_->GetVersionDetail("m", v);
      ASSERT_TRUE(detail.ok()) << detail.status().ToString();
      for (const TensorDetail& t : detail->tensors) {
        const std::string expected = t.name == "s" ? "delta" : "keyframe";
        if (t.name == "s" || t.name == "w") {
          EXPECT_EQ(t.kind, expected) << t.name << " in " << v;
        }
      }
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t v = 1; v <= bodies.size(); ++v) {
        auto body = Restore("m", v);
        ASSERT_TRUE(body.ok()) << "version " << v << ": " << body.status().ToString();
        const bool lossless =
            std::string_view(policy).find("lossless\"}") != std::string_view::npos;
        if (lossless) {
          EXPECT_EQ(*body, bodies[v - 1]) << "version " << v;
        } else {
          EXPECT_EQ(testing::CheckWithinBound(bodies[v - 1], *body, 1e-3).error, "")
              << "version " << v;
        }
      }
      Reopen();
    }
  }
}

TEST_F(CheckpointStoreTest, MalformedBodyFailsAndChangesNothing) {
  DriftingModel model(6, 500);
  std::string v1 = model.Next();
  ASSERT_TRUE(Push("m", 1, v1).ok());
  std::string bad = model.Next();
  bad[12] = '#';  // corrupt the JSON header
  auto result = Push("m", 2, bad);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  std::string truncated = model.Next();
  truncated.resize(truncated.size() - 3);
  {
    auto session = store_->BeginPush("m", 3, std::nullopt);
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE((*session)->Write(Bytes(truncated)).ok());
    EXPECT_EQ((*session)->Commit().status().code(), StatusCode::kInvalidArgument);
  }
  auto versions = store_->ListVersions("m");
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 1u);
  EXPECT_EQ(*Restore("m", 1), v1);
}

// A crash mid-push: a child process opens the store, writes most of a push and _exit()s, so no
// destructor, abort or close runs. Recovery at the next open must remove the push's chunks. On a
// shared backend the crashed process's write lease must lapse first, and its chunks are orphans
// that scrub counts and garbage collection removes.
TEST_F(CheckpointStoreTest, RecoveryRemovesChunksOfInterruptedPush) {
  DriftingModel model(7, 5000);
  ASSERT_TRUE(Push("m", 1, model.Next()).ok());
  const size_t chunks_before = CountChunkKeys();
  std::string v2 = model.Next();
  store_.reset();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StoreOptions options;
    options.data_dir = dir_.str();
    options.chunk_bytes = 4096;
    testing::ApplyTestStoreBackend(options);
    auto store = CheckpointStore::Open(options);
    if (!store.ok()) _exit(2);
    auto session = (*store)->BeginPush("m", 2, v2.size());
    if (!session.ok() || !(*session)->Write(Bytes(v2.substr(0, v2.size() - 100))).ok()) _exit(3);
    _exit(0);  // "crash": nothing is cleaned up
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  Reopen();
  if (testing::TestStoreIsLocal()) {
    EXPECT_EQ(CountChunkKeys(), chunks_before);
  }
  EXPECT_EQ(store_->GetVersion("m", 2).status().code(), StatusCode::kNotFound);
  auto pushed = Push("m", 2, v2);
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !pushed.ok() && pushed.status().code() == StatusCode::kUnavailable &&
       std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the lease of the crashed one
    pushed = Push("m", 2, v2);
  }
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ(*Restore("m", 2), v2);
  if (!testing::TestStoreIsLocal()) {
    auto scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
    EXPECT_GT(scrub->orphaned_chunks, 0u) << "the crashed push's chunks";
    auto gc = store_->CollectGarbage("m", GcOptions{});
    ASSERT_TRUE(gc.ok()) << gc.status().ToString();
    EXPECT_EQ(gc->orphan_chunks_removed, scrub->orphaned_chunks);
    scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
    EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks";
  }
}

// A push's chunks are encoded by several threads and finish in any order
// (StoreOptions::push_encoder_threads): what is stored, the restored bodies and their SHA-256
// (hashed in body order as the chunks finish) are those of a single encoder, lossless and lossy.
TEST_F(CheckpointStoreTest, ChunksEncodedConcurrentlyStoreWhatOneEncoderStores) {
  struct Outcome {
    std::vector<uint64_t> stored_bytes;
    std::vector<std::string> sha256, restored;
  };
  std::vector<std::string> bodies;
  DriftingModel drift(21, 256 * 1024);  // a 1 MiB weight: 16 chunks of 64 KiB
  for (int v = 0; v < 6; ++v) bodies.push_back(drift.Next());
  auto run = [&](size_t threads) {
    testing::TempDir dir;
    StoreOptions options;
    options.data_dir = dir.str();
    options.chunk_bytes = 64 << 10;  // above the inline limit: the chunks go to the encoders
    options.push_encoder_threads = threads;
    testing::ApplyTestStoreBackend(options);
    auto store = CheckpointStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    Outcome out;
    if (!store.ok()) return out;
    EXPECT_TRUE(
        (*store)->SetPolicy("lossy", LossyPolicy(R"({"mode":"lossy","max_abs_error":5e-4})")).ok());
    for (const char* model : {"lossless", "lossy"}) {
      for (size_t v = 0; v < bodies.size(); ++v) {
        auto session = (*store)->BeginPush(model, v + 1, bodies[v].size());
        EXPECT_TRUE(session.ok());
        if (!session.ok()) return out;
        for (size_t off = 0; off < bodies[v].size(); off += 100000) {
          EXPECT_TRUE(
              (*session)->Write(Bytes(std::string_view(bodies[v]).substr(off, 100000))).ok());
        }
        auto info = (*session)->Commit();
        EXPECT_TRUE(info.ok()) << info.status().ToString();
        if (!info.ok()) return out;
        out.stored_bytes.push_back(info->stored_bytes);
        out.sha256.push_back(info->sha256);
      }
      for (size_t v = 0; v < bodies.size(); ++v) {
        auto stream = (*store)->OpenRestore(model, v + 1);  // verifies the recorded SHA-256
        EXPECT_TRUE(stream.ok()) << stream.status().ToString();
        if (!stream.ok()) return out;
        std::string body;
        for (;;) {
          auto piece = (*stream)->Next();
          EXPECT_TRUE(piece.ok()) << model << " version " << v + 1 << ": "
                                  << piece.status().ToString();
          if (!piece.ok() || piece->empty()) break;
          body.append(reinterpret_cast<const char*>(piece->data()), piece->size());
        }
        out.restored.push_back(std::move(body));
      }
    }
    return out;
  };
  const Outcome one = run(1), four = run(4);
  ASSERT_EQ(one.restored.size(), 2 * bodies.size());
  for (size_t v = 0; v < bodies.size(); ++v) EXPECT_EQ(one.restored[v], bodies[v]) << v;
  EXPECT_NE(one.restored[bodies.size()], bodies[0]);  // the lossy model did quantize
  EXPECT_EQ(four.stored_bytes, one.stored_bytes);
  EXPECT_EQ(four.sha256, one.sha256);
  EXPECT_TRUE(four.restored == one.restored);
}

TEST_F(CheckpointStoreTest, DeletingVersionsNeverChangesOthers) {
  DriftingModel model(8, 3000);
  std::map<uint64_t, std::string> kept;
  for (uint64_t v = 1; v <= 24; ++v) kept[v] = model.Next();
  for (auto& [v, body] : kept) ASSERT_TRUE(Push("m", v, body).ok());
  std::mt19937_64 rng(8);
  for (int round = 0; round < 16; ++round) {
    auto it = kept.begin();
    std::advance(it, rng() % kept.size());
    ASSERT_TRUE(store_->DeleteVersion("m", it->first).ok());
    EXPECT_EQ(store_->GetVersion("m", it->first).status().code(), StatusCode::kNotFound);
    kept.erase(it);
    for (const auto& [v, body] : kept) {
      auto restored = Restore("m", v);
      ASSERT_TRUE(restored.ok()) << restored.status().ToString();
      ASSERT_EQ(Sha256Hex(*restored), Sha256Hex(body)) << "version " << v;
    }
  }
  auto info = store_->GetModel("m");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->version_count, kept.size());
  EXPECT_EQ(info->latest_version, kept.rbegin()->first);
  // A new push still deltas correctly after the deletions.
  std::string next = model.Next();
  ASSERT_TRUE(Push("m", 100, next).ok());
  EXPECT_EQ(*Restore("m", 100), next);
}

// A training job rolled back to step 3 deletes steps 4 and 5 and pushes new checkpoints under the
// same numbers: the new bodies restore, older versions are untouched.
TEST_F(CheckpointStoreTest, DeletedLatestVersionNumbersCanBePushedAgain) {
  DriftingModel model(16, 3000), rerun(17, 3000);
  std::vector<std::string> bodies;
  for (uint64_t v = 1; v <= 5; ++v) {
    bodies.push_back(model.Next());
    ASSERT_TRUE(Push("m", v, bodies.back()).ok());
  }
  ASSERT_TRUE(store_->DeleteVersion("m", 5).ok());
  ASSERT_TRUE(store_->DeleteVersion("m", 4).ok());
  EXPECT_EQ(store_->GetModel("m")->latest_version, 3u);
  std::string new4 = rerun.Next(), new5 = rerun.Next();
  ASSERT_TRUE(Push("m", 4, new4).ok());
  ASSERT_TRUE(Push("m", 5, new5).ok());
  EXPECT_EQ(*Restore("m", 4), new4);
  EXPECT_EQ(*Restore("m", 5), new5);
  for (uint64_t v = 1; v <= 3; ++v) EXPECT_EQ(*Restore("m", v), bodies[v - 1]) << v;
  Reopen();
  EXPECT_EQ(*Restore("m", 5), new5);
  EXPECT_EQ(store_->GetModel("m")->version_count, 5u);
}

TEST_F(CheckpointStoreTest, DeletingAWholeChainSegmentFreesItsChunks) {
  CodecPolicy policy;
  policy.keyframe_every = 4;
  ASSERT_TRUE(store_->SetPolicy("m", policy).ok());
  DriftingModel model(9, 3000);
  for (uint64_t v = 1; v <= 8; ++v) ASSERT_TRUE(Push("m", v, model.Next()).ok());
  const size_t before = CountChunkKeys();
  const uint64_t stored_before = store_->GetModel("m")->stored_bytes;
  for (uint64_t v = 1; v <= 4; ++v) ASSERT_TRUE(store_->DeleteVersion("m", v).ok());
  // (Shared backends remove the chunks a grace period later, for readers in flight.)
  if (testing::TestStoreIsLocal()) {
    EXPECT_LT(CountChunkKeys(), before * 3 / 4);
  }
  EXPECT_LT(store_->GetModel("m")->stored_bytes, stored_before * 3 / 4);
}

TEST_F(CheckpointStoreTest, DeleteModelRemovesEverything) {
  DriftingModel model(10, 1000);
  ASSERT_TRUE(Push("m", 1, model.Next()).ok());
  ASSERT_TRUE(store_->DeleteModel("m").ok());
  EXPECT_EQ(store_->GetModel("m").status().code(), StatusCode::kNotFound);
  if (testing::TestStoreIsLocal()) {
    EXPECT_EQ(CountChunkKeys(), 0u);  // (shared backends remove them a grace period later)
  }
  EXPECT_EQ(store_->DeleteModel("m").code(), StatusCode::kNotFound);
  ASSERT_TRUE(Push("m", 1, model.Next()).ok());  // the name can be reused
}

TEST_F(CheckpointStoreTest, CorruptedChunkIsDataLossNamingModelVersionTensor) {
  CKPT_LOCAL_BACKEND_ONLY("corrupts a chunk record in the store's RocksDB");
  DriftingModel model(11, 3000);
  ASSERT_TRUE(Push("m", 7, model.Next()).ok());
  store_.reset();
  {
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir_.str(), &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const auto& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), dir_.str(), families, &handles, &db).ok());
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != "chunks") continue;
      std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
      it->SeekToFirst();
      ASSERT_TRUE(it->Valid());
      std::string key = it->key().ToString(), value = it->value().ToString();
      value[value.size() / 2] ^= 0x40;
      it.reset();
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[i], key, value).ok());
    }
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
  Reopen();
  auto restored = Restore("m", 7);
  ASSERT_EQ(restored.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(restored.status().message().find("model 'm' version 7 tensor '"), std::string::npos)
      << restored.status().message();
}

TEST_F(CheckpointStoreTest, LargeTensorsUseBoundedChunksAndChangedChunkSizeForcesKeyframe) {
  DriftingModel model(12, 40000);
  std::string v1 = model.Next(), v2 = model.Next();
  ASSERT_TRUE(Push("m", 1, v1, 65536).ok());
  Reopen(8192);
  auto info = Push("m", 2, v2, 777);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->kind, "mixed");  // big tensors re-keyframed, small ones still deltas
  EXPECT_EQ(*Restore("m", 1), v1);
  EXPECT_EQ(*Restore("m", 2), v2);
}

// Chunks of 256 KiB and more are decoded ahead on worker threads; the body must still come out
// in order and bit-identical, also while restores of several versions interleave.
TEST_F(CheckpointStoreTest, PrefetchedRestoresOfMultiChunkTensorsAreExact) {
  Reopen(256 << 10);
  DriftingModel model(15, 600000);  // 2.4 MB weight tensor: ten 256 KiB chunks
  std::vector<std::string> bodies;
  for (uint64_t v = 1; v <= 6; ++v) {
    bodies.push_back(model.Next());
    ASSERT_TRUE(Push("m", v, bodies.back(), 300000).ok());
  }
  Reopen(256 << 10);  // cold reference cache: every chunk replays its chain
  std::vector<std::unique_ptr<RestoreStream>> streams;
  std::vector<std::string> restored(bodies.size());
  for (uint64_t v = 1; v <= bodies.size(); ++v) streams.push_back(*store_->OpenRestore("m", v));
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      auto piece = streams[i]->Next();
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      if (piece->empty()) continue;
      restored[i].append(reinterpret_cast<const char*>(piece->data()), piece->size());
      progress = true;
    }
  }
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(restored[i], bodies[i]) << i;
  // Abandoning a stream with decodes in flight is safe.
  auto abandoned = store_->OpenRestore("m", 3);
  ASSERT_TRUE(abandoned.ok());
  ASSERT_TRUE((*abandoned)->Next().ok());
  ASSERT_TRUE((*abandoned)->Next().ok());
}

TEST_F(CheckpointStoreTest, ListingsReportCountsAndSizes) {
  DriftingModel a(13, 1000), b(14, 1000);
  uint64_t raw = 0;
  for (uint64_t v = 1; v <= 3; ++v) {
    auto info = Push("a", v, a.Next());
    ASSERT_TRUE(info.ok());
    raw += info->raw_bytes;
  }
  ASSERT_TRUE(Push("b", 100, b.Next()).ok());
  auto models = store_->ListModels();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->size(), 2u);
  EXPECT_EQ((*models)[0].name, "a");
  EXPECT_EQ((*models)[0].version_count, 3u);
  EXPECT_EQ((*models)[0].raw_bytes, raw);
  EXPECT_EQ((*models)[1].latest_version, 100u);
  auto versions = store_->ListVersions("a");
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 3u);
  EXPECT_EQ((*versions)[2].version, 3u);
  EXPECT_EQ(store_->ListVersions("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->OpenRestore("a", 4).status().code(), StatusCode::kNotFound);
}

// The per-version records of a model whose layout repeats (the safetensors header, the manifest)
// are nearly equal from one version to the next; stored together they cost a fraction of their
// size. A many-tensor model whose tensors do not change measures that overhead alone.
TEST_F(CheckpointStoreTest, MetadataOfVersionsWithTheSameLayoutIsStoredCompactly) {
  const uint64_t versions = 40;
  uint64_t header_bytes = 0;
  for (uint64_t v = 1; v <= versions; ++v) {
    std::vector<testing::OwnedTensor> tensors;
    for (int layer = 0; layer < 80; ++layer) {
      tensors.push_back({"model.encoder.layers." + std::to_string(layer) + ".self_attn.out.weight",
                         DType::kF32,
                         {2, 2},
                         testing::FloatBytes({1.0f, 2.0f, 3.0f, static_cast<float>(layer)})});
    }
    const std::string body = testing::Serialize(tensors, {{"step", std::to_string(v * 30)}});
    uint64_t header_length = 0;
    std::memcpy(&header_length, body.data(), 8);
    header_bytes += 8 + header_length;
    ASSERT_TRUE(Push("m", v, body).ok());
  }
  ASSERT_TRUE(store_->Flush().ok());
  const StoreStats stats = store_->Stats();
  // Each version stores its header verbatim and a manifest of 80 tensors (more bytes than the
  // header). Coded a record at a time (4 KiB blocks) the table files held a third of the
  // headers' bytes (107 KB here); coded together, a sixth (53 KB).
  EXPECT_LT(stats.sst_bytes, header_bytes / 5) << "headers " << header_bytes;
  for (uint64_t v : {uint64_t{1}, versions}) {
    auto body = Restore("m", v);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
  }
}

// Limits: too many tensors in a checkpoint, too many models. Refusals change nothing.
TEST(CheckpointStoreLimits, TensorAndModelCountsAreEnforced) {
  testing::TempDir dir;
  StoreOptions options;
  options.data_dir = dir.str();
  options.max_tensors_per_checkpoint = 3;
  options.max_models = 2;
  testing::ApplyTestStoreBackend(options);
  auto store = CheckpointStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto push = [&](std::string_view model, const std::string& body) -> Status {
    CKPT_ASSIGN_OR_RETURN(auto session, (*store)->BeginPush(model, 1, body.size()));
    CKPT_RETURN_IF_ERROR(session->Write(Bytes(body)));
    return session->Commit().status();
  };
  DriftingModel drift(60, 100);  // four tensors
  const Status too_many = push("a", drift.Next());
  EXPECT_EQ(too_many.code(), StatusCode::kResourceExhausted) << too_many.ToString();
  EXPECT_NE(too_many.message().find("max_tensors_per_checkpoint"), std::string::npos);
  EXPECT_EQ((*store)->GetModel("a").status().code(), StatusCode::kNotFound);

  std::vector<testing::OwnedTensor> one = {
      {"w", DType::kF32, {2}, testing::FloatBytes(std::vector<float>{1, 2})}};
  ASSERT_TRUE(push("a", testing::Serialize(one)).ok());
  ASSERT_TRUE((*store)->SetPolicy("b", CodecPolicy{}).ok());
  const Status third = push("c", testing::Serialize(one));
  EXPECT_EQ(third.code(), StatusCode::kFailedPrecondition) << third.ToString();
  EXPECT_NE(third.message().find("max_models"), std::string::npos);
  EXPECT_EQ((*store)->SetPolicy("d", CodecPolicy{}).code(), StatusCode::kFailedPrecondition);
  // Existing models are not affected; deleting one makes room.
  EXPECT_TRUE((*store)->SetPolicy("a", CodecPolicy{}).ok());
  ASSERT_TRUE((*store)->DeleteModel("b").ok());
  EXPECT_TRUE(push("c", testing::Serialize(one)).ok());
}

}  // namespace
}  // namespace ckpt
