// The encoded restore: a stored version sent as the chunk records that reconstruct it (an
// encoded pull body, ckpt/codec/encoded_pull.h), for a client that decodes them itself.
// Internal to storage/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"
#include "engine/scoped_snapshot.h"
#include "records/records.h"

namespace ckpt {

// The encoded pull body of version `info` (stored as `record`), read through `snapshot`. With
// `since_seq` (the manifest of version `since_version`, which the client holds), a chunk whose
// chain runs through that manifest is sent as the deltas after it; any other chunk whose tensor
// the client holds in the same layout as a delta from it that the store codes (and keeps in
// ctx.since_deltas for the next follower) when that is smaller than the chain from the
// keyframe, which is sent otherwise; any other chain of several links as an exact keyframe
// coded (and kept) the same way, when that is smaller. A `selection` that is not whole (and
// then no `since_seq`) sends the part it names (a format 2 body): only the chunks that hold each
// tensor's box. The body's size is known when this returns (the records' sizes are read, and
// the deltas coded, to learn it). `cache_generation`: the reference cache's generation read
// before the snapshot was taken.
Result<std::unique_ptr<RestoreStream>> OpenEncodedRestoreStream(
    const StoreContext& ctx, ScopedSnapshot snapshot, std::string model, VersionInfo info,
    VersionRecord record, uint64_t cache_generation, uint64_t since_seq, uint64_t since_version,
    const RestoreSelection& selection);

}  // namespace ckpt
