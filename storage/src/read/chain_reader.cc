#include "read/chain_reader.h"

#include <algorithm>

#include "ckpt/base/hashing.h"
#include "ckpt/codec/tensor_codec.h"
#include "records/keys.h"

namespace ckpt {

ChainReader::ChainReader(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* manifests,
                         StoreBackend* backend, const rocksdb::Snapshot* snapshot,
                         std::string model, ReferenceCache* cache, uint64_t cache_generation)
    : db_(db),
      manifests_(manifests),
      backend_(backend),
      model_(std::move(model)),
      cache_(cache),
      cache_generation_(cache_generation) {
  read_options_.snapshot = snapshot;
  read_options_.verify_checksums = true;
  // Every chunk record carries XXH3 checksums of its payload and of the decoded bytes, checked
  // on every link: RocksDB's own CRC of each blob would check the same bytes again, at several
  // times the cost (scrub still has RocksDB verify every record it reads).
  chunk_read_options_ = read_options_;
  chunk_read_options_.verify_checksums = false;
}

Result<const ManifestRecord*> ChainReader::Manifest(uint64_t seq) {
  {
    std::lock_guard lock(mu_);
    auto it = manifests_by_seq_.find(seq);
    if (it != manifests_by_seq_.end()) return &it->second;
  }
  std::string value;
  CKPT_RETURN_IF_ERROR(
      FromRocks(db_->Get(read_options_, manifests_, storage_keys::ManifestKey(model_, seq), &value),
                "model '" + model_ + "' manifest " + std::to_string(seq)));
  auto decoded = ManifestRecord::DecodeFrom(value);
  if (!decoded.ok()) {
    return decoded.status().WithContext("model '" + model_ + "' manifest " + std::to_string(seq));
  }
  std::lock_guard lock(mu_);
  auto [pos, inserted] = manifests_by_seq_.emplace(seq, std::move(decoded).value());
  return &pos->second;
}

uint64_t ChainReader::ChunkLength(const ManifestTensor& t, uint32_t chunk) {
  return ChunkLengthOf(t.byte_size, t.chunk_bytes, t.tile_counts, chunk);
}

Status ChainReader::DecodeChunk(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                std::vector<uint8_t>* out) {
  return Decode(seq, tensor, chunk, out, nullptr);
}

Status ChainReader::DecodeSharedChunk(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                      ReferenceCache::Chunk* out) {
  out->reset();
  std::vector<uint8_t> decoded;
  CKPT_RETURN_IF_ERROR(Decode(seq, tensor, chunk, &decoded, out));
  if (!*out) *out = std::make_shared<const std::vector<uint8_t>>(std::move(decoded));
  return Status::Ok();
}

Result<int64_t> ChainReader::NeighbourTensorFor(uint64_t seq, uint32_t tensor) {
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* neighbour, Manifest(neighbour_seq_));
  std::lock_guard lock(mu_);
  if (!neighbour_indexed_) {
    neighbour_indexed_ = true;
    for (uint32_t i = 0; i < neighbour->tensors.size(); ++i) {
      const ManifestTensor& e = neighbour->tensors[i];
      if (e.kind == FrameKind::kDelta) neighbour_tensors_[{e.base_seq, e.base_tensor}] = i;
    }
  }
  auto it = neighbour_tensors_.find({seq, tensor});
  return it == neighbour_tensors_.end() ? int64_t{-1} : int64_t{it->second};
}

Result<bool> ChainReader::StepFromNeighbour(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                            std::vector<uint8_t>* out) {
  if (!cache_ || neighbour_seq_ == 0 || neighbour_seq_ == seq) return false;
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, Manifest(seq));
  if (tensor >= m->tensors.size()) return false;  // the walk names the problem
  const ManifestTensor& target = m->tensors[tensor];
  if (target.kind == FrameKind::kKeyframe || chunk >= target.chunk_count) return false;
  // A neighbour that cannot be read is one that offers nothing (restoring it reports why).
  auto neighbour_tensor = NeighbourTensorFor(seq, tensor);
  if (!neighbour_tensor.ok() || *neighbour_tensor < 0) return false;
  const auto found = static_cast<uint32_t>(*neighbour_tensor);
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* neighbour, Manifest(neighbour_seq_));
  const ManifestTensor& from = neighbour->tensors[found];
  const uint64_t length = ChunkLength(target, chunk);
  if (from.dtype != target.dtype || chunk >= from.chunk_count ||
      from.tile_counts != target.tile_counts || ChunkLength(from, chunk) != length) {
    return false;
  }
  ReferenceCache::Chunk cached =
      cache_->Get(model_, neighbour_seq_, found, chunk, cache_generation_);
  if (!cached || cached->size() != length) return false;
  // The neighbour's delta and the target's own record, whose checksum the result must match.
  // The step only saves work: anything it cannot read or decode leaves the chunk to the walk,
  // which reports what is wrong with the target's own chain.
  std::vector<rocksdb::PinnableSlice> values;
  const std::vector<StoreBackend::ChunkAddress> addresses = {{neighbour_seq_, found, chunk},
                                                             {seq, tensor, chunk}};
  if (!backend_->GetChunks(chunk_read_options_, model_, addresses, &values).ok()) return false;
  auto delta = ChunkRecord::DecodeFrom(values[0].ToStringView());
  auto own = ChunkRecord::DecodeFrom(values[1].ToStringView());
  if (!delta.ok() || !own.ok() || delta->kind != FrameKind::kDelta || delta->raw_length != length ||
      own->raw_length != length) {
    return false;
  }
  auto codec = CodecForDecoding(delta->codec_id);
  if (!codec.ok() || !(*codec)->DeltasAreSymmetric()) return false;
  std::unique_ptr<ChainDecoder> decoder = (*codec)->NewChainDecoder(target.dtype, length);
  std::vector<uint8_t> stepped;
  if (!decoder->StartFromDecoded(*cached).ok() ||
      !decoder
           ->ApplyDelta(std::span<const uint8_t>(
               reinterpret_cast<const uint8_t*>(delta->payload.data()), delta->payload.size()))
           .ok() ||
      !decoder->Finish(&stepped).ok()) {
    return false;
  }
  links_decoded_.fetch_add(1, std::memory_order_relaxed);
  if (Xxh3Checksum(stepped) != own->raw_checksum) return false;
  *out = std::move(stepped);
  return true;
}

Status ChainReader::Decode(uint64_t seq, uint32_t tensor, uint32_t chunk, std::vector<uint8_t>* out,
                           ReferenceCache::Chunk* shared) {
  if (neighbour_seq_ != 0 && cache_ && !cache_->Contains(model_, seq, tensor, chunk)) {
    CKPT_ASSIGN_OR_RETURN(bool stepped, StepFromNeighbour(seq, tensor, chunk, out));
    if (stepped) return Status::Ok();
  }
  struct Link {
    uint64_t seq;
    uint32_t tensor;
    const ManifestTensor* entry;
  };
  std::vector<Link> chain;
  ReferenceCache::Chunk cached;
  uint64_t s = seq;
  uint32_t t = tensor;
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, Manifest(s));
    if (t >= m->tensors.size()) {
      return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                              ": delta base tensor index " + std::to_string(t) + " out of range");
    }
    const ManifestTensor& e = m->tensors[t];
    if (chunk >= e.chunk_count) {
      return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                              " tensor '" + e.name + "': chunk " + std::to_string(chunk) +
                              " out of range");
    }
    if (cache_) cached = cache_->Get(model_, s, t, chunk, cache_generation_);
    chain.push_back({s, t, &e});
    if (cached || e.kind == FrameKind::kKeyframe) break;
    // Bases usually precede their deltas, but a garbage-collection rebase gives a kept version a
    // new, higher seq; so guard against cycles by length (chains are bounded by keyframe_every).
    if (chain.size() > kMaxChainLinks) {
      return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                              " tensor '" + e.name + "': delta chain longer than " +
                              std::to_string(kMaxChainLinks) + " links (cyclic?)");
    }
    s = e.base_seq;
    t = e.base_tensor;
  }

  const ManifestTensor& target = *chain.front().entry;
  if (cached && chain.size() == 1) {
    if (shared) {
      *shared = std::move(cached);
    } else {
      *out = *cached;
    }
    return Status::Ok();
  }
  const uint64_t length = ChunkLength(target, chunk);
  // The stored links, oldest first, read a window at a time (concurrently where the backend can)
  // so that a chain costs few round trips while memory stays bounded.
  const size_t read_window = std::max<size_t>(1, backend_->ReadWindow());
  std::vector<StoreBackend::ChunkAddress> stored;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (it == chain.rbegin() && cached) continue;
    stored.push_back({it->seq, it->tensor, chunk});
  }
  std::vector<rocksdb::PinnableSlice> window;
  size_t window_begin = 0, next_stored = 0;
  std::vector<uint8_t> materialized;  // a reconstruction the decoder started from (codec change)
  std::unique_ptr<ChainDecoder> decoder;
  const TensorCodec* decoder_codec = nullptr;
  uint64_t target_checksum = 0;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ManifestTensor& e = *it->entry;
    CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, Manifest(it->seq));
    const std::string where = "model '" + model_ + "' version " + std::to_string(m->version) +
                              " tensor '" + e.name + "' chunk " + std::to_string(chunk);
    if (e.dtype != target.dtype || e.tile_counts != target.tile_counts ||
        ChunkLength(e, chunk) != length) {
      return Status::DataLoss(where + ": delta chain changes dtype, tiles or chunk length");
    }
    if (it == chain.rbegin() && cached) {
      // The oldest link is already decoded in memory; replay the rest on top of it. The decoder
      // comes with the first stored link's codec, below.
      continue;
    }
    if (next_stored == window_begin + window.size()) {
      window_begin = next_stored;
      const size_t end = std::min(stored.size(), window_begin + read_window);
      const std::vector<StoreBackend::ChunkAddress> addresses(stored.begin() + window_begin,
                                                              stored.begin() + end);
      if (!backend_->GetChunks(chunk_read_options_, model_, addresses, &window).ok()) {
        // Name the link that fails: read this one alone (the next window starts after it).
        window = std::vector<rocksdb::PinnableSlice>(1);
        CKPT_RETURN_IF_ERROR(
            backend_->GetChunk(chunk_read_options_, model_, it->seq, it->tensor, chunk, &window[0])
                .WithContext(where));
      }
    }
    const rocksdb::PinnableSlice& value = window[next_stored++ - window_begin];
    auto record = ChunkRecord::DecodeFrom(value.ToStringView());
    if (!record.ok()) return record.status().WithContext(where);
    if (record->kind != e.kind) {
      return Status::DataLoss(where + ": frame kind differs from manifest");
    }
    if (record->raw_length != length) {
      return Status::DataLoss(where + ": stored length " + std::to_string(record->raw_length) +
                              " differs from manifest length " + std::to_string(length));
    }
    CKPT_ASSIGN_OR_RETURN(const TensorCodec* codec, CodecForDecoding(record->codec_id));
    auto payload = std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(record->payload.data()), record->payload.size());
    if (!decoder && !cached) {
      if (record->kind != FrameKind::kKeyframe) {
        return Status::DataLoss(where + ": delta chain does not start with a keyframe");
      }
      decoder = codec->NewChainDecoder(e.dtype, length);
      decoder_codec = codec;
      CKPT_RETURN_IF_ERROR(decoder->StartFromKeyframe(payload).WithContext(where));
    } else {
      if (record->kind != FrameKind::kDelta) {
        return Status::DataLoss(where + ": keyframe inside a delta chain");
      }
      if (!decoder) {
        decoder = codec->NewChainDecoder(e.dtype, length);
        decoder_codec = codec;
        CKPT_RETURN_IF_ERROR(decoder->StartFromDecoded(*cached).WithContext(where));
      } else if (codec != decoder_codec) {
        // The policy changed codecs mid-chain: materialize and continue with the new codec
        // (which may read `materialized` in place: it outlives the decoder).
        std::vector<uint8_t> next_materialized;
        CKPT_RETURN_IF_ERROR(decoder->Finish(&next_materialized).WithContext(where));
        decoder = codec->NewChainDecoder(e.dtype, length);
        decoder_codec = codec;
        materialized = std::move(next_materialized);
        CKPT_RETURN_IF_ERROR(decoder->StartFromDecoded(materialized).WithContext(where));
      }
      CKPT_RETURN_IF_ERROR(decoder->ApplyDelta(payload).WithContext(where));
    }
    target_checksum = record->raw_checksum;
    links_decoded_.fetch_add(1, std::memory_order_relaxed);
  }
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, Manifest(seq));
  const std::string where = "model '" + model_ + "' version " + std::to_string(m->version) +
                            " tensor '" + target.name + "' chunk " + std::to_string(chunk);
  CKPT_RETURN_IF_ERROR(decoder->Finish(out).WithContext(where));
  // Intermediate links are covered by their payload checksums; the decoded result of the whole
  // chain must match the checksum recorded when the target chunk was written.
  if (Xxh3Checksum(*out) != target_checksum) {
    return Status::DataLoss(where + ": checksum mismatch after decoding");
  }
  return Status::Ok();
}

}  // namespace ckpt
