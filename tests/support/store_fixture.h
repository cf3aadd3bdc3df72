// CheckpointStoreTest: a GoogleTest fixture owning a CheckpointStore in a temporary directory,
// with helpers to push, restore and reopen. Shared by the storage tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/codec/encoded_pull.h"
#include "ckpt/storage/checkpoint_store.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt::testing {

inline std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Where the storage tests' stores keep their data. Unset (the default), in their data
// directory; the store suite's runs on RADOS and S3 (tests/ceph/store_suite_backend.cc) set it
// to add StoreOptions::cluster or StoreOptions::s3, a place of its own for each data directory.
// Every store a test opens goes through ApplyTestStoreBackend.
inline std::function<void(StoreOptions&)>& TestStoreBackend() {
  static std::function<void(StoreOptions&)> backend;
  return backend;
}
inline void ApplyTestStoreBackend(StoreOptions& options) {
  if (TestStoreBackend()) TestStoreBackend()(options);
}

// Whether the stores are on the local backend (data and metadata in their data directory).
inline bool TestStoreIsLocal() { return !TestStoreBackend(); }
// Whether sharded uploads are spooled in the data directory (local and S3 stores: every backend
// but RADOS, which spools in the pool).
inline bool TestSpoolInDataDir() {
  StoreOptions options;
  ApplyTestStoreBackend(options);
  return !options.cluster;
}

// In a test of what the local backend alone does (its RocksDB files, its backup): skips the test
// when the suite runs on another backend, saying why.
#define CKPT_LOCAL_BACKEND_ONLY(why)                                              \
  do {                                                                            \
    if (!::ckpt::testing::TestStoreIsLocal()) GTEST_SKIP() << "local only: " why; \
  } while (0)

// A codec policy from its JSON (a test's literal: a parse error fails the test).
inline CodecPolicy LossyPolicy(std::string_view json) {
  auto policy = CodecPolicy::FromJson(json, CodecPolicy{});
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return *policy;
}

// A lossless policy whose chains outlast a test's pushes (the default restarts them every
// CodecPolicy::kLosslessKeyframeEvery versions), for tests of what long chains do.
inline constexpr const char* kLongLosslessChains = R"({"mode":"lossless","keyframe_every":16})";

// Everything `stream` sends, which must be the size it announced.
inline Result<std::string> ReadAll(RestoreStream& stream) {
  std::string out;
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(auto piece, stream.Next());
    if (piece.empty()) break;
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  EXPECT_EQ(out.size(), stream.size());
  return out;
}

// What a client decodes from an encoded pull `body` fed in pieces of `piece` bytes, on
// `threads` threads, holding `held` (null: nothing); whether it was a whole version's body
// into `whole_version` when given.
inline Result<std::string> DecodeEncodedPull(std::string_view body, const CheckpointView* held,
                                             int threads, size_t piece,
                                             bool* whole_version = nullptr) {
  std::string out;
  EncodedPullDecoder decoder(
      held,
      [&](std::string_view bytes) {
        out.append(bytes);
        return Status::Ok();
      },
      threads);
  for (size_t off = 0; off < body.size(); off += piece) {
    CKPT_RETURN_IF_ERROR(decoder.Feed(Bytes(body.substr(off, piece))));
  }
  CKPT_RETURN_IF_ERROR(decoder.Finish());
  if (whole_version != nullptr) *whole_version = decoder.whole_version();
  return out;
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  // Sets the codec policy of `model` from its JSON form.
  void SetCodecPolicy(std::string_view model, std::string_view json) {
    auto policy = CodecPolicy::FromJson(json, CodecPolicy{});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    ASSERT_TRUE(store_->SetPolicy(model, *policy).ok());
  }

  void Reopen(uint64_t chunk_bytes = 4096,
              uint64_t reference_cache_bytes = StoreOptions{}.reference_cache_bytes) {
    store_.reset();
    StoreOptions options;
    options.data_dir = dir_.str();
    options.chunk_bytes = chunk_bytes;  // small chunks: every tensor spans several
    options.reference_cache_bytes = reference_cache_bytes;
    options.min_free_bytes = 0;  // the reserve has tests of its own (fault_injection_test.cc)
    ApplyTestStoreBackend(options);
    auto opened = CheckpointStore::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
  }

  Result<VersionInfo> Push(std::string_view model, uint64_t version, std::string_view body,
                           size_t piece = 1000) {
    CKPT_ASSIGN_OR_RETURN(auto session, store_->BeginPush(model, version, body.size()));
    for (size_t off = 0; off < body.size(); off += piece) {
      CKPT_RETURN_IF_ERROR(session->Write(Bytes(body.substr(off, piece))));
    }
    return session->Commit();
  }

  // Pushes versions first..last of `drift` as model "m", appending each pushed body to `bodies`.
  void PushVersions(DriftingModel& drift, uint64_t first, uint64_t last,
                    std::vector<std::string>* bodies) {
    for (uint64_t v = first; v <= last; ++v) {
      bodies->push_back(drift.Next());
      auto info = Push("m", v, bodies->back());
      ASSERT_TRUE(info.ok()) << "version " << v << ": " << info.status().ToString();
    }
  }

  // The whole version, or the part `selection` names.
  Result<std::string> Restore(std::string_view model, std::optional<uint64_t> version,
                              const RestoreSelection& selection = {}) {
    CKPT_ASSIGN_OR_RETURN(auto stream, store_->OpenRestore(model, version, selection));
    return ReadAll(*stream);
  }

  // Number of chunk records stored, read directly from RocksDB (store closed first).
  size_t CountChunkKeys() {
    store_.reset();
    const size_t count = testing::CountKeys(dir_.str(), "chunks");
    Reopen();
    return count;
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

}  // namespace ckpt::testing
