// CodecPolicy: the per-model document, beside RetentionPolicy (retention.h), that says how new
// versions of a model are encoded — lossless, or lossy within an error bound — with per-tensor
// overrides and keyframe spacing, and its JSON form. FromJson checks
// every field (InvalidArgument naming it) and ToJson writes them all back; the field reference,
// with defaults and ranges, is docs/api.md ("GET|PUT /v1/models/{model}/policy"). A chunk's
// payload records the codec and parameters it was written with, so a policy decides how chunks
// are encoded, never how stored ones decode.
//
// Example:
//   {"mode": "lossy", "max_abs_error": 1e-4, "quantizer": "auto",
//    "lossless_tensors": ["*.bias", "*norm*"],
//    "overrides": [{"tensors": "optim.*", "max_pointwise_rel_error": 1e-2}]}
//
// Thread safety: a value type.
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
