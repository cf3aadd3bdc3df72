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
//
// A part of a version (chosen tensors, one rank's slices, a box) is format 2: the preamble has
// no `since` and no digest (not known before the part is restored: each chunk is checked by its
// record's checksum), and a tensor that is a box of a stored tensor is announced before its
// links by
//   part      u8 3  u32 tensor  u64 stored bytes  u64 chunk bytes  u8 dims
//             dims × u64 stored extent  dims × u64 offset of the box (its extent: the header's)
// after which its links are the chunks of the stored tensor that hold the box, in order.
// A tensor whose stored chunks follow tiles (ChunkGrid) is announced, whole or a box of it, by
//   tiles      u8 4  u32 tensor  u64 chunk bytes  u8 dims  dims × u64 stored extent
//              dims × u64 offset of the box  dims × u32 tile counts
// after which its links are the chunks holding the box, ascending; such bodies are formats 3
// (a whole version) and 4 (a part), so that decoders that predate tiles refuse them.
// Written by the daemon; decoded by clients (EncodedPullDecoder).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/hashing.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/base/status.h"
#include "ckpt/base/tensor_slices.h"
#include "ckpt/codec/edge_encoder.h"

namespace ckpt {

inline constexpr std::string_view kEncodedPullMagic = "CKPTPUL";
inline constexpr uint8_t kEncodedPullFormatVersion = 1;
inline constexpr uint8_t kEncodedPullPartFormatVersion = 2;
// The same, with tiles frames.
inline constexpr uint8_t kEncodedPullTiledFormatVersion = 3;
inline constexpr uint8_t kEncodedPullTiledPartFormatVersion = 4;
// The media type a client accepts to receive an encoded pull body.
inline constexpr std::string_view kEncodedPullMediaType = "application/vnd.ckpt.encoded-pull";

enum class LinkBase : uint8_t {
  kNone = 0,      // a keyframe: the chunk's chain starts here
  kPrevious = 1,  // a delta against the link before it
  kSince = 2,     // a delta against the client's reconstruction of version `since`
};

// `tiles`: the body has tiles frames (format 3, else 1).
std::string EncodePullPreamble(uint64_t version, uint64_t since, std::string_view raw_header,
                               std::string_view restored_sha256, bool tiles = false);
// The preamble of a part of a version (format 2; 4 with `tiles`).
std::string EncodePartPullPreamble(uint64_t version, std::string_view raw_header,
                                   bool tiles = false);
// The frame announcing that body tensor `tensor` is the box at `offsets` (its extent: the
// header's) of a stored tensor of `stored_shape`, `stored_bytes` long and cut into chunks of
// `chunk_bytes`.
std::string EncodePartFrame(uint32_t tensor, uint64_t stored_bytes, uint64_t chunk_bytes,
                            std::span<const uint64_t> stored_shape,
                            std::span<const uint64_t> offsets);
// The frame announcing that body tensor `tensor` is the box at `offsets` (its extent: the
// header's) of a stored tensor of `stored_shape` cut in tiles of `tile_counts` and chunks of
// `chunk_bytes`.
std::string EncodeTilesFrame(uint32_t tensor, uint64_t chunk_bytes,
                             std::span<const uint64_t> stored_shape,
                             std::span<const uint64_t> offsets,
                             std::span<const uint32_t> tile_counts);
// The chunks of a stored tensor (`element` bytes per element, cut into chunks of
// `chunk_bytes`) that hold `box`: [first, last]. None for an empty box.
std::optional<std::pair<uint32_t, uint32_t>> ChunksHoldingBox(
    std::span<const uint64_t> stored_shape, const TensorBox& box, uint64_t element,
    uint64_t chunk_bytes);
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
  // The version whose reconstruction the body's deltas start from (0: none, every chain from
  // its keyframe): the one asked since, unless the server could not code against it.
  uint64_t since_version() const { return since_version_; }
  // After Finish: the SHA-256 (hex) of the restored body, which for a whole version is the one
  // the body announced (a part of a version announces none: each of its chunks is checked by
  // its record's checksum).
  const std::string& sha256() const { return sha256_; }
  bool whole_version() const {
    return format_ == kEncodedPullFormatVersion || format_ == kEncodedPullTiledFormatVersion;
  }
  uint64_t restored_bytes() const { return restored_bytes_; }

 private:
  enum class Stage {
    kPreamble,
    kHeader,
    kDigest,
    kTag,
    kLinkHead,
    kRecord,
    kPartHead,
    kPartShape,
    kTilesHead,
    kTilesShape,
    kDone,
    kFailed
  };

  // A body tensor that is a box of a stored tensor (a part frame), and how far its bytes were
  // written: the decoded chunks are cut to the box's runs as they come.
  struct Part {
    uint32_t tensor = 0;
    uint64_t stored_bytes = 0;
    uint64_t chunk_bytes = 0;
    std::vector<uint64_t> stored_shape;
    TensorBox box;
    uint32_t first_chunk = 0, last_chunk = 0;
    bool empty = false;
    // A tiled stored tensor: its grid, the chunks holding the box (ascending), how many came,
    // and the box being put together.
    std::optional<ChunkGrid> grid;
    std::vector<uint32_t> chunks;
    size_t chunks_received = 0;
    std::vector<uint8_t> assembled;
    // Writing: the runs left, the current run's bytes in the stored tensor, what was gathered.
    std::optional<BoxRuns> runs;
    uint64_t run_begin = 0, run_end = 0;
    std::string gathered;
  };

  // One link of a chunk: its record (parsed from `bytes`) and what it decodes against.
  struct Link {
    std::string bytes;
    LinkBase base = LinkBase::kNone;
  };
  // A chunk whose links have all arrived, and, once decoded, its bytes.
  struct PendingChunk {
    uint32_t tensor = 0;
    uint32_t chunk = 0;
    uint64_t offset = 0;         // in the data buffer (a part's chunk: in its stored tensor)
    std::shared_ptr<Part> part;  // set when the tensor is a box of its stored tensor
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
  Status OnPart(uint64_t dims);
  Status OnTiles(uint64_t dims);
  // Checks a part frame's box against its tensor and stored shape, and makes it the current
  // part.
  Status StartPart(std::shared_ptr<Part> part, std::span<const uint32_t> tile_counts);
  // Writes the part of a decoded chunk of a part that lies in its box.
  Status WritePart(Part& part, const PendingChunk& chunk);
  Status Write(std::string_view bytes);

  const CheckpointView* const since_;
  const std::function<Status(std::string_view)> write_;
  const size_t threads_;
  Stage stage_ = Stage::kPreamble;
  uint8_t format_ = 0;
  std::string buffer_;
  uint64_t wanted_ = 0;
  uint64_t version_ = 0;
  uint64_t since_version_ = 0;
  std::string raw_header_;
  SafetensorsHeader header_;
  std::string announced_sha256_;
  std::string sha256_;
  Sha256 sha_;
  uint64_t restored_bytes_ = 0;
  // The link being read, the chunk being received and the chunks waiting to be decoded.
  uint32_t link_tensor_ = 0, link_chunk_ = 0;
  LinkBase link_base_ = LinkBase::kNone;
  bool have_chunk_ = false;
  PendingChunk current_;
  uint64_t current_length_ = 0;  // of the chunk being received (its first link's record)
  std::vector<PendingChunk> window_;
  // The part frame read last (its tensor's chunks follow it), and its head before its shape.
  std::shared_ptr<Part> part_;
  Part part_head_;
  uint64_t next_offset_ = 0;  // in the data buffer: where the next chunk must start
};

}  // namespace ckpt
