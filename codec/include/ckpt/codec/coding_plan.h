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
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {

// One tensor of the checkpoint, in body order.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t byte_size = 0;
  uint64_t chunk_bytes = 0;  // every chunk's length but the last's (a multiple of the element)
  uint32_t chunk_count = 0;
  // kDelta: each chunk is coded against the same chunk of the base's reconstruction of the
  // tensor of the same name; kKeyframe: standalone.
  FrameKind kind = FrameKind::kKeyframe;
  bool lossy = false;
  LossyCodecOptions lossy_options;  // when lossy (kernels is never part of a plan)

  // The length of chunk `chunk` (< chunk_count).
  uint64_t ChunkLength(uint32_t chunk) const;

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

struct CodingPlan {
  static constexpr uint32_t kFormatVersion = 1;
  std::string model;
  uint64_t version = 0;
  std::optional<PlanBase> base;        // none: every tensor is a keyframe
  std::vector<PlannedTensor> tensors;  // body order

  // Canonical JSON: the same plan always gives the same text.
  std::string ToJson() const;
  // InvalidArgument naming the field when `json` is not a plan this build understands.
  static Result<CodingPlan> FromJson(std::string_view json);
  // XXH3-64 of ToJson() without base->restored_sha256 (which describes the reference, not how
  // the checkpoint is coded).
  uint64_t Digest() const;

  friend bool operator==(const CodingPlan&, const CodingPlan&) = default;
};

}  // namespace ckpt
