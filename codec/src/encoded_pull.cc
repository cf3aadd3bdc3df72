#include "ckpt/codec/encoded_pull.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "ckpt/base/binary.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {
namespace {

constexpr uint8_t kLinkTag = 1;
constexpr uint8_t kEndTag = 2;
constexpr uint64_t kPreambleBytes = 7 + 1 + 8 + 8 + 8;
constexpr uint64_t kLinkHeadBytes = 4 + 4 + 1 + 8;
constexpr uint64_t kDigestBytes = 64;
// A header longer than this is refused before it is buffered.
constexpr uint64_t kMaxHeaderBytes = kMaxSafetensorsHeaderBytes + 8;
// A record longer than this is refused before it is buffered (far beyond any chunk).
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Status Malformed(std::string what) {
  return Status::InvalidArgument("encoded pull body: " + std::move(what));
}

}  // namespace

std::string EncodePullPreamble(uint64_t version, uint64_t since, std::string_view raw_header,
                               std::string_view restored_sha256) {
  ByteWriter w;
  w.PutBytes(kEncodedPullMagic);
  w.PutU8(kEncodedPullFormatVersion);
  w.PutU64(version);
  w.PutU64(since);
  w.PutU64(raw_header.size());
  w.PutBytes(raw_header);
  w.PutBytes(restored_sha256);
  return w.Release();
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
      if (format != kEncodedPullFormatVersion) {
        return Malformed("format " + std::to_string(format) + " is not " +
                         std::to_string(kEncodedPullFormatVersion) + " (a newer ckptd?)");
      }
      CKPT_RETURN_IF_ERROR(r.GetU64(&version_));
      CKPT_RETURN_IF_ERROR(r.GetU64(&since_version_));
      CKPT_RETURN_IF_ERROR(r.GetU64(&wanted_));
      if (wanted_ < 8 || wanted_ > kMaxHeaderBytes) return Malformed("header length out of range");
      stage_ = Stage::kHeader;
      break;
    }
    case Stage::kHeader: {
      raw_header_ = std::move(buffer_);
      CKPT_ASSIGN_OR_RETURN(header_, ParseRawSafetensorsHeader(raw_header_));
      stage_ = Stage::kDigest;
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
    case Stage::kDone:
    case Stage::kFailed:
      break;
  }
  buffer_.clear();
  return Status::Ok();
}

Status EncodedPullDecoder::OnLink(std::string bytes) {
  if (link_tensor_ >= header_.tensors.size()) return Malformed("tensor index out of range");
  const TensorInfo& t = header_.tensors[link_tensor_];
  const std::string where = "tensor '" + t.name + "' chunk " + std::to_string(link_chunk_);
  const bool continues =
      have_chunk_ && link_tensor_ == current_.tensor && link_chunk_ == current_.chunk;
  if (continues != (link_base_ == LinkBase::kPrevious)) {
    return Malformed(where + ": a link out of its chain");
  }
  CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(bytes));
  if (!continues) {
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
    current_ = PendingChunk{link_tensor_, link_chunk_, next_offset_, {}, Status::Ok(), {}};
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
  next_offset_ += current_length_;
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
    CKPT_RETURN_IF_ERROR(
        Write({reinterpret_cast<const char*>(chunk.decoded.data()), chunk.decoded.size()}));
  }
  window_.clear();
  return Status::Ok();
}

Status EncodedPullDecoder::Finish() {
  if (stage_ != Stage::kDone) return Malformed("truncated (no end frame)");
  if (next_offset_ != header_.data_size) {
    return Malformed("ended after " + std::to_string(next_offset_) + " of " +
                     std::to_string(header_.data_size) + " data bytes");
  }
  if (sha_.FinishHex() != announced_sha256_) {
    return Status::DataLoss(
        "encoded pull body: the restored body's SHA-256 is not the one "
        "announced");
  }
  return Status::Ok();
}

}  // namespace ckpt
