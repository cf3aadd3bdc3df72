// The restore of part of a version (RestoreSelection): chosen tensors, one box of a tensor, or
// the resharded view for one rank, as a safetensors body of its own whose header is made here.
// Every chunk a part needs is decoded (and its chain verified) as a full restore does; bytes of
// a box are gathered from the decoded chunks. Internal to storage/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"
#include "engine/scoped_snapshot.h"
#include "records/records.h"

namespace ckpt {

// A restore of `selection` (not whole) of version `info`, stored as `record`, reading at
// `snapshot`, which the stream keeps until it is destroyed.
Result<std::unique_ptr<RestoreStream>> OpenRestoreView(const StoreContext& ctx,
                                                       ScopedSnapshot snapshot, std::string model,
                                                       VersionInfo info, VersionRecord record,
                                                       uint64_t cache_generation,
                                                       const RestoreSelection& selection);

// The layout of a version stored as `record` (CheckpointStore::GetShardLayout).
Result<std::string> ShardLayoutOf(const VersionRecord& record);

}  // namespace ckpt
