// PushEncoder: the encoding half of a push. Each complete chunk of the body is encoded against
// its reference (the previous reconstruction: from the reference cache, or decoded from the
// chain), stored through the backend and accounted for in the push's manifest, on
// storage.push_encoder_threads threads while the connection's thread receives the next bytes;
// the reconstructions a restore will send are hashed in body order. Internal to storage/.
//
// Thread safety: Submit, Finish and the destructor are called by the push's owner, never
// concurrently; the encoding jobs synchronize among themselves.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/base/hashing.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "ckpt/storage/codec_policy.h"
#include "context/reference_cache.h"
#include "context/store_context.h"
#include "read/chain_reader.h"
#include "records/records.h"
#include "write/worker_pool.h"

namespace ckpt {

class PushEncoder {
 public:
  // Encodes into manifest `seq` of `model`; `manifest` (whose tensors AddTensor describes) and
  // `reader` must outlive the encoder. `hash_every_restored_chunk`: the restored body is hashed
  // even when every tensor is lossless (an encoded push has no pushed body to hash instead).
  PushEncoder(const StoreContext& ctx, std::string model, uint64_t seq, ChainReader* reader,
              ManifestRecord* manifest, bool hash_every_restored_chunk = false);
  // Waits for the chunks being encoded; drops the queued ones.
  ~PushEncoder();

  // The body's header: the start of what a restore sends.
  void AddHeader(std::string_view raw_header);
  // The next tensor of the body (in manifest order) and how it is coded.
  void AddTensor(const TensorCoding& coding, uint32_t chunk_count);

  // Queues chunk `chunk` of tensor `tensor` (the next chunk of the body).
  Status Submit(uint32_t tensor, uint32_t chunk, std::span<const uint8_t> data);
  // Queues the next chunk of an encoded push: `record`, a ChunkRecord the client encoded (its
  // plan checked by the caller), stored as it is. With `decode`, it is first decoded against the
  // store's reference and must restore to the bytes the record says (then the restored body is
  // hashed and the reference cache keeps the chunk); `info` is what the client's encoder reported.
  Status SubmitEncoded(uint32_t tensor, uint32_t chunk, std::string_view record,
                       const ChunkCodingInfo& info, bool decode);

  // After the last chunk: waits for every job, then completes the manifest's per-tensor
  // figures. Returns the stored bytes of the chunks.
  Result<uint64_t> Finish();

  // The first chunk a client encoded that was refused (its tensor and chunk), if one was.
  std::optional<std::pair<uint32_t, uint32_t>> refused_chunk() {
    std::lock_guard lock(accounting_mu_);
    return refused_chunk_;
  }

  // Every tensor is coded losslessly: a restore sends the pushed body itself.
  bool restored_is_pushed() const { return restored_is_pushed_; }
  // The SHA-256 of the body a restore sends (after Finish; only when !restored_is_pushed() or
  // with hash_every_restored_chunk, and for encoded chunks only those decoded).
  std::string RestoredSha256Hex() { return restored_sha_.FinishHex(); }

 private:
  // Encodes, stores and accounts for one chunk; on an encoder thread or inline.
  Status EncodeChunk(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                     std::span<const uint8_t> data);
  // SubmitEncoded's job.
  Status StoreEncodedChunk(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                           std::span<const uint8_t> record_bytes, const ChunkCodingInfo& info,
                           bool decode);
  // The reconstruction `chunk` of delta tensor `t` is coded against, into `cached` (the
  // reference cache's copy) or `decoded`.
  Result<std::span<const uint8_t>> ReferenceOf(const ManifestTensor& t, uint32_t chunk,
                                               ReferenceCache::Chunk* cached,
                                               std::vector<uint8_t>* decoded);
  // Adds a stored chunk of `stored_bytes` to the manifest's figures.
  void Account(uint32_t tensor, CodecId codec_id, const ChunkCodingInfo& info,
               uint64_t stored_bytes);
  // Keeps a restored chunk for hashing (when the restored body is hashed) and in the cache.
  void KeepRestored(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                    ReferenceCache::Chunk restored);
  // Hashes the finished reconstructions that continue the body where the last call stopped.
  void HashRestoredChunks();
  // The codec of a tensor (one lossy codec per distinct options in this push).
  const TensorCodec* CodecFor(const TensorCoding& coding);

  // Chunks smaller than this are encoded on the owner's thread when the encoder is idle.
  static constexpr size_t kInlineChunkBytes = 16 << 10;

  const StoreContext& ctx_;
  const std::string model_;
  const uint64_t seq_;
  ChainReader* const reader_;
  ManifestRecord* const manifest_;
  std::vector<std::pair<LossyCodecOptions, std::unique_ptr<TensorCodec>>> lossy_codecs_;
  std::vector<const TensorCodec*> tensor_codecs_;  // per tensor of the body
  bool restored_is_pushed_ = true;
  const bool hash_every_restored_chunk_;
  // Of the body a restore will send: the header, then the chunks' reconstructions in body order.
  Sha256 restored_sha_;
  uint64_t body_chunks_ = 0;  // chunks submitted, over all tensors
  // Per tensor and chunk, written by EncodeChunk (each chunk its own slot), summed by Finish.
  std::vector<std::vector<double>> chunk_entropy_bits_;
  std::mutex accounting_mu_;  // guards stored_bytes_ and manifest_'s per-tensor figures
  uint64_t stored_bytes_ = 0;
  std::optional<std::pair<uint32_t, uint32_t>> refused_chunk_;  // guarded by accounting_mu_
  std::mutex unhashed_mu_;
  struct Restored {
    uint32_t tensor = 0;
    uint32_t chunk = 0;
    ReferenceCache::Chunk bytes;
  };
  // Finished reconstructions not hashed yet, by body chunk number; guarded by unhashed_mu_.
  std::map<uint64_t, Restored> unhashed_;
  // The chunks of the tiled tensor being hashed, in order (HashRestoredChunks' own).
  std::vector<ReferenceCache::Chunk> tile_chunks_;
  Status hash_status_;         // a tiled tensor whose grid was no grid (HashRestoredChunks' own)
  uint64_t next_to_hash_ = 0;  // the body chunk number HashRestoredChunks hashes next
  // Last member: destroyed (its jobs joined) before everything they use.
  std::unique_ptr<WorkerPool> pool_;
};

}  // namespace ckpt
