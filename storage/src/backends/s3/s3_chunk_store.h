// The chunk store (backends/chunk_store.h) on an S3 bucket: one object per name, under the
// client's prefix. Internal to storage/.
#pragma once

#include <memory>

#include "backends/chunk_store.h"
#include "backends/s3/s3_client.h"

namespace ckpt {

// A chunk store on `client` (which outlives it). Writes, reads and removals of many objects run
// on the client's threads, S3Options::parallelism at a time.
std::unique_ptr<ChunkStore> NewS3ChunkStore(S3Client* client);

}  // namespace ckpt
