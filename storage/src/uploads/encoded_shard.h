// A shard coded by its rank (an encoded shard, docs/format.md "Encoded push body", format 2):
// read as it arrives — checked against the plan the daemon makes for it, and indexed — and
// indexed again from the spool at open. The commit reads its chunk records and raw bytes through
// the index (shard_assembly.h). Internal to storage/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/encoded_body.h"
#include "uploads/shard_assembly.h"
#include "backends/upload_spool.h"

namespace ckpt {

// Where the bytes of an encoded shard's tensors lie in its body (= its spool file).
struct EncodedShardIndex {
  // A run of a tensor's bytes: sent raw, or one global chunk coded by the rank.
  struct Segment {
    bool raw = false;
    uint32_t chunk = 0;         // coded: the global tensor's chunk
    uint64_t offset = 0;        // in the tensor's bytes (the shard's slice, row-major)
    uint64_t length = 0;        // tensor bytes covered
    uint64_t file_offset = 0;   // of the raw bytes, or of the chunk record
    uint64_t record_bytes = 0;  // coded
    ChunkCodingInfo info;       // coded: what the rank's encoder reported
  };
  uint64_t plan_digest = 0;
  uint64_t reference = 0;
  std::string raw_header;                     // the shard's safetensors header
  std::vector<std::vector<Segment>> tensors;  // by the shard's tensor index; in offset order
  std::string pushed_sha256;                  // of the shard as a safetensors body
};

// Reads one encoded shard fed in pieces. Thread-compatible.
class EncodedShardReader final : private EncodedBodySink {
 public:
  // The plan the shard must follow, made when its header is read (`described` is the header in
  // global terms); an error refuses the shard (StalePlan: coded by another plan).
  using PlanFn = std::function<Result<CodingPlan>(const ShardHeader& described)>;

  // `plan_of` null: a stored shard, only indexed (it was checked when it arrived).
  EncodedShardReader(uint32_t shard, uint64_t max_record_bytes, PlanFn plan_of);

  Status Feed(std::span<const uint8_t> bytes) { return parser_.Feed(bytes); }
  // The body ended: InvalidArgument unless it was complete and covered every tensor's bytes.
  Status Finish();

  // After the header (then Finish): the shard in global terms, and the index.
  const std::optional<ShardHeader>& header() const { return header_; }
  EncodedShardIndex& index() { return index_; }

 private:
  Status OnPreamble(const EncodedBodyPreamble& preamble) override;
  Status OnChunk(const EncodedChunkFrame& frame) override;
  Status OnRaw(uint32_t tensor, uint64_t offset, std::span<const uint8_t> bytes) override;
  Status OnEnd(const EncodedBodyEnd& end) override;

  // The bytes of tensor `tensor` of the shard. REQUIRES: tensor < header_->tensors.size().
  uint64_t TensorBytes(uint32_t tensor) const;
  // Checks that a frame of `tensor` starts where the previous one of the body ended.
  Status CheckPlace(uint32_t tensor, uint64_t offset, std::string_view what);

  const uint32_t shard_;
  const PlanFn plan_of_;
  EncodedBodyParser parser_;
  std::optional<ShardHeader> header_;
  std::optional<CodingPlan> plan_;
  EncodedShardIndex index_;
  uint32_t tensor_ = 0;  // the tensor the body is in
  uint64_t cursor_ = 0;  // the next byte of it a frame must start at
  bool ended_ = false;
};

// Indexes a stored encoded shard, reading its file whole.
Result<EncodedShardIndex> IndexStoredShard(uint32_t shard, const SpooledShardFile& file,
                                           uint64_t max_record_bytes);

// Whether a stored shard's file is an encoded shard (else a safetensors body).
Result<bool> IsEncodedShard(const SpooledShardFile& file);

}  // namespace ckpt
