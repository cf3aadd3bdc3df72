#include "ckpt/codec/chunk_record.h"

#include "ckpt/base/binary.h"
#include "ckpt/base/hashing.h"

namespace ckpt {
namespace {

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

void ChunkRecord::EncodeTo(std::string* out) const {
  ByteWriter w;
  w.PutU8(kFormatVersion);
  w.PutU16(codec_id);
  w.PutU8(static_cast<uint8_t>(kind));
  w.PutU64(raw_length);
  w.PutU64(raw_checksum);
  w.PutU64(payload_checksum);
  w.PutBytes(payload);
  out->append(w.data());
}

std::string ChunkRecord::EncodeChunk(const EncodedChunk& encoded, FrameKind kind,
                                     std::span<const uint8_t> restored) {
  ChunkRecord record;
  record.codec_id = static_cast<uint16_t>(encoded.codec_id);
  record.kind = kind;
  record.raw_length = restored.size();
  record.raw_checksum = Xxh3Checksum(restored);
  record.payload = encoded.payload;
  record.payload_checksum = Xxh3Checksum(AsBytes(encoded.payload));
  std::string out;
  record.EncodeTo(&out);
  return out;
}

Result<ChunkRecord> ChunkRecord::DecodeFrom(std::string_view bytes) {
  ByteReader r(bytes, "chunk record");
  ChunkRecord c;
  uint8_t format = 0;
  CKPT_RETURN_IF_ERROR(r.GetU8(&format));
  if (format != kFormatVersion) {
    return Status::DataLoss("chunk record: unsupported format version " + std::to_string(format));
  }
  uint8_t kind = 0;
  CKPT_RETURN_IF_ERROR(r.GetU16(&c.codec_id));
  CKPT_RETURN_IF_ERROR(r.GetU8(&kind));
  if (kind != static_cast<uint8_t>(FrameKind::kKeyframe) &&
      kind != static_cast<uint8_t>(FrameKind::kDelta)) {
    return Status::DataLoss("chunk record: unknown frame kind " + std::to_string(kind));
  }
  c.kind = static_cast<FrameKind>(kind);
  CKPT_RETURN_IF_ERROR(r.GetU64(&c.raw_length));
  CKPT_RETURN_IF_ERROR(r.GetU64(&c.raw_checksum));
  CKPT_RETURN_IF_ERROR(r.GetU64(&c.payload_checksum));
  c.payload = bytes.substr(bytes.size() - r.remaining());
  if (Xxh3Checksum(AsBytes(c.payload)) != c.payload_checksum) {
    return Status::DataLoss("chunk record: payload checksum mismatch");
  }
  return c;
}

}  // namespace ckpt
