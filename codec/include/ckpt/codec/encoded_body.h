// The encoded push body: a checkpoint coded at the edge, as a client sends it. It carries the
// checkpoint's safetensors header, then each chunk's record (chunk_record.h: exactly what the
// daemon stores) in body order, then the digests of the pushed and the restored bodies. Byte
// layout in docs/format.md ("Encoded push body"):
//
//   preamble  "CKPTENC" u8 format  u64 plan digest  u64 reference (0: none)
//             u64 header length  header (the safetensors length prefix and JSON, verbatim)
//   chunk     u8 1  u32 tensor  u32 chunk  u8 quantizer  f64 bound  u64 exact elements
//             f64 entropy bits  u64 record length  record
//   end       u8 2  64 hex digits: SHA-256 of the pushed body  64: SHA-256 of the restored body
//
// Format 2 is a shard of a sharded version coded by its rank (kEncodedShardMediaType): the
// header is the shard's, chunk frames name global chunks the shard owns (the plan's slices),
// and raw frames carry the rest of the shard's bytes, which the daemon codes:
//   raw       u8 3  u32 tensor  u64 offset (in the tensor's bytes)  u64 length  bytes
//
// Integers little-endian, f64 as its IEEE-754 bits. Clients write it with the Encode*
// functions; the daemon parses it as it streams in (EncodedBodyParser).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {

inline constexpr std::string_view kEncodedBodyMagic = "CKPTENC";
inline constexpr uint8_t kEncodedBodyFormatVersion = 1;
inline constexpr uint8_t kEncodedShardFormatVersion = 2;
// The media type of an encoded push body.
inline constexpr std::string_view kEncodedBodyMediaType = "application/vnd.ckpt.encoded-push";
// The media type of an encoded shard (format 2).
inline constexpr std::string_view kEncodedShardMediaType = "application/vnd.ckpt.encoded-shard";

struct EncodedBodyPreamble {
  uint64_t plan_digest = 0;  // CodingPlan::Digest() of the plan the body follows
  uint64_t reference = 0;    // the plan's PlanBase::reference; 0 when it has no base
  std::string raw_header;    // the checkpoint's 8-byte length prefix and JSON header
  uint8_t format = kEncodedBodyFormatVersion;  // kEncodedShardFormatVersion for a shard
};

struct EncodedChunkFrame {
  uint32_t tensor = 0;  // index in body order
  uint32_t chunk = 0;   // index within the tensor
  // What the encoder reported (quantizer, bound, exact elements, entropy); `elements` unused.
  ChunkCodingInfo info;
  std::string_view record;  // a ChunkRecord value
};

struct EncodedBodyEnd {
  std::string pushed_sha256;  // hex, of the safetensors body (or shard) the client encoded
  // Hex: of the body a restore of this version sends; of a shard, of the shard with its coded
  // chunks replaced by their reconstructions (what its rank keeps as its next reference).
  std::string restored_sha256;
};

std::string EncodePreamble(const EncodedBodyPreamble& preamble);
std::string EncodeChunkFrame(const EncodedChunkFrame& frame);
// The head of a raw frame of `length` bytes of tensor `tensor` from byte `offset`; the bytes
// follow it.
std::string EncodeRawFrameHead(uint32_t tensor, uint64_t offset, uint64_t length);
std::string EncodeEnd(const EncodedBodyEnd& end);

// Receives an encoded body as EncodedBodyParser decodes it.
class EncodedBodySink {
 public:
  virtual ~EncodedBodySink() = default;
  virtual Status OnPreamble(const EncodedBodyPreamble& preamble) = 0;
  // `frame.record` is valid during the call only.
  virtual Status OnChunk(const EncodedChunkFrame& frame) = 0;
  // Format 2: bytes of a raw frame, in pieces as they arrive (`offset` is the first one's in
  // the tensor's bytes); a frame's pieces come in order, the first one possibly empty.
  // Format 1 bodies have none (the parser refuses them).
  virtual Status OnRaw(uint32_t tensor, uint64_t offset, std::span<const uint8_t> bytes) {
    (void)tensor, (void)offset, (void)bytes;
    return Status::InvalidArgument("encoded push body: raw bytes outside a shard");
  }
  virtual Status OnEnd(const EncodedBodyEnd& end) = 0;
};

// Parses an encoded body fed in pieces of any size, holding at most one frame in memory.
// Errors are InvalidArgument saying what is malformed; after one, the parser is failed.
// Thread-compatible.
class EncodedBodyParser {
 public:
  // Headers longer than `max_header_bytes` and records longer than `max_record_bytes` are
  // refused before they are buffered; a body of another format than `format` is refused.
  EncodedBodyParser(EncodedBodySink* sink, uint64_t max_header_bytes, uint64_t max_record_bytes,
                    uint8_t format = kEncodedBodyFormatVersion);

  Status Feed(std::span<const uint8_t> bytes);
  // The body ended: InvalidArgument unless it ended right after its end frame.
  Status Finish();
  uint64_t consumed() const { return consumed_; }

 private:
  enum class Stage {
    kPreamble,
    kHeader,
    kFrameTag,
    kChunkFixed,
    kRecord,
    kRawFixed,
    kRawData,
    kEnd,
    kDone,
    kFailed
  };

  // Bytes still wanted by the current stage.
  uint64_t Wanted() const;
  Status Complete();  // the current stage's bytes are in buffer_
  Status Fail(std::string message);

  EncodedBodySink* const sink_;
  const uint64_t max_header_bytes_;
  const uint64_t max_record_bytes_;
  const uint8_t format_;
  Stage stage_ = Stage::kPreamble;
  std::string buffer_;
  uint64_t wanted_ = 0;  // for kHeader and kRecord: their length
  EncodedBodyPreamble preamble_;
  EncodedChunkFrame frame_;
  uint32_t raw_tensor_ = 0;  // kRawData: the frame's tensor, the next byte's offset, bytes left
  uint64_t raw_offset_ = 0;
  uint64_t raw_left_ = 0;
  uint64_t consumed_ = 0;
};

}  // namespace ckpt
