// Push planning (push_plan.h).
#include "write/push_plan.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "records/keys.h"

namespace ckpt {

namespace keys = storage_keys;

namespace {

// A tensor is tiled only where a tile holds at least this fraction (1/N) of storage.chunk_bytes.
constexpr uint64_t kMinTileShareOfChunk = 64;

// The chunk length of a part of `part` bytes made of units of `unit` bytes (elements, or rows):
// the part itself up to `limit`, else the longest length up to `limit` (and not below half of it)
// that is whole units and divides the part, so that the part is whole chunks.
std::optional<uint64_t> PartChunkBytes(uint64_t part, uint64_t unit, uint64_t limit) {
  if (part == 0 || unit == 0) return std::nullopt;
  if (part <= limit) return part;
  const uint64_t part_elements = part / unit;
  // A few candidates only: parts of real tensors have small factors, and a header must not be
  // able to make a plan search long.
  const uint64_t first = part / limit + (part % limit != 0);
  for (uint64_t k = first; k < first + 64 && part / k >= limit / 2; ++k) {
    if (part_elements % k == 0) return part / k;
  }
  return std::nullopt;
}

// The chunk length of a sliced tensor of a sharded version of `parts` shards whose first
// dimension splits evenly in that many parts, so that each part is whole chunks.
std::optional<uint64_t> SlicedChunkBytes(const ManifestTensor& t, uint32_t parts, uint64_t limit) {
  if (parts < 2 || t.shape.empty() || t.shape[0] % parts != 0) return std::nullopt;
  return PartChunkBytes(t.byte_size / parts, DTypeSize(t.dtype), limit);
}

// The dimension past the first that `box` cuts `global_shape` along, when it cuts that one only.
std::optional<uint32_t> SplitDimOf(std::span<const uint64_t> box_shape,
                                   std::span<const uint64_t> global_shape) {
  std::optional<uint32_t> split;
  if (box_shape.size() != global_shape.size()) return std::nullopt;
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (box_shape[d] == global_shape[d]) continue;
    if (split || d == 0) return std::nullopt;
    split = static_cast<uint32_t>(d);
  }
  return split;
}

// A JSON array of dimensions, or nothing.
std::optional<std::vector<uint64_t>> DimsOf(const nlohmann::json& dims) {
  if (!dims.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  for (const auto& d : dims) {
    if (!d.is_number_unsigned()) return std::nullopt;
    out.push_back(d.get<uint64_t>());
  }
  return out;
}

}  // namespace

std::optional<PlanSharding> ShardingOf(const SafetensorsHeader& header) {
  auto it = header.metadata.find(std::string(kLayoutMetadataKey));
  if (it == header.metadata.end()) return std::nullopt;
  const auto layout = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!layout.is_object() || !layout.contains("shards") || !layout["shards"].is_number_unsigned() ||
      !layout.contains("tensors") || !layout["tensors"].is_object()) {
    return std::nullopt;
  }
  PlanSharding sharding;
  sharding.shard_count = layout["shards"].get<uint32_t>();
  for (const auto& [name, tensor] : layout["tensors"].items()) {
    if (!tensor.is_object() || !tensor.contains("slices") || !tensor["slices"].is_array()) continue;
    std::optional<uint32_t> split_dim;
    bool one_split_dim = true;
    for (const auto& slice : tensor["slices"]) {
      if (slice.is_object() && slice.contains("shape") && tensor.contains("global_shape") &&
          slice["shape"] != tensor["global_shape"]) {
        sharding.sliced.insert(name);
        const auto box = DimsOf(slice["shape"]);
        const auto global = DimsOf(tensor["global_shape"]);
        const std::optional<uint32_t> d = box && global ? SplitDimOf(*box, *global) : std::nullopt;
        one_split_dim = one_split_dim && d && (!split_dim || *split_dim == *d);
        split_dim = d;
      }
    }
    if (one_split_dim && split_dim) sharding.split_dim.emplace(name, *split_dim);
  }
  return sharding;
}

Result<PlannedPush> PlanPush(const StoreContext& ctx, const PushTarget& target, ChainReader& reader,
                             const SafetensorsHeader& header, uint64_t raw_header_bytes,
                             const PlanSharding* sharding) {
  PlannedPush planned;
  const ManifestRecord* reference = nullptr;
  std::unordered_map<std::string_view, uint32_t> reference_index;
  if (target.state) {
    CKPT_ASSIGN_OR_RETURN(reference, reader.Manifest(target.state->reference_seq));
    planned.reference_version = reference->version;
    for (uint32_t i = 0; i < reference->tensors.size(); ++i) {
      reference_index.emplace(reference->tensors[i].name, i);
    }
  }
  if (header.tensors.size() > ctx.options->max_tensors_per_checkpoint) {
    return Status::ResourceExhausted("checkpoint has " + std::to_string(header.tensors.size()) +
                                     " tensors; the limit is " +
                                     std::to_string(ctx.options->max_tensors_per_checkpoint) +
                                     " (storage.max_tensors_per_checkpoint)");
  }
  const uint64_t seq = target.seq;
  const CodecPolicy& policy = target.policy;
  planned.floor_seq = seq;
  const uint32_t keyframe_every = policy.EffectiveKeyframeEvery();
  // A checkpoint that the reference cache does not keep has its latest, and the next push's
  // reference after a restart, decoded from storage: "fast_latest": "auto" then puts it on
  // the lattice that the rearrangement stores newest-first.
  uint64_t checkpoint_bytes = 0;
  if (sharding == nullptr) {
    checkpoint_bytes = raw_header_bytes;
    for (const auto& t : header.tensors) checkpoint_bytes += t.byte_size();
  } else if (reference != nullptr) {  // the tensors' bytes only: a rank has no version header
    for (const ManifestTensor& t : reference->tensors) checkpoint_bytes += t.byte_size;
  }
  const bool larger_than_cache = !ctx.cache->KeepsVersionOf(checkpoint_bytes);
  for (const auto& t : header.tensors) {
    TensorCoding coding = policy.ForTensor(t.name, t.dtype, t.shape, larger_than_cache);
    // Lattice versions with element history cost more to re-encode exactly (their states go
    // along): a model whose retention deletes versions is coded without it.
    if (coding.lossy && coding.lossy_options.reclaimable && target.retention_deletes) {
      coding.lossy_options.history = false;
    }
    ManifestTensor mt;  // codec_id: lossless until a chunk is stored quantized
    mt.name = t.name;
    mt.dtype = t.dtype;
    mt.shape = t.shape;
    mt.byte_size = t.byte_size();
    const uint64_t element = DTypeSize(t.dtype);
    // A tensor that fits in one chunk records its own size, so its chunk geometry (and
    // with it the ability to delta) survives a change of the configured chunk size.
    mt.chunk_bytes = std::min(std::max(element, ctx.options->chunk_bytes / element * element),
                              std::max(element, mt.byte_size));
    // A sliced tensor of a sharded version: a chain keeps its chunks whatever the rank count
    // (deltas line up); a new chain's chunks fall on the bounds of an even split, if any.
    const bool sliced = sharding && sharding->sliced.count(t.name);
    // A slice along a dimension past the first holds no run of the tensor's row-major order:
    // such a tensor is tiled along that dimension, a tile per shard, which its rank codes.
    std::optional<uint32_t> split_dim;
    if (sliced) {
      auto it = sharding->split_dim.find(t.name);
      // Tiles much smaller than a chunk cost more ratio in per-chunk tables and statistics than
      // their ranks save on the wire.
      if (it != sharding->split_dim.end() && sharding->shard_count > 1 &&
          it->second < t.shape.size() && t.shape[it->second] % sharding->shard_count == 0 &&
          mt.byte_size / sharding->shard_count >= ctx.options->chunk_bytes / kMinTileShareOfChunk) {
        split_dim = it->second;
      }
    }
    if (split_dim) {
      mt.tile_counts.assign(t.shape.size(), 1);
      mt.tile_counts[*split_dim] = sharding->shard_count;
      // A tile's chunks are whole rows of it where they can be: rows of the tensor are then one
      // chunk of each tile.
      const uint64_t tile_bytes = mt.byte_size / sharding->shard_count;
      mt.chunk_bytes = PartChunkBytes(tile_bytes, tile_bytes / t.shape[0], ctx.options->chunk_bytes)
                           .value_or(PartChunkBytes(tile_bytes, element, ctx.options->chunk_bytes)
                                         .value_or(mt.chunk_bytes));
    } else if (sliced) {
      mt.chunk_bytes = SlicedChunkBytes(mt, sharding->shard_count, ctx.options->chunk_bytes)
                           .value_or(mt.chunk_bytes);
    }
    uint64_t chain_chunk_bytes = mt.chunk_bytes;  // what a delta against the reference needs
    std::vector<uint32_t> chain_tiles = mt.tile_counts;
    mt.kind = FrameKind::kKeyframe;
    mt.keyframe_seq = seq;
    if (auto it = reference_index.find(t.name); it != reference_index.end()) {
      const ManifestTensor& rt = reference->tensors[it->second];
      // In a sharded version, a chain keeps its grid whether the tensor is sliced now or not.
      if (sharding && rt.chunk_bytes > 0 && rt.chunk_bytes % element == 0 &&
          rt.chunk_bytes <= std::max(mt.chunk_bytes, ctx.options->chunk_bytes)) {
        chain_chunk_bytes = rt.chunk_bytes;
        chain_tiles = rt.tile_counts;
      }
      // Lossy chains also restart once their deltas outweigh their keyframe by the policy's
      // budget: that bounds what a restore reads and what a chain keeps alive.
      const bool chain_outweighs_keyframe =
          coding.lossy && policy.KeyframeBudgetExceeded(rt.keyframe_bytes, rt.chain_bytes);
      // A tensor that retention keeps for the newest K versions only restarts its chain at
      // least every K versions: once dropped, its data is freed a chain later.
      const uint64_t chain_limit = std::min<uint64_t>(
          keyframe_every,
          target.retention.ChainLimitFor(t.name).value_or(std::numeric_limits<uint64_t>::max()));
      if (!coding.standalone && rt.dtype == mt.dtype && rt.shape == mt.shape &&
          rt.chunk_bytes == chain_chunk_bytes && rt.tile_counts == chain_tiles &&
          mt.byte_size > 0 && rt.chain_length + 1 < chain_limit && !chain_outweighs_keyframe) {
        mt.chunk_bytes = chain_chunk_bytes;
        mt.tile_counts = chain_tiles;
        mt.LinkTo(target.state->reference_seq, it->second, rt);
      }
    }
    auto grid = ChunkGrid::Make(mt.shape, mt.tile_counts, mt.chunk_bytes / element);
    if (!grid.ok()) {
      return Status::InvalidArgument("tensor '" + t.name + "': " + grid.status().message());
    }
    mt.chunk_count = grid->chunk_count();
    // The lossy coder reads a matrix's chunks as rows of a tile's width.
    if (coding.lossy && coding.lossy_options.low_rank_columns != 0 && grid->tiled()) {
      coding.lossy_options.low_rank_columns = static_cast<uint32_t>(grid->tile_shape()[1]);
    }
    planned.floor_seq = std::min(planned.floor_seq, mt.keyframe_seq);
    planned.tensors.push_back(std::move(mt));
    planned.codings.push_back(std::move(coding));
  }
  return planned;
}

CodingPlan ToCodingPlan(const PushTarget& target, const PlannedPush& planned,
                        std::string base_restored_sha256) {
  CodingPlan plan;
  plan.model = target.model;
  plan.version = target.version;
  if (target.state) {
    plan.base = PlanBase{planned.reference_version, target.state->reference_seq,
                         std::move(base_restored_sha256)};
  }
  for (size_t i = 0; i < planned.tensors.size(); ++i) {
    const ManifestTensor& mt = planned.tensors[i];
    const TensorCoding& coding = planned.codings[i];
    PlannedTensor t;
    t.name = mt.name;
    t.dtype = mt.dtype;
    t.shape = mt.shape;
    t.byte_size = mt.byte_size;
    t.chunk_bytes = mt.chunk_bytes;
    t.chunk_count = mt.chunk_count;
    t.tile_counts = mt.tile_counts;
    t.kind = mt.kind;
    t.lossy = coding.lossy;
    if (coding.lossy) t.lossy_options = coding.lossy_options;
    plan.tensors.push_back(std::move(t));
  }
  return plan;
}

namespace {

// The shard digests of a sharded version (its layout's), empty for a version pushed whole.
std::vector<std::string> ShardDigestsOf(const VersionRecord& record) {
  auto header = ParseRawSafetensorsHeader(record.raw_header);
  if (!header.ok()) return {};
  auto it = header->metadata.find(std::string(kLayoutMetadataKey));
  if (it == header->metadata.end()) return {};
  const auto layout = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!layout.is_object() || !layout.contains("shard_sha256")) return {};
  std::vector<std::string> out;
  for (const auto& d : layout["shard_sha256"]) {
    if (!d.is_string()) return {};
    out.push_back(d.get<std::string>());
  }
  return out;
}

// The version record of the target's reference, when that version still has it.
Result<std::optional<VersionRecord>> BaseRecordOf(const StoreContext& ctx, const PushTarget& target,
                                                  uint64_t reference_version) {
  if (!target.state) return std::optional<VersionRecord>();
  CKPT_ASSIGN_OR_RETURN(std::optional<VersionRecord> base,
                        ctx.GetRecord<VersionRecord>(
                            rocksdb::ReadOptions(), ctx.versions,
                            keys::VersionKey(target.model, reference_version), "version record"));
  // A base whose version was deleted (or rewritten) has no restored body to compare with.
  if (!base || base->seq != target.state->reference_seq || !base->dropped_tensors.empty()) {
    return std::optional<VersionRecord>();
  }
  return base;
}

}  // namespace

Result<CodingPlan> ShardPlanOf(const PushTarget& target, const PlannedPush& planned,
                               const ShardHeader& shard, uint32_t shard_count,
                               std::vector<std::string> base_shard_sha256) {
  const CodingPlan global = ToCodingPlan(target, planned, "");
  std::unordered_map<std::string_view, const PlannedTensor*> by_name;
  for (const PlannedTensor& t : global.tensors) by_name.emplace(t.name, &t);
  CodingPlan plan;
  plan.model = global.model;
  plan.version = global.version;
  plan.base = global.base;
  plan.shard = PlanShard{shard.shard, shard_count, std::move(base_shard_sha256)};
  for (const ShardTensor& st : shard.tensors) {
    auto it = by_name.find(st.name);
    if (it == by_name.end()) {
      return Status::Internal("shard plan: tensor '" + st.name + "' is not in the version's plan");
    }
    PlannedTensor t = *it->second;
    const auto [owned_begin, owned_end] = t.ChunksInside(st.box);
    t.slice = PlannedSlice{st.box, owned_begin, owned_end};
    plan.tensors.push_back(std::move(t));
  }
  return plan;
}

Result<CodingPlan> PlanShardOf(const StoreContext& ctx, ModelWriter& writer, const ModelName& model,
                               uint64_t version, const ShardHeader& described,
                               uint32_t shard_count) {
  SafetensorsHeader global;
  for (const ShardTensor& t : described.tensors) {
    uint64_t bytes = DTypeSize(t.dtype);
    for (uint64_t d : t.global_shape) bytes *= d;
    global.tensors.push_back(TensorInfo{t.name, t.dtype, t.global_shape, 0, bytes});
  }
  CKPT_RETURN_IF_ERROR(ctx.backend->Refresh(model.str()));
  CKPT_ASSIGN_OR_RETURN(const PushTarget target, ReadPushTarget(ctx, writer, model, version));
  ChainReader reader(ctx.db, ctx.manifests, ctx.backend, nullptr, target.model, ctx.cache);
  PlanSharding sharding{shard_count, {}, {}};
  for (const ShardTensor& t : described.tensors) {
    if (t.box.shape == t.global_shape) continue;
    sharding.sliced.insert(t.name);
    if (auto d = SplitDimOf(t.box.shape, t.global_shape)) sharding.split_dim.emplace(t.name, *d);
  }
  CKPT_ASSIGN_OR_RETURN(const PlannedPush planned,
                        PlanPush(ctx, target, reader, global, 0, &sharding));
  CKPT_ASSIGN_OR_RETURN(const std::optional<VersionRecord> base,
                        BaseRecordOf(ctx, target, planned.reference_version));
  CKPT_ASSIGN_OR_RETURN(CodingPlan plan,
                        ShardPlanOf(target, planned, described, shard_count,
                                    base ? ShardDigestsOf(*base) : std::vector<std::string>()));
  if (base && plan.base) plan.base->restored_sha256 = base->restored_sha256_hex;
  return plan;
}

Result<CodingPlan> PlanPushOf(const StoreContext& ctx, ModelWriter& writer, const ModelName& model,
                              uint64_t version, std::string_view raw_header) {
  CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseRawSafetensorsHeader(raw_header));
  CKPT_RETURN_IF_ERROR(ctx.backend->Refresh(model.str()));
  CKPT_ASSIGN_OR_RETURN(const PushTarget target, ReadPushTarget(ctx, writer, model, version));
  ChainReader reader(ctx.db, ctx.manifests, ctx.backend, nullptr, target.model, ctx.cache);
  // As the push will plan it: a header with a layout (a restored sharded version) as sharded.
  const std::optional<PlanSharding> sharding = ShardingOf(header);
  CKPT_ASSIGN_OR_RETURN(
      const PlannedPush planned,
      PlanPush(ctx, target, reader, header, raw_header.size(), sharding ? &*sharding : nullptr));
  CKPT_ASSIGN_OR_RETURN(const std::optional<VersionRecord> base,
                        BaseRecordOf(ctx, target, planned.reference_version));
  std::string base_restored_sha256 = base ? base->restored_sha256_hex : "";
  return ToCodingPlan(target, planned, std::move(base_restored_sha256));
}

}  // namespace ckpt
