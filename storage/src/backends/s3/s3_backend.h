// The S3 backend of the checkpoint store (s3_backend.cc). Internal to storage/.
#pragma once

#include <rocksdb/db.h>

#include <memory>

#include "backends/s3/s3_client.h"
#include "backends/store_backend.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

// Checks that the bucket answers and honours conditional writes (S3Client::Probe), then serves
// the store from it. `db` and `families` are the store's local cache of the metadata; they
// outlive the backend. `faults` (tests) injects faults into every request.
Result<std::unique_ptr<StoreBackend>> NewS3Backend(
    rocksdb::DB* db, const MetadataFamilies& families, const S3Options& options,
    std::shared_ptr<S3FaultInjector> faults = nullptr);

}  // namespace ckpt
