// Retention: which versions of a model to keep.
//
// A RetentionPolicy is a set of rules; a version is kept if any rule keeps it (union), the
// latest version is always kept, and a tagged (pinned) version is never removed:
//
//   {"keep_last": 5,                 the 5 newest versions
//    "keep_every": 1000,             versions whose number (step) is a multiple of 1000
//    "keep_within": "72h",           versions pushed within the last 72 hours (s, m, h, d, w)
//    "keep_best": {"count": 3, "metric": "loss", "mode": "min"},
//                                    the 3 versions with the lowest (mode "max": highest)
//                                    value of metric "loss"; versions without it do not compete
//    "max_bytes": 10737418240,       fill up to this many stored bytes, newest first, with the
//                                    versions no other rule keeps: the oldest go first
//    "tensor_rules": [{"tensors": ["optim.*", "optimizer.*"], "keep_last": 2}]}
//                                    within the versions kept, tensors matching a rule's globs
//                                    (fnmatch) stay only in the versions that rule keeps (its
//                                    keep_last, keep_every, keep_within; the latest and tagged
//                                    versions always); elsewhere they are dropped and the version
//                                    restores without them. The first rule whose globs match a
//                                    tensor decides. For optimizer state, which only resuming
//                                    from a recent version needs.
//
// The empty policy `{}` keeps everything (no retention). Every field is optional; unknown
// fields are rejected so that a typo never silently keeps or deletes the wrong versions.
//
// Evaluation is pure (no I/O): RetentionPolicy::Evaluate takes the versions and the clock.
// Thread safety: immutable values; safe to share.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

// What retention knows of one version.
struct RetentionCandidate {
  uint64_t version = 0;
  int64_t created_at_ms = 0;
  uint64_t stored_bytes = 0;
  std::map<std::string, double> metrics;
  std::vector<std::string> tags;
};

// The verdict on one version, with every rule that keeps it ("latest", "tag:<name>",
// "keep_last", "keep_every", "keep_within", "keep_best", "max_bytes"); empty when deleted.
// For a kept version, the tensor rules (indices into RetentionPolicy::tensor_rules) that drop
// their tensors from it.
struct RetentionDecision {
  uint64_t version = 0;
  bool keep = true;
  std::vector<std::string> kept_by;
  std::vector<size_t> dropping_rules;
};

struct RetentionPolicy {
  struct KeepBest {
    uint64_t count = 0;
    std::string metric;
    bool maximize = false;  // "mode": "max"; default "min"
    bool operator==(const KeepBest&) const = default;
  };

  std::optional<uint64_t> keep_last;
  std::optional<uint64_t> keep_every;
  std::optional<int64_t> keep_within_ms;
  std::optional<KeepBest> keep_best;
  std::optional<uint64_t> max_bytes;

  struct TensorRule {
    std::vector<std::string> patterns;  // "tensors": one glob or a list of 1 to 16
    std::optional<uint64_t> keep_last;
    std::optional<uint64_t> keep_every;
    std::optional<int64_t> keep_within_ms;
    bool operator==(const TensorRule&) const = default;
  };
  static constexpr size_t kMaxTensorRules = 8;
  std::vector<TensorRule> tensor_rules;

  // Parses the JSON form above. InvalidArgument naming the field for anything malformed.
  static Result<RetentionPolicy> FromJson(std::string_view json);
  std::string ToJson() const;

  // True when the policy has no rule that deletes versions: every version is kept (tensor
  // rules may still drop tensors from them).
  bool KeepsEverything() const;
  // True when the policy has no rule at all: a retention pass has nothing to do.
  bool IsEmpty() const { return KeepsEverything() && tensor_rules.empty(); }

  // Whether `decision` drops tensor `name` from its version: the first tensor rule whose globs
  // match the name decides.
  bool DropsTensor(const RetentionDecision& decision, std::string_view name) const;

  // The keep_last of the tensor rule that decides tensor `name`, if it has one. Pushes start
  // such a tensor's delta chain anew at least every that many versions, so that a dropped
  // tensor's chain, and with it its space, ends soon after the versions that keep it.
  std::optional<uint64_t> ChainLimitFor(std::string_view name) const;

  // Decides every candidate (in any order; answered in ascending version order).
  std::vector<RetentionDecision> Evaluate(std::vector<RetentionCandidate> versions,
                                          int64_t now_ms) const;

  bool operator==(const RetentionPolicy&) const = default;

 private:
  // The index of the tensor rule that decides tensor `name`: the first whose globs match.
  std::optional<size_t> RuleFor(std::string_view name) const;
  // Adds to each kept version of `out` (in `versions`' ascending order) the tensor rules that
  // drop their tensors from it.
  void DecideTensorRules(const std::vector<RetentionCandidate>& versions, int64_t now_ms,
                         std::vector<RetentionDecision>& out) const;
};

// Parses a duration such as "90s", "30m", "72h", "7d", "2w" into milliseconds.
Result<int64_t> ParseDurationMs(std::string_view text);

}  // namespace ckpt
