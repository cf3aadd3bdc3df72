// StoreContext: the RocksDB handles, the backend and shared objects every part of the store works
// with (pushes, restores, deletion, garbage collection). Internal to the storage library.
//
// Owned by the store; the pointers stay valid for the store's lifetime. Thread-safe to share:
// every member is either immutable after open or itself thread-safe.
#pragma once

#include <rocksdb/db.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "backends/store_backend.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/tensor_codec.h"
#include "ckpt/storage/checkpoint_store.h"
#include "context/reference_cache.h"
#include "context/since_delta_cache.h"
#include "engine/rocks_status.h"
#include "ckpt/base/wall_clock.h"
#include "engine/store_health.h"

namespace ckpt {

// Cumulative counters of an open store (reported by CheckpointStore::Stats). Lock-free,
// relaxed order: monitoring figures, never used for decisions.
struct StoreCounters {
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> push_raw_bytes{0};
  std::atomic<uint64_t> push_stored_bytes{0};
  std::atomic<uint64_t> encode_ns{0};
  std::atomic<uint64_t> versions_deleted{0};
  std::atomic<uint64_t> retention_versions_deleted{0};
  std::atomic<uint64_t> retention_tensors_dropped{0};
  std::atomic<uint64_t> gc_bytes_freed{0};
  std::atomic<uint64_t> gc_versions_rebased{0};
  std::atomic<uint64_t> rearrangements{0};
  std::atomic<uint64_t> restores{0};
  std::atomic<uint64_t> restore_links_decoded{0};
  std::atomic<uint64_t> pull_chunks_coded{0};
};

// Everything a push, restore or maintenance task needs from the store, owned by the store.
// The metadata families' handles are its MetadataFamilies members (ctx.models, ...).
struct StoreContext : MetadataFamilies {
  rocksdb::DB* db = nullptr;
  rocksdb::ColumnFamilyHandle* chunks = nullptr;  // the local backend's chunk records
  // Serializes tag changes with the deletions and pushes that must see them (taken after a
  // model lock, never before).
  std::mutex* tags_mu = nullptr;
  // Where chunk records live and how metadata changes commit.
  StoreBackend* backend = nullptr;
  ReferenceCache* cache = nullptr;
  // Deltas coded for followers (read/encoded_restore.cc).
  SinceDeltaCache* since_deltas = nullptr;
  const TensorCodec* codec = nullptr;
  const StoreOptions* options = nullptr;
  StoreCounters* counters = nullptr;
  // Whether writes are taken: every change checks it first.
  StoreHealth* health = nullptr;

  template <typename Record>
  Result<std::optional<Record>> GetRecord(const rocksdb::ReadOptions& ro,
                                          rocksdb::ColumnFamilyHandle* cf, const std::string& key,
                                          std::string_view what) const {
    std::string value;
    rocksdb::Status s = db->Get(ro, cf, key, &value);
    if (s.IsNotFound()) return std::optional<Record>();
    CKPT_RETURN_IF_ERROR(FromRocks(s, what));
    auto decoded = Record::DecodeFrom(value);
    if (!decoded.ok()) return decoded.status().WithContext(what);
    return std::optional<Record>(std::move(decoded).value());
  }
};

}  // namespace ckpt
