#include "records/records.h"

#include <cstring>

#include "ckpt/base/binary.h"
#include "ckpt/base/hashing.h"
#include "records/keys.h"

namespace ckpt {
namespace {

// Reads the format byte; accepts any version in [oldest, newest].
Status CheckFormatRange(ByteReader& r, uint8_t oldest, uint8_t newest, std::string_view what,
                        uint8_t* version) {
  CKPT_RETURN_IF_ERROR(r.GetU8(version));
  if (*version < oldest || *version > newest) {
    return Status::DataLoss(std::string(what) + ": unsupported format version " +
                            std::to_string(*version));
  }
  return Status::Ok();
}

void PutF64(ByteWriter& w, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  w.PutU64(bits);
}

Status GetF64(ByteReader& r, double* v) {
  uint64_t bits = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&bits));
  std::memcpy(v, &bits, 8);
  return Status::Ok();
}

Status CheckFullyConsumed(const ByteReader& r, std::string_view what) {
  if (!r.empty()) {
    return Status::DataLoss(std::string(what) + ": " + std::to_string(r.remaining()) +
                            " trailing bytes");
  }
  return Status::Ok();
}

}  // namespace

void ModelRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  w.PutU8(kFormatVersion);
  w.PutU64(static_cast<uint64_t>(created_at_ms));
  w.PutLengthPrefixed(policy_json);
  w.PutU8(has_versions ? 1 : 0);
  w.PutU64(latest_version);
  w.PutU64(version_count);
  w.PutU64(raw_bytes);
  w.PutU64(stored_bytes);
  w.PutLengthPrefixed(retention_json);
  out->append(w.data());
}

Result<ModelRecord> ModelRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "model record");
  ModelRecord m;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(CheckFormatRange(r, 1, kFormatVersion, "model record", &format));
  uint64_t created = 0;
  uint8_t has = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&created));
  m.created_at_ms = static_cast<int64_t>(created);
  CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&m.policy_json));
  CKPT_RETURN_IF_ERROR(r.GetU8(&has));
  m.has_versions = has != 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.latest_version));
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.version_count));
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.raw_bytes));
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.stored_bytes));
  if (format >= 2) CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&m.retention_json));
  CKPT_RETURN_IF_ERROR(CheckFullyConsumed(r, "model record"));
  return m;
}

void VersionRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  w.PutU8(kFormatVersion);
  w.PutU64(seq);
  w.PutU64(floor_seq);
  w.PutU64(static_cast<uint64_t>(created_at_ms));
  w.PutU64(raw_bytes);
  w.PutU64(stored_bytes);
  w.PutU8(kind);
  w.PutU32(tensor_count);
  w.PutLengthPrefixed(sha256_hex);
  w.PutLengthPrefixed64(raw_header);
  w.PutLengthPrefixed(restored_sha256_hex);
  w.PutU8(lossy ? 1 : 0);
  w.PutU32(static_cast<uint32_t>(metrics.size()));
  for (const auto& [name, value] : metrics) {
    w.PutLengthPrefixed(name);
    PutF64(w, value);
  }
  w.PutU32(static_cast<uint32_t>(labels.size()));
  for (const auto& [name, value] : labels) {
    w.PutLengthPrefixed(name);
    w.PutLengthPrefixed(value);
  }
  w.PutU32(static_cast<uint32_t>(dropped_tensors.size()));
  for (uint32_t t : dropped_tensors) w.PutU32(t);
  out->append(w.data());
}

uint8_t VersionRecord::KindOf(const ManifestRecord& manifest) {
  bool any_key = false, any_delta = false;
  for (const ManifestTensor& t : manifest.tensors) {
    if (t.chunk_count == 0) continue;
    (t.kind == FrameKind::kDelta ? any_delta : any_key) = true;
  }
  return any_delta ? (any_key ? kKindMixed : kKindDelta) : kKindKeyframe;
}

Result<VersionRecord> VersionRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "version record");
  VersionRecord v;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(CheckFormatRange(r, 1, kFormatVersion, "version record", &format));
  uint64_t created = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&v.seq));
  CKPT_RETURN_IF_ERROR(r.GetU64(&v.floor_seq));
  CKPT_RETURN_IF_ERROR(r.GetU64(&created));
  v.created_at_ms = static_cast<int64_t>(created);
  CKPT_RETURN_IF_ERROR(r.GetU64(&v.raw_bytes));
  CKPT_RETURN_IF_ERROR(r.GetU64(&v.stored_bytes));
  CKPT_RETURN_IF_ERROR(r.GetU8(&v.kind));
  CKPT_RETURN_IF_ERROR(r.GetU32(&v.tensor_count));
  CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&v.sha256_hex));
  CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed64(&v.raw_header));
  if (format >= 2) {
    uint8_t lossy = 0;
    CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&v.restored_sha256_hex));
    CKPT_RETURN_IF_ERROR(r.GetU8(&lossy));
    v.lossy = lossy != 0;
  } else {
    v.restored_sha256_hex = v.sha256_hex;
  }
  if (format >= 3) {
    uint32_t count = 0;
    CKPT_RETURN_IF_ERROR(r.GetU32(&count));
    for (uint32_t i = 0; i < count; ++i) {
      std::string name;
      double value = 0;
      CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&name));
      CKPT_RETURN_IF_ERROR(GetF64(r, &value));
      v.metrics.emplace(std::move(name), value);
    }
    CKPT_RETURN_IF_ERROR(r.GetU32(&count));
    for (uint32_t i = 0; i < count; ++i) {
      std::string name, value;
      CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&name));
      CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&value));
      v.labels.emplace(std::move(name), std::move(value));
    }
  }
  if (format >= 4) {
    uint32_t count = 0;
    CKPT_RETURN_IF_ERROR(r.GetU32(&count));
    if (count > r.remaining() / 4)
      return Status::DataLoss("version record: too many dropped tensors");
    v.dropped_tensors.resize(count);
    for (uint32_t& t : v.dropped_tensors) CKPT_RETURN_IF_ERROR(r.GetU32(&t));
    if (!std::is_sorted(v.dropped_tensors.begin(), v.dropped_tensors.end())) {
      return Status::DataLoss("version record: dropped tensors out of order");
    }
  }
  CKPT_RETURN_IF_ERROR(CheckFullyConsumed(r, "version record"));
  return v;
}

Result<ChunkGrid> ManifestTensor::Grid() const {
  const uint64_t element = DTypeSize(dtype);
  if (chunk_bytes == 0 || chunk_bytes % element != 0) {
    return Status::DataLoss("manifest of tensor '" + name + "': chunks of " +
                            std::to_string(chunk_bytes) + " bytes");
  }
  auto grid = ChunkGrid::Make(shape, tile_counts, chunk_bytes / element);
  if (!grid.ok()) {
    return Status::DataLoss("manifest of tensor '" + name + "': " + grid.status().message());
  }
  uint64_t bytes = element;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) bytes = 0;
  }
  if (bytes != byte_size) {
    return Status::DataLoss("manifest of tensor '" + name + "': " + std::to_string(byte_size) +
                            " bytes for its shape");
  }
  if (grid->chunk_count() != chunk_count) {
    return Status::DataLoss("manifest of tensor '" + name + "': " + std::to_string(chunk_count) +
                            " chunks, its grid has " + std::to_string(grid->chunk_count()));
  }
  return grid;
}

void ManifestRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  bool tiled = false;
  for (const auto& t : tensors) tiled = tiled || !t.tile_counts.empty();
  const uint8_t format = tiled ? kFormatVersion : 3;
  w.PutU8(format);
  w.PutU64(version);
  w.PutU64(floor_seq);
  w.PutU64(stored_bytes);
  w.PutU32(static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    w.PutLengthPrefixed(t.name);
    w.PutU8(static_cast<uint8_t>(t.dtype));
    w.PutU32(static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) w.PutU64(d);
    w.PutU64(t.byte_size);
    w.PutU64(t.chunk_bytes);
    w.PutU32(t.chunk_count);
    w.PutU8(static_cast<uint8_t>(t.kind));
    w.PutU64(t.base_seq);
    w.PutU32(t.base_tensor);
    w.PutU64(t.keyframe_seq);
    w.PutU32(t.chain_length);
    w.PutU16(t.codec_id);
    w.PutU8(t.quantizer);
    PutF64(w, t.bound);
    w.PutU64(t.stored_bytes);
    w.PutU64(t.keyframe_bytes);
    w.PutU64(t.chain_bytes);
    PutF64(w, t.entropy_bits);
    w.PutU64(t.exact_elements);
    PutF64(w, 0);  // format 3: reserved
    if (format >= 4) {
      w.PutU32(static_cast<uint32_t>(t.tile_counts.size()));
      for (uint32_t n : t.tile_counts) w.PutU32(n);
    }
  }
  out->append(w.data());
}

Result<ManifestRecord> ManifestRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "manifest record");
  ManifestRecord m;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(CheckFormatRange(r, 1, kFormatVersion, "manifest record", &format));
  uint32_t count = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.version));
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.floor_seq));
  CKPT_RETURN_IF_ERROR(r.GetU64(&m.stored_bytes));
  CKPT_RETURN_IF_ERROR(r.GetU32(&count));
  if (count > r.remaining()) return Status::DataLoss("manifest record: tensor count too large");
  m.tensors.resize(count);
  for (auto& t : m.tensors) {
    uint8_t dtype = 0, kind = 0;
    uint32_t rank = 0;
    CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&t.name));
    CKPT_RETURN_IF_ERROR(r.GetU8(&dtype));
    auto parsed = DTypeFromTag(dtype);
    if (!parsed)
      return Status::DataLoss("manifest record: unknown dtype tag " + std::to_string(dtype));
    t.dtype = *parsed;
    CKPT_RETURN_IF_ERROR(r.GetU32(&rank));
    if (rank > r.remaining() / 8) return Status::DataLoss("manifest record: rank too large");
    t.shape.resize(rank);
    for (auto& d : t.shape) CKPT_RETURN_IF_ERROR(r.GetU64(&d));
    CKPT_RETURN_IF_ERROR(r.GetU64(&t.byte_size));
    CKPT_RETURN_IF_ERROR(r.GetU64(&t.chunk_bytes));
    CKPT_RETURN_IF_ERROR(r.GetU32(&t.chunk_count));
    CKPT_RETURN_IF_ERROR(r.GetU8(&kind));
    if (kind != static_cast<uint8_t>(FrameKind::kKeyframe) &&
        kind != static_cast<uint8_t>(FrameKind::kDelta)) {
      return Status::DataLoss("manifest record: unknown frame kind " + std::to_string(kind));
    }
    t.kind = static_cast<FrameKind>(kind);
    CKPT_RETURN_IF_ERROR(r.GetU64(&t.base_seq));
    CKPT_RETURN_IF_ERROR(r.GetU32(&t.base_tensor));
    CKPT_RETURN_IF_ERROR(r.GetU64(&t.keyframe_seq));
    CKPT_RETURN_IF_ERROR(r.GetU32(&t.chain_length));
    if (format >= 2) {
      CKPT_RETURN_IF_ERROR(r.GetU16(&t.codec_id));
      CKPT_RETURN_IF_ERROR(r.GetU8(&t.quantizer));
      CKPT_RETURN_IF_ERROR(GetF64(r, &t.bound));
      CKPT_RETURN_IF_ERROR(r.GetU64(&t.stored_bytes));
      CKPT_RETURN_IF_ERROR(r.GetU64(&t.keyframe_bytes));
      CKPT_RETURN_IF_ERROR(r.GetU64(&t.chain_bytes));
      CKPT_RETURN_IF_ERROR(GetF64(r, &t.entropy_bits));
      CKPT_RETURN_IF_ERROR(r.GetU64(&t.exact_elements));
    }
    if (format >= 3) {
      double reserved = 0;
      CKPT_RETURN_IF_ERROR(GetF64(r, &reserved));
    }
    if (format >= 4) {
      uint32_t n = 0;
      CKPT_RETURN_IF_ERROR(r.GetU32(&n));
      if (n != 0 && n != rank) {
        return Status::DataLoss("manifest record: " + std::to_string(n) +
                                " tile counts for a tensor of rank " + std::to_string(rank));
      }
      t.tile_counts.resize(n);
      for (auto& c : t.tile_counts) CKPT_RETURN_IF_ERROR(r.GetU32(&c));
      // Readers divide by the tiles and walk the grid: it must be one, of several tiles.
      if (n != 0) {
        CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());
        if (!grid.tiled()) return Status::DataLoss("manifest record: tile counts of one tile");
      }
    }
  }
  CKPT_RETURN_IF_ERROR(CheckFullyConsumed(r, "manifest record"));
  return m;
}

void CodecStateRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  w.PutU8(kFormatVersion);
  w.PutU64(reference_seq);
  w.PutU64(reference_floor_seq);
  w.PutU64(next_seq);
  out->append(w.data());
}

Result<CodecStateRecord> CodecStateRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "codec state record");
  CodecStateRecord s;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(CheckFormatRange(r, 1, kFormatVersion, "codec state record", &format));
  CKPT_RETURN_IF_ERROR(r.GetU64(&s.reference_seq));
  CKPT_RETURN_IF_ERROR(r.GetU64(&s.reference_floor_seq));
  if (format >= 2) {
    CKPT_RETURN_IF_ERROR(r.GetU64(&s.next_seq));
  } else {
    s.next_seq = s.reference_seq + 1;
  }
  CKPT_RETURN_IF_ERROR(CheckFullyConsumed(r, "codec state record"));
  return s;
}

void AwaitingCompactionRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  w.PutU8(kFormatVersion);
  w.PutU64(bytes);
  out->append(w.data());
}

Result<AwaitingCompactionRecord> AwaitingCompactionRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "awaiting compaction record");
  AwaitingCompactionRecord a;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(
      CheckFormatRange(r, 1, kFormatVersion, "awaiting compaction record", &format));
  CKPT_RETURN_IF_ERROR(r.GetU64(&a.bytes));
  CKPT_RETURN_IF_ERROR(CheckFullyConsumed(r, "awaiting compaction record"));
  return a;
}

void TagRecord::EncodeTo(std::string* out) const {
  storage_keys::AppendBigEndian(*out, version, kEncodedBytes);
}

Result<TagRecord> TagRecord::DecodeFrom(std::string_view bytes) {
  if (bytes.size() != kEncodedBytes) return Status::DataLoss("malformed tag record");
  return TagRecord{storage_keys::ReadBigEndian(bytes, 0, kEncodedBytes)};
}

}  // namespace ckpt
