// The chunk record: one encoded chunk as it is stored and as an encoded push carries it — the
// codec that decodes it, its frame kind, the length and XXH3-64 of what it decodes to, and the
// XXH3-64 of the payload, then the payload. The daemon stores it in the chunks family (key
// "<model>\0" + u64 seq + u32 tensor + u32 chunk); byte layout in docs/format.md.
// Written to disk: fields may be appended under a new format version, never reordered.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {

struct ChunkRecord {
  static constexpr uint8_t kFormatVersion = 1;
  uint16_t codec_id = 0;
  FrameKind kind = FrameKind::kKeyframe;
  uint64_t raw_length = 0;
  uint64_t raw_checksum = 0;      // XXH3-64 of the decoded chunk bytes
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload
  std::string_view payload;       // points into the decoded buffer

  void EncodeTo(std::string* out) const;  // appends
  // The stored value of an encoded chunk of frame `kind` whose decoded bytes are `restored`
  // (the input, or the lossy reconstruction): both checksums computed here.
  static std::string EncodeChunk(const EncodedChunk& encoded, FrameKind kind,
                                 std::span<const uint8_t> restored);
  // Checks the format, the frame kind and the payload checksum; `bytes` must outlive the record.
  static Result<ChunkRecord> DecodeFrom(std::string_view bytes);
};

}  // namespace ckpt
