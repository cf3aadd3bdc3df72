// Splitting one safetensors body into the shards of a sharded push (docs/api.md, "Sharded
// versions"), so that a single large checkpoint can be sent over several connections at once.
//
// The rule (the Python client's split_into_shards): a tensor larger than an even share of the
// data (total / count) whose first dimension has at least `count` rows is cut by rows into
// `count` consecutive slices, the first `rows % count` one row longer (as torch.tensor_split);
// every other tensor goes whole to the least loaded shard, largest tensors first. Within a
// shard, tensors keep the body's order, so each shard reads the body front to back. Shard 0
// carries the body's `__metadata__`; slices are declared under kSlicesMetadataKey (composed
// with the body's own declarations when it is itself a shard of something larger).
//
// Pure computation: no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/base/status.h"

namespace ckpt {

// A byte range of the source body (offsets from its first byte, the length prefix).
struct BodyRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// One shard: its safetensors header (length prefix and JSON) followed by the source ranges, in
// order, form its body.
struct ShardBodyPlan {
  std::string header;
  std::vector<BodyRange> ranges;
  uint64_t size = 0;  // header plus ranges
};

// The shards of the body `header` describes (parsed by ParseSafetensorsHeader). `count` must be
// 1 to 65536; InvalidArgument otherwise, or when the body's slice declarations are malformed.
Result<std::vector<ShardBodyPlan>> SplitIntoShards(const SafetensorsHeader& header, uint32_t count);

}  // namespace ckpt
