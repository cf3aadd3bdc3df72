// The per-model codec policy: how new versions of a model are encoded.
//
// Set with PUT /v1/models/{model}/policy, applied from the next push. Every stored chunk
// records the codec it was written with, so changing the policy never affects stored data.
//
// JSON form (docs/api.md):
//   {"mode": "lossless", "keyframe_every": 16}
// Fields:
//   mode            "lossless" (bit-exact). Lossy modes arrive with the lossy-codec work.
//                   Default: "lossless".
//   keyframe_every  a tensor is stored as a keyframe at least every N versions; restoring any
//                   version decodes at most one keyframe and N-1 deltas per tensor. 1 disables
//                   deltas. Range 1..1024. Default: 16.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/codec/status.h"

namespace ckpt {

enum class CodecMode { kLossless };

struct CodecPolicy {
  static constexpr uint32_t kDefaultKeyframeEvery = 16;
  static constexpr uint32_t kMaxKeyframeEvery = 1024;

  CodecMode mode = CodecMode::kLossless;
  uint32_t keyframe_every = kDefaultKeyframeEvery;

  // Parses a policy document. Fields not given keep the values of `base`. Unknown fields,
  // wrong types and out-of-range values are InvalidArgument naming the field.
  static Result<CodecPolicy> FromJson(std::string_view json, const CodecPolicy& base);
  std::string ToJson() const;

  friend bool operator==(const CodecPolicy&, const CodecPolicy&) = default;
};

}  // namespace ckpt
