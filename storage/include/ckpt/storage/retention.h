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
//    "max_bytes": 10737418240}       fill up to this many stored bytes, newest first, with the
//                                    versions no other rule keeps: the oldest go first
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

#include "ckpt/codec/status.h"

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
struct RetentionDecision {
  uint64_t version = 0;
  bool keep = true;
  std::vector<std::string> kept_by;
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

  // Parses the JSON form above. InvalidArgument naming the field for anything malformed.
  static Result<RetentionPolicy> FromJson(std::string_view json);
  std::string ToJson() const;

  // True when the policy has no rule: every version is kept.
  bool KeepsEverything() const;

  // Decides every candidate (in any order; answered in ascending version order).
  std::vector<RetentionDecision> Evaluate(std::vector<RetentionCandidate> versions,
                                          int64_t now_ms) const;

  bool operator==(const RetentionPolicy&) const = default;
};

// Parses a duration such as "90s", "30m", "72h", "7d", "2w" into milliseconds.
Result<int64_t> ParseDurationMs(std::string_view text);

}  // namespace ckpt
