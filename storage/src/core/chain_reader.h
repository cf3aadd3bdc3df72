// ChainReader: decodes chunks of a model's stored versions by walking their delta chains.
//
// A chunk at manifest `seq` is either a keyframe or a delta against the same chunk at its
// base manifest; decoding replays the chain from the keyframe forward, verifying the payload and
// the decoded-bytes checksum of every link. Reads go through an optional RocksDB snapshot.
//
// Thread-safe: one reader per push or restore; it caches the manifests it has read (std::map
// nodes are stable, so returned pointers stay valid), and DecodeChunk may run concurrently for
// different chunks (restores prefetch).
#pragma once

#include <rocksdb/db.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/store_backend.h"
#include "ckpt/codec/status.h"
#include "core/reference_cache.h"
#include "core/rocks_status.h"
#include "records/records.h"

namespace ckpt {

class ChainReader {
 public:
  ChainReader(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* manifests, StoreBackend* backend,
              const rocksdb::Snapshot* snapshot, std::string model, ReferenceCache* cache,
              uint64_t cache_generation = ReferenceCache::kAnyGeneration);

  // The manifest at `seq` (NotFound/DataLoss on failure). The pointer stays valid for the
  // reader's lifetime.
  Result<const ManifestRecord*> Manifest(uint64_t seq);

  // Decodes chunk `chunk` of tensor `tensor` of manifest `seq` into `out` (resized).
  // Errors name the model, version and tensor.
  Status DecodeChunk(uint64_t seq, uint32_t tensor, uint32_t chunk, std::vector<uint8_t>* out);

  // As DecodeChunk, into a shared buffer: a chunk the cache holds comes back as the cache's own
  // buffer, without a copy (restores send it, and cache what they decode, without copying).
  Status DecodeSharedChunk(uint64_t seq, uint32_t tensor, uint32_t chunk,
                           ReferenceCache::Chunk* out);

  // Stored payloads decoded so far (keyframes and deltas; a link found in the cache costs none).
  uint64_t links_decoded() const { return links_decoded_.load(std::memory_order_relaxed); }

  // Byte length of chunk `chunk` of `t`.
  static uint64_t ChunkLength(const ManifestTensor& t, uint32_t chunk);

  // Longest chain a decode follows before reporting corruption (a cycle). keyframe_every is at
  // most 1024, so no valid chain comes near it.
  static constexpr size_t kMaxChainLinks = 4096;

 private:
  // DecodeChunk into `out`; with `shared` non-null, a cache hit goes to *shared instead (and
  // `out` is left alone).
  Status Decode(uint64_t seq, uint32_t tensor, uint32_t chunk, std::vector<uint8_t>* out,
                ReferenceCache::Chunk* shared);

  rocksdb::DB* db_;
  rocksdb::ColumnFamilyHandle* manifests_;
  StoreBackend* backend_;
  rocksdb::ReadOptions read_options_;        // manifests
  rocksdb::ReadOptions chunk_read_options_;  // chunk records: their own checksums are checked
  std::string model_;
  ReferenceCache* cache_;
  // The cache's generation when the snapshot was taken: once a model has been dropped whole
  // since, the cache may hold chunks of a new model under the same seqs, and is not read.
  const uint64_t cache_generation_;
  std::mutex mu_;
  std::map<uint64_t, ManifestRecord> manifests_by_seq_;  // guarded by mu_
  std::atomic<uint64_t> links_decoded_{0};
};

}  // namespace ckpt
