// The encoded pull body: a stored version sent as the chunk records that reconstruct it, for a
// client that decodes them itself (the wire carries the stored bytes, not the restored ones).
// Byte layout in docs/format.md ("Encoded pull body"):
//
//   preamble  "CKPTPUL" u8 format  u64 version  u64 since (0: none)  u64 header length
//             header (the restored body's length prefix and JSON)  64 hex digits: its SHA-256
//   link      u8 1  u32 tensor  u32 chunk  u8 base  u64 record length  record
//   end       u8 2
//
// Links come chunk by chunk in body order; a chunk's links start with a keyframe (base 0) or a
// delta against the client's reconstruction of version `since` (base 2: the same chunk of its
// tensor of the same name), and continue with deltas against the link before (base 1).
// Written by the daemon; decoded by clients (EncodedPullDecoder).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/hashing.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/edge_encoder.h"

namespace ckpt {

inline constexpr std::string_view kEncodedPullMagic = "CKPTPUL";
inline constexpr uint8_t kEncodedPullFormatVersion = 1;
// The media type a client accepts to receive an encoded pull body.
inline constexpr std::string_view kEncodedPullMediaType = "application/vnd.ckpt.encoded-pull";

enum class LinkBase : uint8_t {
  kNone = 0,      // a keyframe: the chunk's chain starts here
  kPrevious = 1,  // a delta against the link before it
  kSince = 2,     // a delta against the client's reconstruction of version `since`
};

std::string EncodePullPreamble(uint64_t version, uint64_t since, std::string_view raw_header,
                               std::string_view restored_sha256);
// The bytes of a link frame before its record (the record follows, of `record_length` bytes).
std::string EncodeLinkFrameHead(uint32_t tensor, uint32_t chunk, LinkBase base,
                                uint64_t record_length);
std::string EncodePullEnd();
// Bytes of a link frame around its record.
inline constexpr uint64_t kLinkFrameOverhead = 1 + 4 + 4 + 1 + 8;

// Decodes an encoded pull body fed in pieces into the restored body, handed to `write` in order
// (header first), and checks it against the SHA-256 the body announces. `since` is the
// client's reconstruction of the version the body was asked since (null: none). Chunks are
// decoded on up to `threads` threads, a window of complete chunks at a time (at most two per
// thread held). Errors: InvalidArgument for a malformed body, DataLoss for a link that does not
// decode to the bytes its record names or a body whose digest differs, FailedPrecondition for a
// since-link the held reconstruction cannot serve. Thread-compatible.
class EncodedPullDecoder {
 public:
  EncodedPullDecoder(const CheckpointView* since, std::function<Status(std::string_view)> write,
                     int threads = 1);

  Status Feed(std::span<const uint8_t> bytes);
  // The body ended: checks it was complete and its digest.
  Status Finish();

  uint64_t version() const { return version_; }
  const std::string& sha256() const { return announced_sha256_; }
  uint64_t restored_bytes() const { return restored_bytes_; }

 private:
  enum class Stage { kPreamble, kHeader, kDigest, kTag, kLinkHead, kRecord, kDone, kFailed };

  // One link of a chunk: its record (parsed from `bytes`) and what it decodes against.
  struct Link {
    std::string bytes;
    LinkBase base = LinkBase::kNone;
  };
  // A chunk whose links have all arrived, and, once decoded, its bytes.
  struct PendingChunk {
    uint32_t tensor = 0;
    uint32_t chunk = 0;
    uint64_t offset = 0;  // in the data buffer
    std::vector<Link> links;
    Status status;
    std::vector<uint8_t> decoded;
  };

  uint64_t Wanted() const;
  Status Complete();
  Status OnLink(std::string record);
  // Queues the chunk being received (if any); decodes and writes the window when it is full.
  Status EndChunk();
  // Decodes the queued chunks in parallel and writes them in body order.
  Status DecodeWindow();
  Status DecodeChunk(PendingChunk& chunk) const;
  Status Write(std::string_view bytes);

  const CheckpointView* const since_;
  const std::function<Status(std::string_view)> write_;
  const size_t threads_;
  Stage stage_ = Stage::kPreamble;
  std::string buffer_;
  uint64_t wanted_ = 0;
  uint64_t version_ = 0;
  uint64_t since_version_ = 0;
  std::string raw_header_;
  SafetensorsHeader header_;
  std::string announced_sha256_;
  Sha256 sha_;
  uint64_t restored_bytes_ = 0;
  // The link being read, the chunk being received and the chunks waiting to be decoded.
  uint32_t link_tensor_ = 0, link_chunk_ = 0;
  LinkBase link_base_ = LinkBase::kNone;
  bool have_chunk_ = false;
  PendingChunk current_;
  uint64_t current_length_ = 0;  // of the chunk being received (its first link's record)
  std::vector<PendingChunk> window_;
  uint64_t next_offset_ = 0;  // in the data buffer: where the next chunk must start
};

}  // namespace ckpt
