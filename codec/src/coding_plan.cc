#include "ckpt/codec/coding_plan.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <span>

#include "ckpt/base/hashing.h"
#include "ckpt/codec/chunk_record.h"

namespace ckpt {
namespace {

using nlohmann::json;

std::string_view BoundKindName(ErrorBound::Kind kind) {
  switch (kind) {
    case ErrorBound::Kind::kAbsolute:
      return "absolute";
    case ErrorBound::Kind::kRelative:
      return "relative";
    case ErrorBound::Kind::kPointwise:
      return "pointwise";
  }
  return "absolute";
}

std::optional<ErrorBound::Kind> BoundKindFromName(std::string_view name) {
  for (ErrorBound::Kind kind :
       {ErrorBound::Kind::kAbsolute, ErrorBound::Kind::kRelative, ErrorBound::Kind::kPointwise}) {
    if (BoundKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

json LossyToJson(const LossyCodecOptions& o) {
  return {{"quantizer", QuantizerName(o.quantizer)},
          {"bound", {{"kind", BoundKindName(o.bound.kind)}, {"value", o.bound.value}}},
          {"float_exponent_bits", o.float_exponent_bits},
          {"float_mantissa_bits", o.float_mantissa_bits},
          {"reclaimable", o.reclaimable},
          {"history", o.history},
          {"low_rank_columns", o.low_rank_columns},
          {"zero_below_mean", o.zero_below_mean}};
}

Status Invalid(std::string what) { return Status::InvalidArgument("coding plan: " + what); }

Result<LossyCodecOptions> LossyFromJson(const json& j) {
  LossyCodecOptions o;
  const auto quantizer = QuantizerFromName(j.at("quantizer").get<std::string>());
  if (!quantizer)
    return Invalid("unknown quantizer '" + j.at("quantizer").get<std::string>() + "'");
  o.quantizer = *quantizer;
  const auto kind = BoundKindFromName(j.at("bound").at("kind").get<std::string>());
  if (!kind) return Invalid("unknown bound kind");
  o.bound.kind = *kind;
  o.bound.value = j.at("bound").at("value").get<double>();
  o.float_exponent_bits = j.at("float_exponent_bits").get<uint8_t>();
  o.float_mantissa_bits = j.at("float_mantissa_bits").get<uint8_t>();
  o.reclaimable = j.at("reclaimable").get<bool>();
  o.history = j.at("history").get<bool>();
  o.low_rank_columns = j.at("low_rank_columns").get<uint32_t>();
  o.zero_below_mean = j.at("zero_below_mean").get<double>();
  return o;
}

Result<PlannedTensor> TensorFromJson(const json& j) {
  PlannedTensor t;
  t.name = j.at("name").get<std::string>();
  const auto dtype = DTypeFromName(j.at("dtype").get<std::string>());
  if (!dtype) return Invalid("tensor '" + t.name + "': unknown dtype");
  t.dtype = *dtype;
  t.shape = j.at("shape").get<std::vector<uint64_t>>();
  t.byte_size = j.at("byte_size").get<uint64_t>();
  t.chunk_bytes = j.at("chunk_bytes").get<uint64_t>();
  t.chunk_count = j.at("chunk_count").get<uint32_t>();
  const std::string kind = j.at("kind").get<std::string>();
  if (kind != "keyframe" && kind != "delta") {
    return Invalid("tensor '" + t.name + "': kind must be keyframe or delta");
  }
  t.kind = kind == "delta" ? FrameKind::kDelta : FrameKind::kKeyframe;
  const std::string codec = j.at("codec").get<std::string>();
  if (codec != "lossless" && codec != "lossy") {
    return Invalid("tensor '" + t.name + "': codec must be lossless or lossy");
  }
  t.lossy = codec == "lossy";
  if (t.lossy) {
    CKPT_ASSIGN_OR_RETURN(t.lossy_options, LossyFromJson(j.at("lossy")));
  }
  if (j.contains("tiles")) t.tile_counts = j.at("tiles").get<std::vector<uint32_t>>();
  // The geometry must describe the tensor: a client cuts its chunks by it.
  const uint64_t element = DTypeSize(t.dtype);
  uint64_t elements = 1;
  for (uint64_t d : t.shape)
    elements = __builtin_mul_overflow(elements, d, &elements) ? 0 : elements;
  auto grid = t.chunk_bytes > 0 && t.chunk_bytes % element == 0 &&
                      elements * element == t.byte_size && (elements > 0 || t.byte_size == 0)
                  ? t.Grid()
                  : Result<ChunkGrid>(Status::InvalidArgument("chunk length"));
  if (!grid.ok() || grid->chunk_count() != t.chunk_count ||
      (!t.tile_counts.empty() && !grid->tiled())) {
    return Invalid("tensor '" + t.name + "': chunk geometry does not fit");
  }
  if (j.contains("slice")) {
    const json& sj = j.at("slice");
    PlannedSlice slice;
    slice.box.offsets = sj.at("offsets").get<std::vector<uint64_t>>();
    slice.box.shape = sj.at("shape").get<std::vector<uint64_t>>();
    CKPT_RETURN_IF_ERROR(CheckBoxWithin(t.name, slice.box, t.shape));
    const auto owned = sj.at("owned_chunks").get<std::vector<uint32_t>>();
    if (owned.size() != 2 || std::pair(owned[0], owned[1]) != t.ChunksInside(slice.box)) {
      return Invalid("tensor '" + t.name + "': its owned chunks are not those inside its slice");
    }
    slice.owned_begin = owned[0];
    slice.owned_end = owned[1];
    t.slice = std::move(slice);
  }
  return t;
}

}  // namespace

uint64_t PlannedTensor::ChunkLength(uint32_t chunk) const {
  return ChunkLengthOf(byte_size, chunk_bytes, tile_counts, chunk);
}

Result<ChunkGrid> PlannedTensor::Grid() const {
  if (chunk_bytes == 0) return Status::InvalidArgument("chunks of 0 bytes");
  return ChunkGrid::Make(shape, tile_counts, chunk_bytes / DTypeSize(dtype));
}

std::pair<uint32_t, uint32_t> PlannedTensor::ChunksInside(const TensorBox& box) const {
  if (!tile_counts.empty()) {
    auto grid = Grid();
    if (!grid.ok()) return {0, 0};
    const std::vector<uint32_t> inside = grid->TilesInside(box);
    if (inside.size() != 1 || grid->TileBox(inside[0]) != box) return {0, 0};
    return {inside[0] * grid->chunks_per_tile(), (inside[0] + 1) * grid->chunks_per_tile()};
  }
  const auto [first, end] = BoxElementSpan(shape, box);
  if (end == first || end - first != box.element_count() || chunk_bytes == 0) return {0, 0};
  const uint64_t chunk_elements = chunk_bytes / DTypeSize(dtype);
  const uint64_t total = byte_size / DTypeSize(dtype);
  const uint64_t begin_chunk = (first + chunk_elements - 1) / chunk_elements;
  // The tensor's last chunk may be shorter: it is inside when the box reaches the end.
  const uint64_t end_chunk = end == total ? chunk_count : end / chunk_elements;
  if (end_chunk <= begin_chunk) return {0, 0};
  return {static_cast<uint32_t>(begin_chunk), static_cast<uint32_t>(end_chunk)};
}

std::string CodingPlan::ToJson() const {
  json tensors_json = json::array();
  for (const PlannedTensor& t : tensors) {
    json tj = {{"name", t.name},
               {"dtype", DTypeName(t.dtype)},
               {"shape", t.shape},
               {"byte_size", t.byte_size},
               {"chunk_bytes", t.chunk_bytes},
               {"chunk_count", t.chunk_count},
               {"kind", t.kind == FrameKind::kDelta ? "delta" : "keyframe"},
               {"codec", t.lossy ? "lossy" : "lossless"}};
    if (t.lossy) tj["lossy"] = LossyToJson(t.lossy_options);
    if (!t.tile_counts.empty()) tj["tiles"] = t.tile_counts;
    if (t.slice) {
      tj["slice"] = {{"offsets", t.slice->box.offsets},
                     {"shape", t.slice->box.shape},
                     {"owned_chunks", {t.slice->owned_begin, t.slice->owned_end}}};
    }
    tensors_json.push_back(std::move(tj));
  }
  bool tiled = false;
  for (const PlannedTensor& t : tensors) tiled = tiled || !t.tile_counts.empty();
  json j = {{"format", tiled ? kFormatVersion : 1},
            {"model", model},
            {"version", version},
            {"base", nullptr},
            {"tensors", std::move(tensors_json)}};
  if (base) {
    j["base"] = {{"version", base->version},
                 {"reference", base->reference},
                 {"restored_sha256", base->restored_sha256}};
  }
  if (shard) {
    j["shard"] = {{"index", shard->index},
                  {"count", shard->count},
                  {"base_shard_sha256", shard->base_shard_sha256}};
  }
  return j.dump();
}

Result<CodingPlan> CodingPlan::FromJson(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("not a JSON object");
  try {
    const uint32_t format = j.at("format").get<uint32_t>();
    if (format < 1 || format > kFormatVersion) {
      return Invalid("format " + j.at("format").dump() + " is not 1 to " +
                     std::to_string(kFormatVersion) + " (a newer ckptd?)");
    }
    CodingPlan plan;
    plan.model = j.at("model").get<std::string>();
    plan.version = j.at("version").get<uint64_t>();
    if (!j.at("base").is_null()) {
      const json& b = j.at("base");
      plan.base = PlanBase{b.at("version").get<uint64_t>(), b.at("reference").get<uint64_t>(),
                           b.at("restored_sha256").get<std::string>()};
    }
    if (j.contains("shard")) {
      const json& sj = j.at("shard");
      plan.shard = PlanShard{sj.at("index").get<uint32_t>(), sj.at("count").get<uint32_t>(),
                             sj.at("base_shard_sha256").get<std::vector<std::string>>()};
      if (plan.shard->index >= plan.shard->count) return Invalid("shard index out of range");
    }
    for (const json& tj : j.at("tensors")) {
      CKPT_ASSIGN_OR_RETURN(PlannedTensor t, TensorFromJson(tj));
      if (!t.tile_counts.empty() && format < 2) {
        return Invalid("tensor '" + t.name + "': tiles in a plan of format 1");
      }
      if (t.kind == FrameKind::kDelta && !plan.base) {
        return Invalid("tensor '" + t.name + "' is a delta in a plan without a base");
      }
      if (t.slice.has_value() != plan.shard.has_value()) {
        return Invalid("tensor '" + t.name + "': a slice is given in plans of a shard, always");
      }
      plan.tensors.push_back(std::move(t));
    }
    return plan;
  } catch (const json::exception& e) {
    return Invalid(e.what());
  }
}

uint64_t CodingPlan::Digest() const {
  CodingPlan decisions = *this;
  if (decisions.base) decisions.base->restored_sha256.clear();
  if (decisions.shard) decisions.shard->base_shard_sha256.clear();
  const std::string text = decisions.ToJson();
  return Xxh3Checksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Status CheckChunkFollowsPlan(const PlannedTensor& t, uint32_t chunk, const ChunkRecord& record,
                             ChunkCodingInfo* info) {
  const bool codec_ok =
      record.codec_id == static_cast<uint16_t>(CodecId::kLosslessBytePlanes) ||
      (t.lossy && record.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized));
  if (!codec_ok) {
    return Status::InvalidArgument("codec " + std::to_string(record.codec_id) +
                                   " is not the plan's " +
                                   (t.lossy ? "lossy or lossless" : "lossless") + " codec");
  }
  if (record.kind != t.kind) {
    return Status::InvalidArgument(
        std::string("a ") + (record.kind == FrameKind::kDelta ? "delta" : "keyframe") +
        " where the plan has a " + (t.kind == FrameKind::kDelta ? "delta" : "keyframe"));
  }
  const uint64_t length = t.ChunkLength(chunk);
  if (record.raw_length != length) {
    return Status::InvalidArgument("decodes to " + std::to_string(record.raw_length) +
                                   " bytes where the plan's chunk has " + std::to_string(length));
  }
  const uint64_t elements = length / DTypeSize(t.dtype);
  if (record.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized)) {
    CKPT_RETURN_IF_ERROR(CheckLossyPayloadFollows(
        t.lossy_options, t.dtype, elements, t.kind == FrameKind::kDelta,
        {reinterpret_cast<const uint8_t*>(record.payload.data()), record.payload.size()}, info));
  }
  if (info->quantizer > static_cast<uint8_t>(Quantizer::kLog) || !std::isfinite(info->bound) ||
      info->bound < 0 || !std::isfinite(info->model_entropy_bits) || info->model_entropy_bits < 0 ||
      info->model_entropy_bits > 64.0 * double(length) || info->exact_elements > elements) {
    return Status::InvalidArgument(
        "its coding figures (quantizer, bound, exact elements, entropy) are out of range");
  }
  return Status::Ok();
}

}  // namespace ckpt
