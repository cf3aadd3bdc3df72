// Push planning: how each tensor of a checkpoint is cut into chunks and coded — keyframe or
// delta against the model's reference, lossless or lossy with which options — by the model's
// codec policy, keyframe cadence, chain budget and retention rules. The one place these
// decisions are taken: a push the daemon encodes follows them, and so does a client encoding
// at the edge, which receives them as a CodingPlan. Internal to storage/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/storage/codec_policy.h"
#include "context/store_context.h"
#include "read/chain_reader.h"
#include "records/records.h"
#include "uploads/shard_assembly.h"
#include "write/push_target.h"

namespace ckpt {

struct PlannedPush {
  // The manifest's tensors (body order) with their chunk geometry and chain links; the
  // per-tensor figures are filled in as chunks are stored.
  std::vector<ManifestTensor> tensors;
  std::vector<TensorCoding> codings;  // one per tensor
  uint64_t floor_seq = 0;             // oldest manifest the new version's chains reach
  // The version the reference manifest was pushed as (when the target has a reference).
  uint64_t reference_version = 0;
};

// What a plan knows of a sharded version: its shard count and the tensors held in slices (a
// tensor is held whole by every shard holding it, or in slices by each). A sharded version's
// plan decides each tensor alone — a rank plans its shard without the others — so that:
// - a sliced tensor whose first dimension splits evenly in shard_count parts has chunks that
//   fall on those parts' bounds (the ranks of an even split own all their chunks), keeping the
//   reference's chunks where they still do (deltas continue across a change of rank count);
// - "fast_latest": "auto" is decided by the size of the reference's version, not its own.
struct PlanSharding {
  uint32_t shard_count = 0;
  std::unordered_set<std::string> sliced;
  // Sliced tensors whose slices cut one dimension past the first only (the columns of a
  // matrix): that dimension. Where it splits evenly in shard_count parts, new chains are tiled
  // so, a tile a shard. The shard count and the global shape decide the tiles, not the slices'
  // widths: a rank's plan of its shard agrees with the version's wherever the slices of a
  // tensor all cut the same one dimension (the commit refuses shards coded otherwise).
  std::unordered_map<std::string, uint32_t> split_dim;
};

// The sharding a version's header records (its ckptd.layout), if it has one: a sharded
// version's commit, and a restored sharded version pushed again whole.
std::optional<PlanSharding> ShardingOf(const SafetensorsHeader& header);

// Plans the push of `header` (whose raw form, length prefix included, is `raw_header_bytes`
// long) to `target`. ResourceExhausted beyond storage.max_tensors_per_checkpoint.
Result<PlannedPush> PlanPush(const StoreContext& ctx, const PushTarget& target, ChainReader& reader,
                             const SafetensorsHeader& header, uint64_t raw_header_bytes,
                             const PlanSharding* sharding = nullptr);

// The plan as a client receives it; `base_restored_sha256` is the restored body's SHA-256 of
// the reference's version (empty when that version was deleted).
CodingPlan ToCodingPlan(const PushTarget& target, const PlannedPush& planned,
                        std::string base_restored_sha256);

// The plan of one shard of a sharded version coded by its rank: `planned` is the plan of the
// global tensors (with the version's PlanSharding; it may hold more than the shard's), `shard`
// the shard's header; each of its tensors gets the global tensor's plan and its slice.
Result<CodingPlan> ShardPlanOf(const PushTarget& target, const PlannedPush& planned,
                               const ShardHeader& shard, uint32_t shard_count,
                               std::vector<std::string> base_shard_sha256);

// CheckpointStore::PlanShard: the plan of `shard` (its header in global terms) of a version of
// `shard_count` shards, read without the model's lock.
Result<CodingPlan> PlanShardOf(const StoreContext& ctx, ModelWriter& writer, const ModelName& model,
                               uint64_t version, const ShardHeader& shard, uint32_t shard_count);

// CheckpointStore::PlanPush: the plan of a push of the checkpoint whose header is `raw_header`,
// read without the model's lock.
Result<CodingPlan> PlanPushOf(const StoreContext& ctx, ModelWriter& writer, const ModelName& model,
                              uint64_t version, std::string_view raw_header);

}  // namespace ckpt
