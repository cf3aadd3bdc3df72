// The per-model codec policy: how new versions of a model are encoded.
//
// Set with PUT /v1/models/{model}/policy, applied from the next push. Every stored chunk
// records the codec and parameters it was written with, so changing the policy never affects
// stored data.
//
// JSON form (docs/api.md has the full reference):
//   {"mode": "lossless", "keyframe_every": 16}
//   {"mode": "lossy", "max_abs_error": 1e-4, "quantizer": "auto",
//    "lossless_tensors": ["*.bias", "*norm*"],
//    "overrides": [{"tensors": "optim.*", "max_pointwise_rel_error": 1e-2}]}
// Fields:
//   preset            "full-state": weights and moments together, as measured by resuming
//                     training (docs/api.md): mode "lossy", max_abs_error 5e-3, every float
//                     tensor quantized, and the overrides
//                       {"tensors": "*exp_avg", "max_pointwise_rel_error": 0.5,
//                        "zero_below_mean": 3},
//                       {"tensors": "*exp_avg_sq", "max_pointwise_rel_error": 0.3}.
//                     The document's other fields change it (its overrides go first). Not
//                     stored: GET returns the fields it set.
//   mode              "lossless" (bit-exact) or "lossy" (every float element restores within
//                     the bound). Default: "lossless".
//   max_abs_error     lossy bound: |pushed - restored| <= this, in the tensor's own dtype. > 0.
//   max_rel_error     lossy bound relative to each tensor's value range (max - min of its finite
//                     values) in the version being pushed. In (0, 1].
//   max_pointwise_rel_error
//                     lossy bound relative to each element: |pushed - restored| <= this *
//                     |pushed| (zeros exact, signs kept). In (0, 0.5]. For values spanning many
//                     orders of magnitude, such as Adam's moments. Give one of the three.
//   quantizer         "auto" (default: per chunk, the quantizer with the smallest estimated
//                     size), "uniform", "exponent", "float" or "cosine" (lossy_codec.h); with a
//                     pointwise bound "auto" or "log" (the only one that codes it).
//   float_format      the "float" quantizer's format, "E<e>M<m>" (e.g. "E4M3", "E5M10"), or
//                     "auto" (default): E4 with the fewest mantissa bits that meet the bound.
//   lossless_tensors  glob patterns (fnmatch: * ? [..]) of tensor names kept bit-exact. Default
//                     (field absent or null): tensors of rank 0 or 1 (biases, norms, scalars).
//                     [] quantizes every float tensor. Non-float tensors are always lossless.
//   overrides         list of {"tensors": glob, and any of "max_abs_error" | "max_rel_error" |
//                     "max_pointwise_rel_error", "quantizer", "lossless": bool,
//                     "zero_below_mean"}; the first matching entry decides a tensor's coding
//                     (also in lossless mode: a lossless model may quantize, say, its optimizer
//                     moments). At most 64 entries.
//                     "zero_below_mean": f (0 < f <= 100, with a pointwise bound), the drop
//                     rule: elements with |x| <= f x the mean |x| of their chunk restore as 0,
//                     the others within the pointwise bound, and the tensor is stored whole
//                     in every version (no deltas). For Adam's exp_avg (docs/api.md).
//   keyframe_every    a tensor is stored as a keyframe at least every N versions; restoring any
//                     version decodes at most one keyframe and N-1 deltas per tensor. 1 disables
//                     deltas. Range 1..1024, or 0 for the mode's default: 4 lossless, 32 lossy.
//   keyframe_budget   lossy mode: a tensor also starts a new keyframe once the deltas stored
//                     since its keyframe total more than this many times the keyframe's bytes,
//                     which bounds the bytes a restore reads and a chain keeps alive. 1 is the
//                     strictest useful value, 0 turns the rule off. Default: 8 (on training
//                     runs a lossy keyframe costs several deltas, so 1 would re-key every few
//                     versions and cost much of the ratio; see docs/benchmarks.md).
//   reclaimable       lossy, uniform quantizer: code reconstructions on a fixed lattice
//                     (LossyCodecOptions::reclaimable) so that garbage collection can re-encode
//                     kept versions exactly and cheaply when versions between them are deleted.
//                     (Storage adds element history on the lattice unless the model has
//                     retention rules: smaller deltas, dearer rebases.) false: additive coding
//                     (the reference plus a move; about the same size on training runs), but
//                     deleted versions inside a kept version's chain stay stored. Default: true.
//   low_rank          lossy, reclaimable: a delta of a weight matrix (a rank-2 tensor) may shift
//                     the lattice by a low-rank matrix fitted to the delta (payload version 4,
//                     docs/format.md), where that codes smaller (smaller deltas on Adam runs
//                     at a lower encoding speed than the plain lattice: docs/benchmarks.md,
//                     "Lossy codec"). Only for models without retention rules (it needs element
//                     history); deleting versions of such chains frees little (exact
//                     re-encodings on the fine lattice cost more than they free, so collection
//                     keeps them). false: the plain lattice. Default: true.
//   fast_latest       lossy, reclaimable: true codes on the plain lattice (no element history,
//                     no low-rank shift, whatever "low_rank" says), whose versions storage can
//                     re-encode exactly as reverse deltas, so that restoring the latest decodes
//                     one payload per chunk as in lossless mode. Costs ratio (the coding
//                     context and the shift are what make the default's deltas small:
//                     docs/benchmarks.md, "Through the daemon"). false: the default lattice,
//                     whose latest decodes its forward chain. "auto" (default): true for a
//                     checkpoint the reference cache does not keep (storage decides: larger
//                     than half of it), whose latest and next reference would otherwise be a
//                     chain replay from storage after every restart; false otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/lossy_codec.h"

namespace ckpt {

enum class CodecMode { kLossless, kLossy };

// A per-tensor-pattern override of the policy.
struct TensorOverride {
  std::string pattern;
  std::optional<bool> lossless;
  std::optional<ErrorBound> bound;
  std::optional<Quantizer> quantizer;
  std::optional<double> zero_below_mean;  // the drop rule (LossyCodecOptions::zero_below_mean)

  friend bool operator==(const TensorOverride&, const TensorOverride&) = default;
};

// How one tensor of a push is coded.
struct TensorCoding {
  bool lossy = false;
  LossyCodecOptions lossy_options;  // when lossy
  // Coded as a keyframe in every version: set with the drop rule, which only keyframes apply
  // (and which suits tensors that a previous version barely predicts).
  bool standalone = false;

  friend bool operator==(const TensorCoding&, const TensorCoding&) = default;
};

struct CodecPolicy {
  static constexpr uint32_t kLosslessKeyframeEvery = 4;
  static constexpr uint32_t kLossyKeyframeEvery = 32;
  static constexpr uint32_t kMaxKeyframeEvery = 1024;
  static constexpr size_t kMaxPatterns = 64;
  static constexpr double kDefaultKeyframeBudget = 8;
  static constexpr double kFullStateWeightBound = 5e-3;  // the "full-state" preset's weights

  CodecMode mode = CodecMode::kLossless;
  uint32_t keyframe_every = 0;  // 0: the mode's default
  double keyframe_budget = kDefaultKeyframeBudget;
  bool reclaimable = true;
  bool low_rank = true;
  std::optional<bool> fast_latest;  // nullopt: "auto"
  std::optional<ErrorBound> bound;
  Quantizer quantizer = Quantizer::kAuto;
  uint8_t float_exponent_bits = 0;  // 0: auto
  uint8_t float_mantissa_bits = 0;
  std::optional<std::vector<std::string>> lossless_tensors;  // nullopt: rank <= 1 stays lossless
  std::vector<TensorOverride> overrides;

  // Parses a policy document. Fields not given keep the values of `base`. Unknown fields,
  // wrong types, out-of-range values and a lossy mode without a bound are InvalidArgument
  // naming the field.
  static Result<CodecPolicy> FromJson(std::string_view json, const CodecPolicy& base);
  std::string ToJson() const;

  // Fields that are stored but change nothing about how tensors are coded (a bound on a
  // lossless policy that no override uses), one sentence each naming the field; empty if none.
  // A valid policy may have them (switching a model back to lossless keeps its bound for later),
  // so they are told, not refused.
  std::vector<std::string> Warnings() const;

  uint32_t EffectiveKeyframeEvery() const {
    if (keyframe_every != 0) return keyframe_every;
    return mode == CodecMode::kLossy ? kLossyKeyframeEvery : kLosslessKeyframeEvery;
  }

  // Lossy mode: whether a chain whose deltas since the keyframe total `chain_bytes` (keyframe:
  // `keyframe_bytes`) restarts with a keyframe.
  bool KeyframeBudgetExceeded(uint64_t keyframe_bytes, uint64_t chain_bytes) const {
    return keyframe_budget > 0 &&
           static_cast<double>(chain_bytes) > keyframe_budget * static_cast<double>(keyframe_bytes);
  }

  // Decides how the tensor `name` of `dtype` and `shape` is coded under this policy, in a
  // checkpoint that the reference cache keeps or, `larger_than_cache`, does not ("fast_latest").
  TensorCoding ForTensor(std::string_view name, DType dtype, const std::vector<uint64_t>& shape,
                         bool larger_than_cache = false) const;

  friend bool operator==(const CodecPolicy&, const CodecPolicy&) = default;
};

}  // namespace ckpt
