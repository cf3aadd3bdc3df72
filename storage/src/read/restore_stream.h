// The restore stream: a stored version's body, header first, then every chunk decoded (from
// the reference cache or by walking its chain) in body order, its SHA-256 checked against the
// one recorded at push before the last piece is handed out. Internal to storage/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"
#include "engine/scoped_snapshot.h"
#include "records/records.h"

namespace ckpt {

// A restore of version `info` (stored as `record`) reading at `snapshot`, which the stream keeps
// until it is destroyed. `cache_generation` is the reference cache's generation read before the
// snapshot was taken. With `use_cache` false every chunk is decoded from storage and the
// reference cache is left alone (scrub).
Result<std::unique_ptr<RestoreStream>> OpenRestoreStream(const StoreContext& ctx,
                                                         ScopedSnapshot snapshot, std::string model,
                                                         VersionInfo info, VersionRecord record,
                                                         uint64_t cache_generation, bool use_cache);

}  // namespace ckpt
