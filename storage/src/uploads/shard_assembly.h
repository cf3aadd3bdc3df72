// The shards of a sharded version as global tensors: what each shard's header declares, the
// checks between shards, and the assembly of the version's body from the stored shards
// (docs/design.md, "Sharded versions"). Internal to storage/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/safetensors.h"
#include "ckpt/base/status.h"
#include "ckpt/base/tensor_slices.h"
#include "uploads/upload_spool.h"

namespace ckpt {

// The metadata key of an assembled version's layout (CheckpointStore::GetShardLayout).
inline constexpr std::string_view kLayoutMetadataKey = "ckptd.layout";

// One tensor of a shard, placed in its global tensor.
struct ShardTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> global_shape;
  TensorBox box;            // the part of the global tensor the shard holds
  uint64_t data_begin = 0;  // offset of its bytes in the shard's body
};

// What a shard's header declares.
struct ShardHeader {
  uint32_t shard = 0;
  std::vector<ShardTensor> tensors;             // body order
  std::map<std::string, std::string> metadata;  // without kSlicesMetadataKey
};

// The shard's tensors in global coordinates (its slice declarations checked against the
// tensors' own shapes). InvalidArgument names the tensor and the shard.
Result<ShardHeader> DescribeShard(uint32_t shard, const SafetensorsHeader& header);

// Reads and describes a stored shard's header.
Result<ShardHeader> ReadShardHeader(uint32_t shard, const SpooledShardFile& file);

// Checks a shard against the other shards of its upload: a tensor's dtype and global shape
// agree everywhere; two shards' parts of one tensor are disjoint, or both the whole tensor
// (replicas, which the commit checks are equal).
Status CheckShardAgainst(const ShardHeader& shard, std::span<const ShardHeader* const> others);

// How the assembled body is made from the shards.
struct AssemblyPlan {
  struct Piece {
    uint32_t shard = 0;
    TensorBox box;
    uint64_t data_begin = 0;
  };
  struct Tensor {
    std::string name;
    DType dtype = DType::kU8;
    std::vector<uint64_t> shape;
    std::vector<Piece> pieces;  // tiling the tensor
    // Parts held by several shards: (index in pieces, another shard's copy).
    std::vector<std::pair<size_t, Piece>> replicas;
  };
  std::vector<Tensor> tensors;  // body order: by first shard holding them, then its order
  std::string raw_header;       // of the assembled body, with its layout in the metadata
  uint64_t body_bytes = 0;      // the assembled body's size, header included
};

// Plans the assembly of a complete upload: `shards` by index, `shard_sha256` their digests.
// Checks that every global tensor is tiled exactly (InvalidArgument naming tensor and shards).
Result<AssemblyPlan> PlanAssembly(std::span<const ShardHeader* const> shards,
                                  std::span<const std::string> shard_sha256);

// Streams the assembled body through `write` in pieces of at most a few MiB, reading the
// shards from `files` (by shard index); first checks that replicas are identical
// (InvalidArgument naming the tensor and shards).
Status WriteAssembled(const AssemblyPlan& plan, std::span<const SpooledShardFile* const> files,
                      const std::function<Status(std::span<const uint8_t>)>& write);

}  // namespace ckpt
