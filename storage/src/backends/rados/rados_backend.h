// The RADOS backend of the checkpoint store (rados_backend.cc). Internal to storage/; built when
// CKPT_WITH_RADOS is on.
#pragma once

#include <rocksdb/db.h>

#include <memory>

#include "backends/store_backend.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

// Connects to the cluster and opens the pool; IoError naming the step if it cannot. `db` and
// `families` are the store's local cache of the metadata; they outlive the backend.
Result<std::unique_ptr<StoreBackend>> NewRadosBackend(rocksdb::DB* db,
                                                      const MetadataFamilies& families,
                                                      const ClusterOptions& options);

}  // namespace ckpt
