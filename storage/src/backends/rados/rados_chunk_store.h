// The RADOS chunk store on a connection the caller already has. Internal to storage/.
#pragma once

#include <memory>
#include <rados/librados.hpp>

#include "backends/chunk_store.h"

namespace ckpt {

// Connects `cluster` as `where` names (client, ceph.conf) and opens `io` on its pool and
// namespace; IoError naming the step that failed.
Status ConnectToPool(const RadosChunkStoreOptions& where, librados::Rados* cluster,
                     librados::IoCtx* io);

// A chunk store in `io`'s pool and namespace (the IoCtx is duplicated; the connection behind it
// must outlive the store).
std::unique_ptr<ChunkStore> NewRadosChunkStore(librados::IoCtx& io);

}  // namespace ckpt
