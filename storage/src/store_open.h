// OpenStoreOn: CheckpointStore::Open over a given RocksDB environment, so that tests can put a
// fault-injecting file system under a store (tests/support/faulty_file_system.h). Internal to
// storage/ and its white-box tests.
#pragma once

#include <rocksdb/env.h>

#include <memory>

#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

// As CheckpointStore::Open, with RocksDB reading and writing through `env` (null: the
// process's file system).
Result<std::unique_ptr<CheckpointStore>> OpenStoreOn(const StoreOptions& options,
                                                     std::shared_ptr<rocksdb::Env> env);

}  // namespace ckpt
