// The encoding half of a push (push_encoder.h).
#include "write/push_encoder.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace ckpt {
namespace {

std::span<const uint8_t> AsBytesOf(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

PushEncoder::PushEncoder(const StoreContext& ctx, std::string model, uint64_t seq,
                         ChainReader* reader, ManifestRecord* manifest,
                         bool hash_every_restored_chunk)
    : ctx_(ctx),
      model_(std::move(model)),
      seq_(seq),
      reader_(reader),
      manifest_(manifest),
      hash_every_restored_chunk_(hash_every_restored_chunk),
      // At most one chunk's bytes wait beyond those being encoded.
      pool_(std::make_unique<WorkerPool>(
          ctx.options->push_encoder_threads,
          (ctx.options->push_encoder_threads + 1) * ctx.options->chunk_bytes, kInlineChunkBytes)) {}

PushEncoder::~PushEncoder() { pool_.reset(); }

void PushEncoder::AddHeader(std::string_view raw_header) {
  restored_sha_.Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw_header.data()),
                                                raw_header.size()));
}

void PushEncoder::AddTensor(const TensorCoding& coding, uint32_t chunk_count) {
  tensor_codecs_.push_back(CodecFor(coding));
  restored_is_pushed_ &= !coding.lossy;
  chunk_entropy_bits_.emplace_back(chunk_count, 0.0);
}

Status PushEncoder::Submit(uint32_t tensor, uint32_t chunk, std::span<const uint8_t> data) {
  HashRestoredChunks();
  const uint64_t ordinal = body_chunks_++;
  return pool_->Submit(data, [this, tensor, chunk, ordinal](std::span<const uint8_t> bytes) {
    return EncodeChunk(tensor, chunk, ordinal, bytes);
  });
}

Result<uint64_t> PushEncoder::Finish() {
  CKPT_RETURN_IF_ERROR(pool_->Drain());
  HashRestoredChunks();
  CKPT_RETURN_IF_ERROR(hash_status_);
  for (size_t i = 0; i < manifest_->tensors.size(); ++i) {
    // In chunk order, whatever order the encoders finished in: the same sum every time.
    for (double bits : chunk_entropy_bits_[i]) manifest_->tensors[i].entropy_bits += bits;
  }
  return stored_bytes_;
}

Status PushEncoder::SubmitEncoded(uint32_t tensor, uint32_t chunk, std::string_view record,
                                  const ChunkCodingInfo& info, bool decode) {
  HashRestoredChunks();
  const uint64_t ordinal = body_chunks_++;
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(record.data()),
                                       record.size());
  return pool_->Submit(bytes,
                       [this, tensor, chunk, ordinal, info, decode](std::span<const uint8_t> copy) {
                         Status s = StoreEncodedChunk(tensor, chunk, ordinal, copy, info, decode);
                         if (s.code() == StatusCode::kInvalidArgument) {
                           std::lock_guard lock(accounting_mu_);
                           if (!refused_chunk_) refused_chunk_.emplace(tensor, chunk);
                         }
                         return s;
                       });
}

Result<std::span<const uint8_t>> PushEncoder::ReferenceOf(const ManifestTensor& t, uint32_t chunk,
                                                          ReferenceCache::Chunk* cached,
                                                          std::vector<uint8_t>* decoded) {
  *cached = ctx_.cache->Get(model_, t.base_seq, t.base_tensor, chunk);
  if (*cached) {
    // Consumed: the new version's chunk replaces it as the reference, and demoting it now
    // keeps the LRU from evicting reference chunks this push still needs. (Evicted under a
    // race, a reference is decoded from the chain below.)
    ctx_.cache->Demote(model_, t.base_seq, t.base_tensor, chunk);
    return std::span<const uint8_t>(**cached);
  }
  CKPT_RETURN_IF_ERROR(reader_->DecodeChunk(t.base_seq, t.base_tensor, chunk, decoded));
  return std::span<const uint8_t>(*decoded);
}

void PushEncoder::Account(uint32_t tensor, CodecId codec_id, const ChunkCodingInfo& info,
                          uint64_t stored_bytes) {
  std::lock_guard lock(accounting_mu_);
  stored_bytes_ += stored_bytes;
  ManifestTensor& entry = manifest_->tensors[tensor];
  if (codec_id == CodecId::kLossyQuantized) entry.codec_id = static_cast<uint16_t>(codec_id);
  entry.stored_bytes += stored_bytes;
  entry.quantizer = std::max(entry.quantizer, info.quantizer);
  entry.bound = std::max(entry.bound, info.bound);
  entry.exact_elements += info.exact_elements;
}

void PushEncoder::KeepRestored(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                               ReferenceCache::Chunk restored) {
  if (!restored_is_pushed_ || hash_every_restored_chunk_) {
    std::lock_guard lock(unhashed_mu_);
    unhashed_.emplace(ordinal, Restored{tensor, chunk, restored});
  }
  ctx_.cache->Put(model_, seq_, tensor, chunk, std::move(restored));
}

// Encodes chunk `chunk` of tensor `tensor` (the body's chunk number `ordinal`) against its
// reference, stores it and accounts for it. Runs on an encoder thread, concurrently with
// other chunks of the body (storage.push_encoder_threads), or inline.
Status PushEncoder::EncodeChunk(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                                std::span<const uint8_t> data) {
  const ManifestTensor& t = manifest_->tensors[tensor];
  std::optional<std::span<const uint8_t>> reference;
  ReferenceCache::Chunk cached;
  std::vector<uint8_t> decoded;
  if (t.kind == FrameKind::kDelta) {
    CKPT_ASSIGN_OR_RETURN(reference, ReferenceOf(t, chunk, &cached, &decoded));
  }
  const TensorCodec* codec = tensor_codecs_[tensor];
  const auto encode_start = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(EncodedChunk encoded, codec->Encode(t.dtype, data, reference));
  ctx_.counters->encode_ns.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - encode_start)
                                .count()),
      std::memory_order_relaxed);
  // What a restore will produce: the input itself, or the lossy reconstruction.
  const std::span<const uint8_t> restored =
      encoded.reconstruction_is_input ? data : std::span<const uint8_t>(encoded.reconstruction);
  const std::string value = ChunkRecord::EncodeChunk(encoded, t.kind, restored);
  CKPT_RETURN_IF_ERROR(ctx_.backend->PutChunk(model_, seq_, tensor, chunk, value));
  if (restored_is_pushed_ && !encoded.reconstruction_is_input) {
    return Status::Internal("push: the lossless codec changed chunk " + std::to_string(chunk) +
                            " of tensor '" + t.name + "'");
  }
  chunk_entropy_bits_[tensor][chunk] = encoded.info.model_entropy_bits;  // this chunk's slot
  Account(tensor, encoded.codec_id, encoded.info, value.size());
  KeepRestored(
      tensor, chunk, ordinal,
      encoded.reconstruction_is_input
          ? std::make_shared<const std::vector<uint8_t>>(data.begin(), data.end())
          : std::make_shared<const std::vector<uint8_t>>(std::move(encoded.reconstruction)));
  return Status::Ok();
}

// Checks, decodes (with `decode`), stores and accounts for one chunk a client encoded. Runs
// where EncodeChunk does.
Status PushEncoder::StoreEncodedChunk(uint32_t tensor, uint32_t chunk, uint64_t ordinal,
                                      std::span<const uint8_t> record_bytes,
                                      const ChunkCodingInfo& info, bool decode) {
  const ManifestTensor& t = manifest_->tensors[tensor];
  const std::string_view value(reinterpret_cast<const char*>(record_bytes.data()),
                               record_bytes.size());
  CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(value));
  std::shared_ptr<std::vector<uint8_t>> restored;
  if (decode) {
    std::optional<std::span<const uint8_t>> reference;
    ReferenceCache::Chunk cached;
    std::vector<uint8_t> decoded;
    if (t.kind == FrameKind::kDelta) {
      CKPT_ASSIGN_OR_RETURN(reference, ReferenceOf(t, chunk, &cached, &decoded));
    }
    CKPT_ASSIGN_OR_RETURN(const TensorCodec* codec, CodecForDecoding(record.codec_id));
    restored = std::make_shared<std::vector<uint8_t>>(record.raw_length);
    const Status s = codec->Decode(t.dtype, AsBytesOf(record.payload), reference, *restored);
    const std::string where =
        "encoded push: chunk " + std::to_string(chunk) + " of tensor '" + t.name + "'";
    if (!s.ok()) {
      // Its checksum held: a delta that does not decode was coded against another reference
      // (the lossy coder's contexts come from it).
      if (t.kind == FrameKind::kDelta) {
        return Status::ReferenceDrifted(
            where + " does not decode against the base's reconstruction (" + s.message() +
            "): the client's reference is not the base's reconstruction; pull the base version "
            "and push again");
      }
      return Status::InvalidArgument(where + " does not decode: " + s.message());
    }
    if (Xxh3Checksum(*restored) != record.raw_checksum) {
      if (t.kind == FrameKind::kDelta) {
        return Status::ReferenceDrifted(
            where +
            " decodes to other bytes than the client reconstructed: the client's reference is "
            "not the base's reconstruction; pull the base version and push again");
      }
      return Status::InvalidArgument(where +
                                     " decodes to other bytes than the client reconstructed");
    }
  }
  CKPT_RETURN_IF_ERROR(ctx_.backend->PutChunk(model_, seq_, tensor, chunk, value));
  chunk_entropy_bits_[tensor][chunk] = info.model_entropy_bits;  // this chunk's slot
  Account(tensor, static_cast<CodecId>(record.codec_id), info, value.size());
  if (restored) KeepRestored(tensor, chunk, ordinal, std::move(restored));
  return Status::Ok();
}

// Adds to restored_sha_ the reconstructions the encoders have finished that continue the body
// where the last call stopped (a chunk finished out of order waits for the ones before it). On
// the owner's thread, which has time to spare while the encoders work.
void PushEncoder::HashRestoredChunks() {
  std::vector<Restored> chunks;
  {
    std::lock_guard lock(unhashed_mu_);
    for (auto it = unhashed_.begin(); it != unhashed_.end() && it->first == next_to_hash_;
         it = unhashed_.erase(it), ++next_to_hash_) {
      chunks.push_back(std::move(it->second));
    }
  }
  for (Restored& r : chunks) {
    const ManifestTensor& t = manifest_->tensors[r.tensor];
    if (t.tile_counts.empty()) {
      restored_sha_.Update(*r.bytes);
      continue;
    }
    // A tiled tensor's chunks are not runs of the body: it is hashed once all are in, put
    // back in row-major order.
    tile_chunks_.push_back(std::move(r.bytes));
    if (r.chunk + 1 < t.chunk_count) continue;
    auto grid = t.Grid();
    if (!grid.ok()) {  // the planner made the grid: a digest of what is not the body must fail
      hash_status_ = grid.status();
      tile_chunks_.clear();
      continue;
    }
    std::vector<uint8_t> body(t.byte_size);
    const TensorBox whole = WholeBox(t.shape);
    const size_t element = DTypeSize(t.dtype);
    for (uint32_t c = 0; c < tile_chunks_.size(); ++c) {
      CopyChunkToBox(*grid, whole, c, element, *tile_chunks_[c], body);
    }
    restored_sha_.Update(body);
    tile_chunks_.clear();
  }
}

// The store's lossless codec, or a lossy codec for the tensor's options.
const TensorCodec* PushEncoder::CodecFor(const TensorCoding& coding) {
  if (!coding.lossy) return ctx_.codec;
  for (const auto& [options, codec] : lossy_codecs_) {
    if (options == coding.lossy_options) {
      return codec.get();
    }
  }
  lossy_codecs_.emplace_back(coding.lossy_options, NewLossyCodec(coding.lossy_options));
  return lossy_codecs_.back().second.get();
}

}  // namespace ckpt
