#include "chain_reader.h"

#include <algorithm>

#include "ckpt/codec/hashing.h"
#include "ckpt/codec/tensor_codec.h"
#include "keys.h"

namespace ckpt {

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::DataLoss(std::move(msg));
  return Status::IoError(std::move(msg));
}

ChainReader::ChainReader(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* manifests,
                         rocksdb::ColumnFamilyHandle* chunks, const rocksdb::Snapshot* snapshot,
                         std::string model, ReferenceCache* cache)
    : db_(db), manifests_(manifests), chunks_(chunks), model_(std::move(model)), cache_(cache) {
  read_options_.snapshot = snapshot;
  read_options_.verify_checksums = true;
}

Result<const ManifestRecord*> ChainReader::Manifest(uint64_t seq) {
  auto it = manifests_by_seq_.find(seq);
  if (it != manifests_by_seq_.end()) return &it->second;
  std::string value;
  CKPT_RETURN_IF_ERROR(
      FromRocks(db_->Get(read_options_, manifests_, storage_keys::ManifestKey(model_, seq), &value),
                "model '" + model_ + "' manifest " + std::to_string(seq)));
  auto decoded = ManifestRecord::Decode(value);
  if (!decoded.ok()) {
    return decoded.status().WithContext("model '" + model_ + "' manifest " + std::to_string(seq));
  }
  auto [pos, inserted] = manifests_by_seq_.emplace(seq, std::move(decoded).value());
  return &pos->second;
}

uint64_t ChainReader::ChunkLength(const ManifestTensor& t, uint32_t chunk) {
  const uint64_t begin = uint64_t{chunk} * t.chunk_bytes;
  return std::min(t.chunk_bytes, t.byte_size - begin);
}

Status ChainReader::DecodeChunk(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                std::vector<uint8_t>* out) {
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
    if (cache_) cached = cache_->Get(model_, s, t, chunk);
    chain.push_back({s, t, &e});
    if (cached || e.kind == FrameKind::kKeyframe) break;
    if (e.base_seq >= s) {
      return Status::DataLoss("model '" + model_ + "' version " + std::to_string(m->version) +
                              " tensor '" + e.name + "': delta base does not precede it");
    }
    s = e.base_seq;
    t = e.base_tensor;
  }

  std::vector<uint8_t>* current = out;
  std::vector<uint8_t>* previous = &scratch_;
  auto it = chain.rbegin();
  if (cached) {
    *current = *cached;
    ++it;
  } else {
    CKPT_RETURN_IF_ERROR(ReadAndDecode(it->seq, it->tensor, chunk, *it->entry, nullptr, current));
    ++it;
  }
  for (; it != chain.rend(); ++it) {
    std::swap(current, previous);
    CKPT_RETURN_IF_ERROR(ReadAndDecode(it->seq, it->tensor, chunk, *it->entry, previous, current));
  }
  if (current != out) std::swap(*out, *current);  // keeps both buffers allocated for reuse
  return Status::Ok();
}

Status ChainReader::ReadAndDecode(uint64_t seq, uint32_t tensor, uint32_t chunk,
                                  const ManifestTensor& t, const std::vector<uint8_t>* reference,
                                  std::vector<uint8_t>* out) {
  CKPT_ASSIGN_OR_RETURN(const ManifestRecord* m, Manifest(seq));
  const std::string where = "model '" + model_ + "' version " + std::to_string(m->version) +
                            " tensor '" + t.name + "' chunk " + std::to_string(chunk);
  rocksdb::PinnableSlice value;
  CKPT_RETURN_IF_ERROR(FromRocks(
      db_->Get(read_options_, chunks_, storage_keys::ChunkKey(model_, seq, tensor, chunk), &value),
      where));
  auto record = ChunkRecord::Decode(value.ToStringView());
  if (!record.ok()) return record.status().WithContext(where);
  if (record->kind != t.kind) return Status::DataLoss(where + ": frame kind differs from manifest");
  if ((record->kind == FrameKind::kDelta) != (reference != nullptr)) {
    return Status::DataLoss(where + ": delta without reference");
  }
  const uint64_t length = ChunkLength(t, chunk);
  if (record->raw_length != length) {
    return Status::DataLoss(where + ": stored length " + std::to_string(record->raw_length) +
                            " differs from manifest length " + std::to_string(length));
  }
  CKPT_ASSIGN_OR_RETURN(const TensorCodec* codec, CodecForDecoding(record->codec_id));
  out->resize(length);
  std::optional<std::span<const uint8_t>> ref;
  if (reference) ref = std::span<const uint8_t>(*reference);
  auto payload = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(record->payload.data()),
                                          record->payload.size());
  Status s = codec->Decode(t.dtype, payload, ref, *out);
  if (!s.ok()) return s.WithContext(where);
  if (Xxh3Checksum(*out) != record->raw_checksum) {
    return Status::DataLoss(where + ": checksum mismatch after decoding");
  }
  return Status::Ok();
}

}  // namespace ckpt
