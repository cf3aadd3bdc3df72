// Encoded shards (encoded_shard.h).
#include "uploads/encoded_shard.h"

#include <algorithm>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/chunk_record.h"

namespace ckpt {
namespace {

constexpr size_t kReadBlockBytes = 1 << 20;

std::string TensorText(const ShardHeader& header, uint32_t tensor) {
  return "tensor " + std::to_string(tensor) + " ('" + header.tensors[tensor].name + "')";
}

}  // namespace

EncodedShardReader::EncodedShardReader(uint32_t shard, uint64_t max_record_bytes, PlanFn plan_of)
    : shard_(shard),
      plan_of_(std::move(plan_of)),
      parser_(this, kMaxSafetensorsHeaderBytes, max_record_bytes, kEncodedShardFormatVersion) {}

uint64_t EncodedShardReader::TensorBytes(uint32_t tensor) const {
  const ShardTensor& t = header_->tensors[tensor];
  return t.box.element_count() * DTypeSize(t.dtype);
}

Status EncodedShardReader::OnPreamble(const EncodedBodyPreamble& preamble) {
  CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header,
                        ParseRawSafetensorsHeader(preamble.raw_header));
  CKPT_ASSIGN_OR_RETURN(ShardHeader described, DescribeShard(shard_, header));
  if (plan_of_) {
    CKPT_ASSIGN_OR_RETURN(CodingPlan plan, plan_of_(described));
    const uint64_t reference = plan.base ? plan.base->reference : 0;
    if (preamble.reference != reference || preamble.plan_digest != plan.Digest()) {
      return Status::StalePlan(
          "encoded shard " + std::to_string(shard_) +
          " was coded by another plan than the one the store makes for it now (a version was "
          "pushed or the policy changed since, or the shard's index, count or header differ "
          "from those it was planned with): ask for a new plan of the shard and encode it "
          "again");
    }
    plan_ = std::move(plan);
  }
  index_.plan_digest = preamble.plan_digest;
  index_.reference = preamble.reference;
  index_.raw_header = preamble.raw_header;
  index_.tensors.resize(described.tensors.size());
  header_ = std::move(described);
  return Status::Ok();
}

Status EncodedShardReader::CheckPlace(uint32_t tensor, uint64_t offset, std::string_view what) {
  const std::string where = "encoded shard " + std::to_string(shard_) + ": " + std::string(what);
  if (tensor >= header_->tensors.size()) {
    return Status::InvalidArgument(where + " of tensor " + std::to_string(tensor) +
                                   ", which the shard's header does not have");
  }
  if (tensor < tensor_) {
    return Status::InvalidArgument(where + " of " + TensorText(*header_, tensor) +
                                   " comes after the bytes of a later tensor");
  }
  while (tensor_ < tensor) {
    if (cursor_ != TensorBytes(tensor_)) {
      return Status::InvalidArgument(where + " of " + TensorText(*header_, tensor) +
                                     " comes before the rest of " + TensorText(*header_, tensor_) +
                                     " (from byte " + std::to_string(cursor_) + ")");
    }
    ++tensor_;
    cursor_ = 0;
  }
  if (offset != cursor_) {
    return Status::InvalidArgument(where + " of " + TensorText(*header_, tensor) +
                                   " starts at byte " + std::to_string(offset) + ", not " +
                                   std::to_string(cursor_) + " where the one before it ended");
  }
  return Status::Ok();
}

Status EncodedShardReader::OnChunk(const EncodedChunkFrame& frame) {
  const std::string what = "chunk " + std::to_string(frame.chunk);
  auto record = ChunkRecord::DecodeFrom(frame.record);
  if (!record.ok()) {
    return Status::InvalidArgument("encoded shard " + std::to_string(shard_) + ": " + what +
                                   " of tensor " + std::to_string(frame.tensor) + ": " +
                                   record.status().message());
  }
  // Without a plan, a chunk is where the bytes before it ended (the first of a tensor at 0).
  uint64_t offset = frame.tensor == tensor_ ? cursor_ : 0;
  ChunkCodingInfo info = frame.info;
  if (plan_ && frame.tensor < plan_->tensors.size()) {
    const PlannedTensor& t = plan_->tensors[frame.tensor];
    const std::string where =
        "encoded shard " + std::to_string(shard_) + ": " + what + " of tensor '" + t.name + "'";
    if (frame.chunk < t.slice->owned_begin || frame.chunk >= t.slice->owned_end) {
      return Status::InvalidArgument(where + " is not a chunk the shard's slice holds whole (" +
                                     std::to_string(t.slice->owned_begin) + " to " +
                                     std::to_string(t.slice->owned_end) +
                                     ", end excluded): send its bytes raw");
    }
    const uint64_t element = DTypeSize(t.dtype);
    if (t.tile_counts.empty()) {
      offset = uint64_t{frame.chunk} * t.chunk_bytes -
               BoxElementSpan(t.shape, t.slice->box).first * element;
    } else {  // the slice is the chunk's tile (ChunksInside): its chunks are runs of its bytes
      CKPT_ASSIGN_OR_RETURN(const ChunkGrid grid, t.Grid());
      offset = grid.FirstElementInTile(frame.chunk) * element;
    }
    const Status follows = CheckChunkFollowsPlan(t, frame.chunk, *record, &info);
    if (!follows.ok()) return Status::InvalidArgument(where + ": " + follows.message());
  }
  CKPT_RETURN_IF_ERROR(CheckPlace(frame.tensor, offset, what));
  if (record->raw_length == 0 || record->raw_length > TensorBytes(frame.tensor) - cursor_) {
    return Status::InvalidArgument("encoded shard " + std::to_string(shard_) + ": " + what +
                                   " runs past the end of " + TensorText(*header_, frame.tensor));
  }
  EncodedShardIndex::Segment segment;
  segment.chunk = frame.chunk;
  segment.offset = cursor_;
  segment.length = record->raw_length;
  segment.file_offset = parser_.consumed() - frame.record.size();
  segment.record_bytes = frame.record.size();
  segment.info = info;
  index_.tensors[frame.tensor].push_back(segment);
  cursor_ += record->raw_length;
  return Status::Ok();
}

Status EncodedShardReader::OnRaw(uint32_t tensor, uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) {  // a raw frame's head (its bytes never come in empty pieces)
    CKPT_RETURN_IF_ERROR(CheckPlace(tensor, offset, "raw bytes"));
    EncodedShardIndex::Segment segment;
    segment.raw = true;
    segment.offset = cursor_;
    segment.file_offset = parser_.consumed();
    index_.tensors[tensor].push_back(segment);  // its length grows with its bytes
    return Status::Ok();
  }
  if (cursor_ + bytes.size() > TensorBytes(tensor)) {
    return Status::InvalidArgument("encoded shard " + std::to_string(shard_) +
                                   ": raw bytes run past the end of " +
                                   TensorText(*header_, tensor));
  }
  index_.tensors[tensor].back().length += bytes.size();
  cursor_ += bytes.size();
  return Status::Ok();
}

Status EncodedShardReader::OnEnd(const EncodedBodyEnd& end) {
  for (; tensor_ < header_->tensors.size(); ++tensor_, cursor_ = 0) {
    if (cursor_ != TensorBytes(tensor_)) {
      return Status::InvalidArgument(
          "encoded shard " + std::to_string(shard_) + ": the body ended before the rest of " +
          TensorText(*header_, tensor_) + " (from byte " + std::to_string(cursor_) + ")");
    }
  }
  index_.pushed_sha256 = end.pushed_sha256;
  ended_ = true;
  return Status::Ok();
}

Status EncodedShardReader::Finish() {
  CKPT_RETURN_IF_ERROR(parser_.Finish());
  if (!ended_) return Status::InvalidArgument("encoded shard: the body has no end");
  return Status::Ok();
}

Result<EncodedShardIndex> IndexStoredShard(uint32_t shard, const SpooledShardFile& file,
                                           uint64_t max_record_bytes) {
  EncodedShardReader reader(shard, max_record_bytes, nullptr);
  std::vector<uint8_t> block(kReadBlockBytes);
  for (uint64_t at = 0; at < file.body_bytes();) {
    const uint64_t n = std::min<uint64_t>(block.size(), file.body_bytes() - at);
    CKPT_RETURN_IF_ERROR(file.ReadAt(at, std::span<uint8_t>(block.data(), n)));
    Status fed = reader.Feed(std::span<const uint8_t>(block.data(), n));
    if (!fed.ok())
      return Status::DataLoss("stored encoded shard " + std::to_string(shard) +
                              " is damaged: " + fed.message());
    at += n;
  }
  Status finished = reader.Finish();
  if (!finished.ok()) {
    return Status::DataLoss("stored encoded shard " + std::to_string(shard) +
                            " is damaged: " + finished.message());
  }
  return std::move(reader.index());
}

Result<bool> IsEncodedShard(const SpooledShardFile& file) {
  if (file.body_bytes() < kEncodedBodyMagic.size()) return false;
  std::string magic(kEncodedBodyMagic.size(), '\0');
  CKPT_RETURN_IF_ERROR(
      file.ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(magic.data()), magic.size())));
  return magic == kEncodedBodyMagic;
}

}  // namespace ckpt
