#include "ckpt/codec/encoded_body.h"

#include <algorithm>
#include <bit>

#include "ckpt/base/binary.h"

namespace ckpt {
namespace {

constexpr uint8_t kChunkTag = 1;
constexpr uint8_t kEndTag = 2;
constexpr uint8_t kRawTag = 3;
constexpr uint64_t kRawFixedBytes = 4 + 8 + 8;
constexpr uint64_t kPreambleBytes = 7 + 1 + 8 + 8 + 8;
constexpr uint64_t kChunkFixedBytes = 4 + 4 + 1 + 8 + 8 + 8 + 8;
constexpr uint64_t kSha256HexBytes = 64;
constexpr uint64_t kEndBytes = 2 * kSha256HexBytes;

bool IsLowerHex(std::string_view s) {
  return s.size() == kSha256HexBytes && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

std::string EncodePreamble(const EncodedBodyPreamble& preamble) {
  ByteWriter w;
  w.PutBytes(kEncodedBodyMagic);
  w.PutU8(preamble.format);
  w.PutU64(preamble.plan_digest);
  w.PutU64(preamble.reference);
  w.PutU64(preamble.raw_header.size());
  w.PutBytes(preamble.raw_header);
  return w.Release();
}

std::string EncodeChunkFrame(const EncodedChunkFrame& frame) {
  ByteWriter w;
  w.PutU8(kChunkTag);
  w.PutU32(frame.tensor);
  w.PutU32(frame.chunk);
  w.PutU8(frame.info.quantizer);
  w.PutU64(std::bit_cast<uint64_t>(frame.info.bound));
  w.PutU64(frame.info.exact_elements);
  w.PutU64(std::bit_cast<uint64_t>(frame.info.model_entropy_bits));
  w.PutU64(frame.record.size());
  w.PutBytes(frame.record);
  return w.Release();
}

std::string EncodeRawFrameHead(uint32_t tensor, uint64_t offset, uint64_t length) {
  ByteWriter w;
  w.PutU8(kRawTag);
  w.PutU32(tensor);
  w.PutU64(offset);
  w.PutU64(length);
  return w.Release();
}

std::string EncodeEnd(const EncodedBodyEnd& end) {
  ByteWriter w;
  w.PutU8(kEndTag);
  w.PutBytes(end.pushed_sha256);
  w.PutBytes(end.restored_sha256);
  return w.Release();
}

EncodedBodyParser::EncodedBodyParser(EncodedBodySink* sink, uint64_t max_header_bytes,
                                     uint64_t max_record_bytes, uint8_t format)
    : sink_(sink),
      max_header_bytes_(max_header_bytes),
      max_record_bytes_(max_record_bytes),
      format_(format) {}

uint64_t EncodedBodyParser::Wanted() const {
  switch (stage_) {
    case Stage::kPreamble:
      return kPreambleBytes;
    case Stage::kHeader:
    case Stage::kRecord:
      return wanted_;
    case Stage::kFrameTag:
      return 1;
    case Stage::kChunkFixed:
      return kChunkFixedBytes;
    case Stage::kRawFixed:
      return kRawFixedBytes;
    case Stage::kRawData:
      return 0;  // streamed: Feed hands the bytes on as they come
    case Stage::kEnd:
      return kEndBytes;
    case Stage::kDone:
    case Stage::kFailed:
      return 0;
  }
  return 0;
}

Status EncodedBodyParser::Fail(std::string message) {
  stage_ = Stage::kFailed;
  return Status::InvalidArgument("encoded push body: " + std::move(message));
}

Status EncodedBodyParser::Feed(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    if (stage_ == Stage::kFailed) return Status::InvalidArgument("encoded push body: failed");
    if (stage_ == Stage::kDone) return Fail("bytes after the end frame");
    if (stage_ == Stage::kRawData) {
      const uint64_t take = std::min<uint64_t>(bytes.size(), raw_left_);
      Status s = sink_->OnRaw(raw_tensor_, raw_offset_, bytes.first(take));
      if (!s.ok()) {
        stage_ = Stage::kFailed;
        return s;
      }
      bytes = bytes.subspan(take);
      consumed_ += take;
      raw_offset_ += take;
      raw_left_ -= take;
      if (raw_left_ == 0) stage_ = Stage::kFrameTag;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(bytes.size(), Wanted() - buffer_.size());
    buffer_.append(reinterpret_cast<const char*>(bytes.data()), take);
    bytes = bytes.subspan(take);
    consumed_ += take;
    if (buffer_.size() == Wanted()) {
      Status s = Complete();
      if (!s.ok()) {
        stage_ = Stage::kFailed;
        return s;
      }
    }
  }
  return Status::Ok();
}

Status EncodedBodyParser::Complete() {
  ByteReader r(buffer_, "encoded push body");
  switch (stage_) {
    case Stage::kPreamble: {
      if (std::string_view(buffer_).substr(0, kEncodedBodyMagic.size()) != kEncodedBodyMagic) {
        return Fail("does not start with " + std::string(kEncodedBodyMagic) +
                    " (an encoded push body was announced)");
      }
      std::span<const uint8_t> magic;
      CKPT_RETURN_IF_ERROR(r.GetSpan(kEncodedBodyMagic.size(), &magic));
      uint8_t format = 0;
      CKPT_RETURN_IF_ERROR(r.GetU8(&format));
      if (format != format_) {
        return Fail("format " + std::to_string(format) + " is not " + std::to_string(format_) +
                    (format_ == kEncodedShardFormatVersion
                         ? " (a shard is sent as " + std::string(kEncodedShardMediaType) + ")"
                         : std::string(" (a newer client?)")));
      }
      preamble_.format = format;
      CKPT_RETURN_IF_ERROR(r.GetU64(&preamble_.plan_digest));
      CKPT_RETURN_IF_ERROR(r.GetU64(&preamble_.reference));
      CKPT_RETURN_IF_ERROR(r.GetU64(&wanted_));
      if (wanted_ < 8 || wanted_ > max_header_bytes_) {
        return Fail("a checkpoint header of " + std::to_string(wanted_) + " bytes is outside 8.." +
                    std::to_string(max_header_bytes_));
      }
      stage_ = Stage::kHeader;
      break;
    }
    case Stage::kHeader:
      preamble_.raw_header = std::move(buffer_);
      CKPT_RETURN_IF_ERROR(sink_->OnPreamble(preamble_));
      preamble_.raw_header.clear();
      stage_ = Stage::kFrameTag;
      break;
    case Stage::kFrameTag: {
      const uint8_t tag = static_cast<uint8_t>(buffer_[0]);
      if (tag == kChunkTag) {
        stage_ = Stage::kChunkFixed;
      } else if (tag == kEndTag) {
        stage_ = Stage::kEnd;
      } else if (tag == kRawTag && format_ == kEncodedShardFormatVersion) {
        stage_ = Stage::kRawFixed;
      } else {
        return Fail("unknown frame type " + std::to_string(tag));
      }
      break;
    }
    case Stage::kChunkFixed: {
      uint64_t bound_bits = 0, entropy_bits = 0;
      frame_ = EncodedChunkFrame{};
      CKPT_RETURN_IF_ERROR(r.GetU32(&frame_.tensor));
      CKPT_RETURN_IF_ERROR(r.GetU32(&frame_.chunk));
      CKPT_RETURN_IF_ERROR(r.GetU8(&frame_.info.quantizer));
      CKPT_RETURN_IF_ERROR(r.GetU64(&bound_bits));
      CKPT_RETURN_IF_ERROR(r.GetU64(&frame_.info.exact_elements));
      CKPT_RETURN_IF_ERROR(r.GetU64(&entropy_bits));
      CKPT_RETURN_IF_ERROR(r.GetU64(&wanted_));
      frame_.info.bound = std::bit_cast<double>(bound_bits);
      frame_.info.model_entropy_bits = std::bit_cast<double>(entropy_bits);
      if (wanted_ == 0 || wanted_ > max_record_bytes_) {
        return Fail("chunk " + std::to_string(frame_.chunk) + " of tensor " +
                    std::to_string(frame_.tensor) + ": a record of " + std::to_string(wanted_) +
                    " bytes is outside 1.." + std::to_string(max_record_bytes_));
      }
      stage_ = Stage::kRecord;
      break;
    }
    case Stage::kRawFixed: {
      CKPT_RETURN_IF_ERROR(r.GetU32(&raw_tensor_));
      CKPT_RETURN_IF_ERROR(r.GetU64(&raw_offset_));
      CKPT_RETURN_IF_ERROR(r.GetU64(&raw_left_));
      if (raw_left_ == 0)
        return Fail("an empty raw frame of tensor " + std::to_string(raw_tensor_));
      // The sink checks the frame's place before a byte of it is taken.
      CKPT_RETURN_IF_ERROR(sink_->OnRaw(raw_tensor_, raw_offset_, {}));
      stage_ = Stage::kRawData;
      break;
    }
    case Stage::kRawData:
      break;
    case Stage::kRecord:
      frame_.record = buffer_;
      CKPT_RETURN_IF_ERROR(sink_->OnChunk(frame_));
      frame_.record = {};
      stage_ = Stage::kFrameTag;
      break;
    case Stage::kEnd: {
      EncodedBodyEnd end{buffer_.substr(0, kSha256HexBytes), buffer_.substr(kSha256HexBytes)};
      if (!IsLowerHex(end.pushed_sha256) || !IsLowerHex(end.restored_sha256)) {
        return Fail("the end frame's digests are not SHA-256 in lowercase hex");
      }
      CKPT_RETURN_IF_ERROR(sink_->OnEnd(end));
      stage_ = Stage::kDone;
      break;
    }
    case Stage::kDone:
    case Stage::kFailed:
      break;
  }
  buffer_.clear();
  return Status::Ok();
}

Status EncodedBodyParser::Finish() {
  if (stage_ == Stage::kDone) return Status::Ok();
  if (stage_ == Stage::kFailed) return Status::InvalidArgument("encoded push body: failed");
  stage_ = Stage::kFailed;
  return Status::InvalidArgument("encoded push body: truncated after " + std::to_string(consumed_) +
                                 " bytes (no end frame)");
}

}  // namespace ckpt
