// ChainReader: decodes chunks of a model's stored versions by walking their delta chains.
//
// A chunk at manifest `seq` is either a keyframe or a delta against the same chunk at its
// base manifest; decoding replays the chain from the keyframe forward, verifying the payload and
// the decoded-bytes checksum of every link. Reads go through an optional RocksDB snapshot.
// A replay stops at the newest link the reference cache holds; with a neighbour set, a chunk can
// also be reached from the other side, one symmetric delta away (SetNeighbour).
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
#include "ckpt/base/status.h"
#include "context/reference_cache.h"
#include "engine/rocks_status.h"
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

  // A manifest that may be stored as deltas against the ones this reader decodes: the version
  // just older than a restored one, which a rearranged (reverse) chain stores against it. Where
  // that manifest's chunk is cached and its delta runs both ways (lossless XOR deltas:
  // TensorCodec::DeltasAreSymmetric), a chunk is decoded from it with one link instead of a walk
  // from the keyframe, so restoring a reverse chain's versions oldest first costs one decode
  // per chunk, as newest first does. Call before decoding; 0 (the default) sets none.
  void SetNeighbour(uint64_t seq) { neighbour_seq_ = seq; }

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
  // Decodes the chunk from the neighbour's cached chunk and its symmetric delta into `out`, when
  // the neighbour offers that; false (and `out` untouched) when it does not, or when the step's
  // result fails the target's checksum (the walk from the keyframe then decides).
  Result<bool> StepFromNeighbour(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                 std::vector<uint8_t>* out);
  // The neighbour's tensor index stored as a delta against tensor `tensor` of manifest `seq`
  // (the neighbour's own base), or -1.
  Result<int64_t> NeighbourTensorFor(uint64_t seq, uint32_t tensor);

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
  uint64_t neighbour_seq_ = 0;                           // set before decoding
  // The neighbour's delta tensors by their base (seq, tensor index).
  std::map<std::pair<uint64_t, uint32_t>, uint32_t> neighbour_tensors_;  // guarded by mu_
  bool neighbour_indexed_ = false;                                       // guarded by mu_
  std::atomic<uint64_t> links_decoded_{0};
};

}  // namespace ckpt
