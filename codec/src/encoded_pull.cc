#include "ckpt/codec/encoded_pull.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <tuple>

#include "ckpt/base/binary.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {
namespace {

constexpr uint8_t kLinkTag = 1;
constexpr uint8_t kEndTag = 2;
constexpr uint8_t kPartTag = 3;
constexpr uint8_t kTilesTag = 4;
constexpr uint64_t kPreambleBytes = 7 + 1 + 8 + 8 + 8;
constexpr uint64_t kLinkHeadBytes = 4 + 4 + 1 + 8;
constexpr uint64_t kPartHeadBytes = 4 + 8 + 8 + 1;
constexpr uint64_t kTilesHeadBytes = 4 + 8 + 1;
// Dimensions a part frame may declare (safetensors tensors have far fewer).
constexpr uint64_t kMaxPartDims = 64;
// Chunks a tiled tensor may have (a list of those holding its box is kept).
constexpr uint64_t kMaxTiledChunks = uint64_t{1} << 24;
constexpr uint64_t kDigestBytes = 64;
// A header longer than this is refused before it is buffered.
constexpr uint64_t kMaxHeaderBytes = kMaxSafetensorsHeaderBytes + 8;
// A record longer than this is refused before it is buffered (far beyond any chunk).
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;
// A chunk that decodes to more than this is refused before it is allocated (the daemon's
// chunks are at most storage.chunk_bytes, 256 MiB).
constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;
// A part's bytes are written in pieces of about this size: the runs of a box are gathered into
// one piece, and a run at least kDirectBytes long is written from the decoded chunk itself.
constexpr size_t kGatherBytes = 1 << 20;
constexpr size_t kDirectBytes = 64 << 10;

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Status Malformed(std::string what) {
  return Status::InvalidArgument("encoded pull body: " + std::move(what));
}

}  // namespace

std::string EncodePullPreamble(uint64_t version, uint64_t since, std::string_view raw_header,
                               std::string_view restored_sha256, bool tiles) {
  ByteWriter w;
  w.PutBytes(kEncodedPullMagic);
  w.PutU8(tiles ? kEncodedPullTiledFormatVersion : kEncodedPullFormatVersion);
  w.PutU64(version);
  w.PutU64(since);
  w.PutU64(raw_header.size());
  w.PutBytes(raw_header);
  w.PutBytes(restored_sha256);
  return w.Release();
}

std::string EncodePartPullPreamble(uint64_t version, std::string_view raw_header, bool tiles) {
  ByteWriter w;
  w.PutBytes(kEncodedPullMagic);
  w.PutU8(tiles ? kEncodedPullTiledPartFormatVersion : kEncodedPullPartFormatVersion);
  w.PutU64(version);
  w.PutU64(0);
  w.PutU64(raw_header.size());
  w.PutBytes(raw_header);
  return w.Release();
}

namespace {

// A part or tiles frame's box: the dimensions, the stored tensor's extents, the box's offsets.
void PutBox(ByteWriter& w, std::span<const uint64_t> stored_shape,
            std::span<const uint64_t> offsets) {
  w.PutU8(static_cast<uint8_t>(stored_shape.size()));
  for (uint64_t extent : stored_shape) w.PutU64(extent);
  for (uint64_t offset : offsets) w.PutU64(offset);
}

}  // namespace

std::string EncodePartFrame(uint32_t tensor, uint64_t stored_bytes, uint64_t chunk_bytes,
                            std::span<const uint64_t> stored_shape,
                            std::span<const uint64_t> offsets) {
  ByteWriter w;
  w.PutU8(kPartTag);
  w.PutU32(tensor);
  w.PutU64(stored_bytes);
  w.PutU64(chunk_bytes);
  PutBox(w, stored_shape, offsets);
  return w.Release();
}

std::string EncodeTilesFrame(uint32_t tensor, uint64_t chunk_bytes,
                             std::span<const uint64_t> stored_shape,
                             std::span<const uint64_t> offsets,
                             std::span<const uint32_t> tile_counts) {
  ByteWriter w;
  w.PutU8(kTilesTag);
  w.PutU32(tensor);
  w.PutU64(chunk_bytes);
  PutBox(w, stored_shape, offsets);
  for (uint32_t count : tile_counts) w.PutU32(count);
  return w.Release();
}

std::optional<std::pair<uint32_t, uint32_t>> ChunksHoldingBox(
    std::span<const uint64_t> stored_shape, const TensorBox& box, uint64_t element,
    uint64_t chunk_bytes) {
  const auto [first, end] = BoxElementSpan(stored_shape, box);
  if (first == end || chunk_bytes == 0) return std::nullopt;
  return std::make_pair(static_cast<uint32_t>(first * element / chunk_bytes),
                        static_cast<uint32_t>((end * element - 1) / chunk_bytes));
}

std::string EncodeLinkFrameHead(uint32_t tensor, uint32_t chunk, LinkBase base,
                                uint64_t record_length) {
  ByteWriter w;
  w.PutU8(kLinkTag);
  w.PutU32(tensor);
  w.PutU32(chunk);
  w.PutU8(static_cast<uint8_t>(base));
  w.PutU64(record_length);
  return w.Release();
}

std::string EncodePullEnd() { return std::string(1, static_cast<char>(kEndTag)); }

EncodedPullDecoder::EncodedPullDecoder(const CheckpointView* since,
                                       std::function<Status(std::string_view)> write, int threads)
    : since_(since),
      write_(std::move(write)),
      threads_(static_cast<size_t>(std::max(1, threads))) {}

uint64_t EncodedPullDecoder::Wanted() const {
  switch (stage_) {
    case Stage::kPreamble:
      return kPreambleBytes;
    case Stage::kHeader:
    case Stage::kRecord:
      return wanted_;
    case Stage::kDigest:
      return kDigestBytes;
    case Stage::kTag:
      return 1;
    case Stage::kLinkHead:
      return kLinkHeadBytes;
    case Stage::kPartHead:
      return kPartHeadBytes;
    case Stage::kPartShape:
    case Stage::kTilesShape:
      return wanted_;
    case Stage::kTilesHead:
      return kTilesHeadBytes;
    case Stage::kDone:
    case Stage::kFailed:
      return 0;
  }
  return 0;
}

Status EncodedPullDecoder::Feed(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    if (stage_ == Stage::kFailed) return Malformed("failed");
    if (stage_ == Stage::kDone) {
      stage_ = Stage::kFailed;
      return Malformed("bytes after the end");
    }
    const uint64_t take = std::min<uint64_t>(bytes.size(), Wanted() - buffer_.size());
    buffer_.append(reinterpret_cast<const char*>(bytes.data()), take);
    bytes = bytes.subspan(take);
    if (buffer_.size() == Wanted()) {
      const Status s = Complete();
      if (!s.ok()) {
        stage_ = Stage::kFailed;
        return s;
      }
    }
  }
  return Status::Ok();
}

Status EncodedPullDecoder::Write(std::string_view bytes) {
  sha_.Update(bytes);
  restored_bytes_ += bytes.size();
  return write_(bytes);
}

Status EncodedPullDecoder::Complete() {
  ByteReader r(buffer_, "encoded pull body");
  switch (stage_) {
    case Stage::kPreamble: {
      if (std::string_view(buffer_).substr(0, kEncodedPullMagic.size()) != kEncodedPullMagic) {
        return Malformed("does not start with " + std::string(kEncodedPullMagic));
      }
      std::span<const uint8_t> magic;
      uint8_t format = 0;
      CKPT_RETURN_IF_ERROR(r.GetSpan(kEncodedPullMagic.size(), &magic));
      CKPT_RETURN_IF_ERROR(r.GetU8(&format));
      if (format < kEncodedPullFormatVersion || format > kEncodedPullTiledPartFormatVersion) {
        return Malformed("format " + std::to_string(format) + " is not " +
                         std::to_string(kEncodedPullFormatVersion) + " to " +
                         std::to_string(kEncodedPullTiledPartFormatVersion) + " (a newer ckptd?)");
      }
      format_ = format;
      CKPT_RETURN_IF_ERROR(r.GetU64(&version_));
      CKPT_RETURN_IF_ERROR(r.GetU64(&since_version_));
      if (!whole_version() && since_version_ != 0) {
        return Malformed("a part of a version is never sent since another");
      }
      CKPT_RETURN_IF_ERROR(r.GetU64(&wanted_));
      if (wanted_ < 8 || wanted_ > kMaxHeaderBytes) return Malformed("header length out of range");
      stage_ = Stage::kHeader;
      break;
    }
    case Stage::kHeader: {
      raw_header_ = std::move(buffer_);
      CKPT_ASSIGN_OR_RETURN(header_, ParseRawSafetensorsHeader(raw_header_));
      stage_ = Stage::kDigest;
      if (!whole_version()) {  // no digest
        CKPT_RETURN_IF_ERROR(Write(raw_header_));
        stage_ = Stage::kTag;
      }
      break;
    }
    case Stage::kDigest:
      announced_sha256_ = buffer_;
      CKPT_RETURN_IF_ERROR(Write(raw_header_));
      stage_ = Stage::kTag;
      break;
    case Stage::kTag: {
      const uint8_t tag = static_cast<uint8_t>(buffer_[0]);
      if (tag == kLinkTag) {
        stage_ = Stage::kLinkHead;
      } else if (tag == kPartTag && !whole_version()) {
        stage_ = Stage::kPartHead;
      } else if (tag == kTilesTag && format_ >= kEncodedPullTiledFormatVersion) {
        stage_ = Stage::kTilesHead;
      } else if (tag == kEndTag) {
        CKPT_RETURN_IF_ERROR(EndChunk());
        CKPT_RETURN_IF_ERROR(DecodeWindow());
        stage_ = Stage::kDone;
      } else {
        return Malformed("unknown frame type " + std::to_string(tag));
      }
      break;
    }
    case Stage::kLinkHead: {
      uint8_t base = 0;
      CKPT_RETURN_IF_ERROR(r.GetU32(&link_tensor_));
      CKPT_RETURN_IF_ERROR(r.GetU32(&link_chunk_));
      CKPT_RETURN_IF_ERROR(r.GetU8(&base));
      CKPT_RETURN_IF_ERROR(r.GetU64(&wanted_));
      if (base > static_cast<uint8_t>(LinkBase::kSince)) return Malformed("unknown link base");
      link_base_ = static_cast<LinkBase>(base);
      if (wanted_ == 0 || wanted_ > kMaxRecordBytes) return Malformed("record length out of range");
      stage_ = Stage::kRecord;
      break;
    }
    case Stage::kRecord:
      CKPT_RETURN_IF_ERROR(OnLink(std::move(buffer_)));
      stage_ = Stage::kTag;
      break;
    case Stage::kPartHead:
    case Stage::kTilesHead: {
      // A part frame says its stored bytes; a tiles frame, its tile counts after its box.
      const bool tiles = stage_ == Stage::kTilesHead;
      uint8_t dims = 0;
      part_head_ = Part();
      CKPT_RETURN_IF_ERROR(r.GetU32(&part_head_.tensor));
      if (!tiles) CKPT_RETURN_IF_ERROR(r.GetU64(&part_head_.stored_bytes));
      CKPT_RETURN_IF_ERROR(r.GetU64(&part_head_.chunk_bytes));
      CKPT_RETURN_IF_ERROR(r.GetU8(&dims));
      if (dims > kMaxPartDims || (tiles && dims == 0)) {
        return Malformed("a part or tiles frame declares no or too many dimensions");
      }
      wanted_ = uint64_t{dims} * (tiles ? 20 : 16);
      stage_ = tiles ? Stage::kTilesShape : Stage::kPartShape;
      if (dims == 0) {
        CKPT_RETURN_IF_ERROR(OnPart(0));
        stage_ = Stage::kTag;
      }
      break;
    }
    case Stage::kPartShape:
      CKPT_RETURN_IF_ERROR(OnPart(wanted_ / 16));
      stage_ = Stage::kTag;
      break;
    case Stage::kTilesShape:
      CKPT_RETURN_IF_ERROR(OnTiles(wanted_ / 20));
      stage_ = Stage::kTag;
      break;
    case Stage::kDone:
    case Stage::kFailed:
      break;
  }
  buffer_.clear();
  return Status::Ok();
}

Status EncodedPullDecoder::OnPart(uint64_t dims) {
  ByteReader r(buffer_, "encoded pull body");
  auto part = std::make_shared<Part>(std::move(part_head_));
  part_head_ = Part();
  part->stored_shape.resize(dims);
  part->box.offsets.resize(dims);
  for (uint64_t& extent : part->stored_shape) CKPT_RETURN_IF_ERROR(r.GetU64(&extent));
  for (uint64_t& offset : part->box.offsets) CKPT_RETURN_IF_ERROR(r.GetU64(&offset));
  return StartPart(std::move(part), {});
}

Status EncodedPullDecoder::OnTiles(uint64_t dims) {
  ByteReader r(buffer_, "encoded pull body");
  auto part = std::make_shared<Part>(std::move(part_head_));
  part_head_ = Part();
  part->stored_shape.resize(dims);
  part->box.offsets.resize(dims);
  std::vector<uint32_t> tile_counts(dims);
  for (uint64_t& extent : part->stored_shape) CKPT_RETURN_IF_ERROR(r.GetU64(&extent));
  for (uint64_t& offset : part->box.offsets) CKPT_RETURN_IF_ERROR(r.GetU64(&offset));
  for (uint32_t& count : tile_counts) CKPT_RETURN_IF_ERROR(r.GetU32(&count));
  if (part->tensor >= header_.tensors.size()) return Malformed("part: tensor index out of range");
  // A tiles frame says no stored length: its shape's.
  part->stored_bytes = DTypeSize(header_.tensors[part->tensor].dtype);
  for (uint64_t extent : part->stored_shape) {
    if (__builtin_mul_overflow(part->stored_bytes, extent, &part->stored_bytes)) {
      return Malformed("tiles of tensor '" + header_.tensors[part->tensor].name +
                       "': its stored shape has more bytes than can be addressed");
    }
  }
  return StartPart(std::move(part), tile_counts);
}

Status EncodedPullDecoder::StartPart(std::shared_ptr<Part> part,
                                     std::span<const uint32_t> tile_counts) {
  const size_t dims = part->stored_shape.size();
  if (part->tensor >= header_.tensors.size()) return Malformed("part: tensor index out of range");
  const TensorInfo& t = header_.tensors[part->tensor];
  const std::string where = "part of tensor '" + t.name + "'";
  CKPT_RETURN_IF_ERROR(EndChunk());
  // A part comes where its tensor's bytes begin, once the tensors before it are complete.
  const uint32_t previous = part_ ? part_->tensor : 0;
  const bool after =
      (!have_chunk_ || part->tensor > current_.tensor) && (!part_ || part->tensor > previous);
  if (!after || next_offset_ != t.begin) return Malformed(where + " is out of body order");
  if (dims != t.shape.size()) return Malformed(where + ": its rank is not the tensor's");
  part->box.shape = t.shape;
  if (!CheckBoxWithin(t.name, part->box, part->stored_shape).ok()) {
    return Malformed(where + ": its box does not lie within its stored tensor");
  }
  const uint64_t element = DTypeSize(t.dtype);
  uint64_t stored = element;
  for (uint64_t extent : part->stored_shape) {
    if (__builtin_mul_overflow(stored, extent, &stored)) {
      return Malformed(where + ": its stored shape has more bytes than can be addressed");
    }
  }
  if (stored != part->stored_bytes) {
    return Malformed(where + ": its stored bytes do not match its stored shape");
  }
  if (part->chunk_bytes == 0 || part->chunk_bytes > kMaxChunkBytes) {
    return Malformed(where + ": its chunk length is out of range");
  }
  if (part->chunk_bytes % element != 0) {
    return Malformed(where + ": its chunk length is not a multiple of its element");
  }
  if (!tile_counts.empty()) {
    if (whole_version() && part->stored_shape != t.shape) {
      return Malformed(where + ": a whole version's tensor is sent whole");
    }
    auto grid = ChunkGrid::Make(part->stored_shape, tile_counts, part->chunk_bytes / element);
    if (!grid.ok()) return Malformed(where + ": its tiles " + grid.status().message());
    if (grid->chunk_count() > kMaxTiledChunks) {
      return Malformed(where + ": its stored tensor has too many chunks");
    }
    for (const auto& [begin, end] : grid->ChunkRanges(part->box)) {
      for (uint32_t c = begin; c < end; ++c) part->chunks.push_back(c);
    }
    part->grid = std::move(grid).value();
    part->empty = part->chunks.empty();
    if (!part->empty) {
      part->first_chunk = part->chunks.front();
      part->last_chunk = part->chunks.back();
    }
    part_ = std::move(part);
    return Status::Ok();
  }
  if (stored / part->chunk_bytes + (stored % part->chunk_bytes != 0) > UINT32_MAX) {
    return Malformed(where + ": its stored tensor has too many chunks");
  }
  const auto chunks = ChunksHoldingBox(part->stored_shape, part->box, element, part->chunk_bytes);
  part->empty = !chunks;
  if (chunks) std::tie(part->first_chunk, part->last_chunk) = *chunks;
  part_ = std::move(part);
  return Status::Ok();
}

Status EncodedPullDecoder::OnLink(std::string bytes) {
  if (link_tensor_ >= header_.tensors.size()) return Malformed("tensor index out of range");
  const TensorInfo& t = header_.tensors[link_tensor_];
  const std::string where = "tensor '" + t.name + "' chunk " + std::to_string(link_chunk_);
  const bool continues = have_chunk_ && !current_.links.empty() &&
                         link_tensor_ == current_.tensor && link_chunk_ == current_.chunk;
  if (continues != (link_base_ == LinkBase::kPrevious)) {
    return Malformed(where + ": a link out of its chain");
  }
  CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(bytes));
  if (record.raw_length > kMaxChunkBytes) return Malformed(where + " is longer than any chunk");
  if (!whole_version() && link_base_ == LinkBase::kSince) {
    return Malformed(where + ": a link from 'since' in a part of a version");
  }
  const bool in_part = part_ != nullptr && part_->tensor == link_tensor_;
  if (!continues && in_part) {
    CKPT_RETURN_IF_ERROR(EndChunk());
    // A part's links are the chunks that hold its box, in order.
    const bool first = !have_chunk_ || current_.tensor != link_tensor_;
    const uint64_t element = DTypeSize(t.dtype);
    uint64_t begin = 0, length = 0;
    if (part_->grid) {
      if (part_->chunks_received == part_->chunks.size() ||
          link_chunk_ != part_->chunks[part_->chunks_received]) {
        return Malformed(where + " is not the next chunk holding its part");
      }
      ++part_->chunks_received;
      length = part_->grid->ChunkElements(link_chunk_) * element;
    } else {
      const uint32_t expected = first ? part_->first_chunk : current_.chunk + 1;
      if (part_->empty || link_chunk_ != expected || link_chunk_ > part_->last_chunk) {
        return Malformed(where + " is not the next chunk holding its part");
      }
      begin = uint64_t{link_chunk_} * part_->chunk_bytes;
      length = std::min(part_->chunk_bytes, part_->stored_bytes - begin);
    }
    if (record.raw_length != length) return Malformed(where + ": its length is not its chunk's");
    if (link_base_ == LinkBase::kSince) {  // a whole tensor's tiles, in a whole version
      const auto held = since_ ? since_->TensorData(t.name) : std::nullopt;
      bool same_shape = false;
      for (const TensorInfo& h : since_ ? since_->header().tensors : std::vector<TensorInfo>{}) {
        same_shape = same_shape || (h.name == t.name && h.shape == t.shape);
      }
      if (!held || held->size() != t.byte_size() || part_->stored_shape != t.shape || !same_shape) {
        return Status::FailedPrecondition(where + " is sent as a delta against version " +
                                          std::to_string(since_version_) +
                                          ", and the reconstruction held has no such tensor");
      }
    }
    have_chunk_ = true;
    current_ = PendingChunk{link_tensor_, link_chunk_, begin, part_, {}, Status::Ok(), {}};
    current_length_ = record.raw_length;
  } else if (!continues) {
    CKPT_RETURN_IF_ERROR(EndChunk());
    // Chunks come in body order: the next of the same tensor, or the first of a later one once
    // the tensors before it are complete.
    const bool next_of_same =
        have_chunk_ && link_tensor_ == current_.tensor && link_chunk_ == current_.chunk + 1;
    const bool first_of_next = link_chunk_ == 0 &&
                               (!have_chunk_ || link_tensor_ > current_.tensor) &&
                               next_offset_ == t.begin;
    if (!next_of_same && !first_of_next) return Malformed(where + " is out of body order");
    if (record.raw_length > t.end - next_offset_) return Malformed(where + " runs past its tensor");
    have_chunk_ = true;
    current_ = PendingChunk{link_tensor_, link_chunk_, next_offset_, nullptr, {}, Status::Ok(), {}};
    current_length_ = record.raw_length;
    if (link_base_ == LinkBase::kSince) {
      const auto held = since_ ? since_->TensorData(t.name) : std::nullopt;
      if (!held || held->size() != t.byte_size()) {
        return Status::FailedPrecondition(where + " is sent as a delta against version " +
                                          std::to_string(since_version_) +
                                          ", and the reconstruction held has no such tensor");
      }
    }
  } else if (record.raw_length != current_length_) {
    return Malformed(where + ": its base has another length");
  }
  current_.links.push_back({std::move(bytes), link_base_});
  return Status::Ok();
}

Status EncodedPullDecoder::EndChunk() {
  if (!have_chunk_ || current_.links.empty()) return Status::Ok();
  if (current_.part == nullptr) {
    next_offset_ += current_length_;
  } else if (current_.chunk == current_.part->last_chunk) {  // the part is complete
    next_offset_ += header_.tensors[current_.tensor].byte_size();
  }
  window_.push_back(std::move(current_));
  current_.links.clear();
  if (window_.size() >= 2 * threads_) return DecodeWindow();
  return Status::Ok();
}

Status EncodedPullDecoder::DecodeChunk(PendingChunk& chunk) const {
  const TensorInfo& t = header_.tensors[chunk.tensor];
  const std::string where = "tensor '" + t.name + "' chunk " + std::to_string(chunk.chunk);
  std::vector<uint8_t> previous;
  for (const Link& link : chunk.links) {
    CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(link.bytes));
    std::optional<std::span<const uint8_t>> reference;
    if (link.base == LinkBase::kPrevious) {
      previous = std::move(chunk.decoded);
      reference = std::span<const uint8_t>(previous);
    } else if (link.base == LinkBase::kSince && chunk.part != nullptr && chunk.part->grid) {
      // A tile's chunk: gathered from the tensor held (OnLink checked it is the whole one).
      const ChunkGrid& grid = *chunk.part->grid;
      previous.resize(record.raw_length);
      const TensorBox whole = WholeBox(t.shape);
      CopyBoxToChunk(grid, whole, chunk.chunk, DTypeSize(t.dtype), *since_->TensorData(t.name),
                     previous);
      reference = std::span<const uint8_t>(previous);
    } else if (link.base == LinkBase::kSince) {
      reference = since_->TensorData(t.name)->subspan(chunk.offset - t.begin, record.raw_length);
    }
    CKPT_ASSIGN_OR_RETURN(const TensorCodec* codec, CodecForDecoding(record.codec_id));
    chunk.decoded.assign(record.raw_length, 0);
    CKPT_RETURN_IF_ERROR(codec->Decode(t.dtype, AsBytes(record.payload), reference, chunk.decoded));
    if (Xxh3Checksum(chunk.decoded) != record.raw_checksum) {
      return Status::DataLoss(
          where + " does not decode to the bytes its record names" +
          (link.base == LinkBase::kSince
               ? ": the reconstruction held is not version " + std::to_string(since_version_) + "'s"
               : ""));
    }
  }
  return Status::Ok();
}

Status EncodedPullDecoder::DecodeWindow() {
  if (window_.empty()) return Status::Ok();
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < window_.size();) {
      window_[k].status = DecodeChunk(window_[k]);
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < std::min(threads_, window_.size()); ++w) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  for (PendingChunk& chunk : window_) {
    CKPT_RETURN_IF_ERROR(chunk.status);
    if (chunk.part != nullptr) {
      CKPT_RETURN_IF_ERROR(WritePart(*chunk.part, chunk));
      continue;
    }
    CKPT_RETURN_IF_ERROR(
        Write({reinterpret_cast<const char*>(chunk.decoded.data()), chunk.decoded.size()}));
  }
  window_.clear();
  return Status::Ok();
}

Status EncodedPullDecoder::WritePart(Part& part, const PendingChunk& chunk) {
  const uint64_t element = DTypeSize(header_.tensors[part.tensor].dtype);
  if (part.grid) {  // put together, then written whole
    if (part.assembled.empty()) part.assembled.resize(part.box.element_count() * element);
    CopyChunkToBox(*part.grid, part.box, chunk.chunk, element, chunk.decoded, part.assembled);
    if (chunk.chunk != part.last_chunk) return Status::Ok();
    CKPT_RETURN_IF_ERROR(
        Write({reinterpret_cast<const char*>(part.assembled.data()), part.assembled.size()}));
    part.assembled = {};
    return Status::Ok();
  }
  const uint64_t chunk_begin = chunk.offset, chunk_end = chunk.offset + chunk.decoded.size();
  const char* const bytes = reinterpret_cast<const char*>(chunk.decoded.data());
  if (!part.runs) part.runs.emplace(part.stored_shape, part.box);
  auto flush = [&]() -> Status {
    if (part.gathered.empty()) return Status::Ok();
    const Status s = Write(part.gathered);
    part.gathered.clear();
    return s;
  };
  bool runs_left = true;
  for (;;) {
    if (part.run_begin == part.run_end) {
      uint64_t first = 0, count = 0;
      if (!part.runs->Next(&first, &count)) {
        runs_left = false;
        break;
      }
      part.run_begin = first * element;
      part.run_end = (first + count) * element;
      // OnPart checked the stored tensor's bytes fit: runs lie within it.
      if (part.run_end <= part.run_begin || part.run_end > part.stored_bytes) {
        return Malformed("a part's box runs outside its stored tensor");
      }
    }
    if (part.run_begin >= chunk_end) break;
    if (part.run_begin < chunk_begin) return Malformed("a part's chunk is missing");
    const uint64_t take = std::min(part.run_end, chunk_end) - part.run_begin;
    if (part.run_begin - chunk_begin + take > chunk.decoded.size()) {
      return Malformed("a part's box runs outside its chunk");
    }
    const std::string_view from(bytes + (part.run_begin - chunk_begin), take);
    part.run_begin += take;
    if (take >= kDirectBytes) {
      CKPT_RETURN_IF_ERROR(flush());
      CKPT_RETURN_IF_ERROR(Write(from));
      continue;
    }
    part.gathered.append(from);
    if (part.gathered.size() >= kGatherBytes) CKPT_RETURN_IF_ERROR(flush());
  }
  if (chunk.chunk != part.last_chunk) return Status::Ok();
  CKPT_RETURN_IF_ERROR(flush());
  if (runs_left && (part.run_begin != part.run_end || [&] {
        uint64_t first = 0, count = 0;
        return part.runs->Next(&first, &count);
      }())) {
    return Malformed("a part's chunks end before its box");
  }
  part.runs.reset();
  return Status::Ok();
}

Status EncodedPullDecoder::Finish() {
  if (stage_ != Stage::kDone) return Malformed("truncated (no end frame)");
  if (next_offset_ != header_.data_size) {
    return Malformed("ended after " + std::to_string(next_offset_) + " of " +
                     std::to_string(header_.data_size) + " data bytes");
  }
  sha256_ = sha_.FinishHex();
  if (whole_version() && sha256_ != announced_sha256_) {
    return Status::DataLoss(
        "encoded pull body: the restored body's SHA-256 is not the one "
        "announced");
  }
  return Status::Ok();
}

}  // namespace ckpt
