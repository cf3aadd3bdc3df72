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
#include "ckpt/codec/coding_plan.h"
#include "ckpt/storage/checkpoint_store.h"
#include "backends/upload_spool.h"

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
    uint32_t tensor = 0;  // in the shard's header
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

struct EncodedShardIndex;

// The stored form of one shard: a safetensors body, or an encoded shard and its index.
struct ShardSource {
  const SpooledShardFile* file = nullptr;
  const EncodedShardIndex* encoded = nullptr;  // null: a safetensors body
};

// The push a version is fed to chunk by chunk when ranks coded some of its shards: the commit's
// push session. Each chunk of the version comes once, in body order, raw or as its rank's record.
class ChunkedPush {
 public:
  // A shard its rank coded, by the plan it names.
  struct CodedShard {
    const ShardHeader* header = nullptr;
    uint64_t plan_digest = 0;
    uint64_t reference = 0;
  };
  virtual ~ChunkedPush() = default;
  // Plans the version whose header is `raw_header` (of `shard_count` shards); StalePlan when a
  // coded shard's plan is no longer the one the store makes for it. Returns the version's plan.
  virtual Result<CodingPlan> Start(std::string_view raw_header, std::span<const CodedShard> coded,
                                   uint32_t shard_count) = 0;
  virtual Status RawChunk(uint32_t tensor, uint32_t chunk, std::span<const uint8_t> bytes) = 0;
  // `record` is valid during the call only.
  // `shard`: the shard whose rank coded it.
  virtual Status CodedChunk(uint32_t tensor, uint32_t chunk, std::string_view record,
                            const ChunkCodingInfo& info, uint32_t shard) = 0;
  virtual Result<VersionInfo> Commit() = 0;
  // After a failed Commit (or CodedChunk): the shard one of whose records was refused (it does
  // not restore to what its rank reconstructed: the rank's reference drifted), if that was why.
  virtual std::optional<uint32_t> RefusedShard() const = 0;
};

// Feeds the assembled version to `push` chunk by chunk (its plan `plan`, which Start
// returned): a chunk a rank coded as that record, every other chunk raw, gathered from the
// shards. First checks that replicas agree (InvalidArgument naming the tensor and shards):
// bytes against bytes, records by their reconstruction's checksum, a record against bytes where
// the record is lossless (a lossy record and the bytes it was coded from are not compared).
Status WriteAssembledChunks(const AssemblyPlan& assembly, const CodingPlan& plan,
                            std::span<const ShardSource> shards, ChunkedPush& push);

}  // namespace ckpt
