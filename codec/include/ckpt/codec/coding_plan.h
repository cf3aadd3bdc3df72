// The coding plan of a push encoded at the edge: how each tensor of one checkpoint is cut into
// chunks and coded, and which reconstruction its deltas are taken against. The daemon takes
// these decisions for every push (its codec policy, keyframe cadence, chain rules); a client
// that encodes its own push asks for them first and follows them, so that what is stored is
// what a push the daemon encoded would store. JSON on the wire (docs/api.md, "plan"); the
// encoded body carries the plan's digest, which ties it to the plan it followed.
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"
#include "ckpt/base/tensor_slices.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {

// A shard's part of a global tensor (plans of a shard only): the box the shard holds, and the
// chunks of the global tensor that lie wholly inside it, [owned_begin, owned_end), which the
// shard codes; the rest of its bytes are sent raw and coded by the daemon at the commit.
struct PlannedSlice {
  TensorBox box;
  uint32_t owned_begin = 0;
  uint32_t owned_end = 0;

  friend bool operator==(const PlannedSlice&, const PlannedSlice&) = default;
};

// One tensor of the checkpoint, in body order.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t byte_size = 0;
  uint64_t chunk_bytes = 0;  // every chunk's length but the last's (a multiple of the element)
  uint32_t chunk_count = 0;
  // The tiles the chunks follow (ChunkGrid; docs/format.md): empty when the chunks are runs of
  // the tensor's row-major order.
  std::vector<uint32_t> tile_counts;
  // kDelta: each chunk is coded against the same chunk of the base's reconstruction of the
  // tensor of the same name; kKeyframe: standalone.
  FrameKind kind = FrameKind::kKeyframe;
  bool lossy = false;
  LossyCodecOptions lossy_options;  // when lossy (kernels is never part of a plan)
  // Plans of a shard: the shard's part. `name`, `dtype`, `shape`, `byte_size` and the chunks
  // are the global tensor's.
  std::optional<PlannedSlice> slice;

  // The length of chunk `chunk` (< chunk_count).
  uint64_t ChunkLength(uint32_t chunk) const;
  // The chunks wholly inside `box` (a box of this tensor): those a shard holding it codes. An
  // untiled tensor's box owns chunks when it is one run of the tensor's row-major order (a
  // slice along its first dimension, or the whole tensor); a tiled tensor's, when it is a tile.
  std::pair<uint32_t, uint32_t> ChunksInside(const TensorBox& box) const;
  // The grid of the chunks (the plan's geometry was checked when it was read or made).
  Result<ChunkGrid> Grid() const;

  friend bool operator==(const PlannedTensor&, const PlannedTensor&) = default;
};

// The reconstruction deltas are taken against: a version the model stored earlier.
struct PlanBase {
  uint64_t version = 0;
  // The daemon's name for that reconstruction (its manifest); an encoded body repeats it, and
  // the daemon refuses the body when the model's reference has moved on since.
  uint64_t reference = 0;
  // SHA-256 (hex) of the body a restore of `version` sends, which a client compares with the
  // reconstruction it holds; empty when the version was deleted and only its data is kept.
  std::string restored_sha256;

  friend bool operator==(const PlanBase&, const PlanBase&) = default;
};

// The shard a plan is for (plans of a shard of a sharded version).
struct PlanShard {
  uint32_t index = 0;
  uint32_t count = 0;
  // The SHA-256 (hex) of each shard the base version was pushed as (empty when it was not
  // pushed as shards): a rank that pushed shard `index` of the base knows by it that the
  // reconstruction it kept is the base's.
  std::vector<std::string> base_shard_sha256;

  friend bool operator==(const PlanShard&, const PlanShard&) = default;
};

struct CodingPlan {
  // A plan with a tiled tensor is format 2; one without, format 1 (what clients that predate
  // tiles read).
  static constexpr uint32_t kFormatVersion = 2;
  std::string model;
  uint64_t version = 0;
  std::optional<PlanBase> base;        // none: every tensor is a keyframe
  std::optional<PlanShard> shard;      // a plan of one shard: its tensors have slices
  std::vector<PlannedTensor> tensors;  // body order (of the shard, in a plan of a shard)

  // Canonical JSON: the same plan always gives the same text.
  std::string ToJson() const;
  // InvalidArgument naming the field when `json` is not a plan this build understands.
  static Result<CodingPlan> FromJson(std::string_view json);
  // XXH3-64 of ToJson() without base->restored_sha256 and shard->base_shard_sha256 (which
  // describe the reference, not how the checkpoint is coded).
  uint64_t Digest() const;

  friend bool operator==(const CodingPlan&, const CodingPlan&) = default;
};

struct ChunkRecord;

// Checks that `record`, a client's coding of chunk `chunk` of `t`, follows the plan: the
// lossless codec, or the lossy one where `t` is lossy; t's frame kind; the chunk's length; a
// lossy payload's header within t's options (CheckLossyPayloadFollows); coding figures in range.
// `info` holds what the client's encoder reported and becomes what the manifest records (a
// lossy payload's header figures). InvalidArgument saying what does not follow.
Status CheckChunkFollowsPlan(const PlannedTensor& t, uint32_t chunk, const ChunkRecord& record,
                             ChunkCodingInfo* info);

}  // namespace ckpt
