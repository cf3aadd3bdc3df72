// OpenStoreOn: CheckpointStore::Open over a given RocksDB environment, so that tests can put a
// fault-injecting file system under a store (tests/support/faulty_file_system.h) or inject
// faults into its requests to S3. Internal to
// storage/ and its white-box tests.
#pragma once

#include <rocksdb/env.h>

#include <memory>

#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

class S3FaultInjector;

// As CheckpointStore::Open, with RocksDB reading and writing through `env` (null: the
// process's file system) and, with StoreOptions::s3, `s3_faults` injecting faults into every
// request to the bucket (null: none).
Result<std::unique_ptr<CheckpointStore>> OpenStoreOn(
    const StoreOptions& options, std::shared_ptr<rocksdb::Env> env,
    std::shared_ptr<S3FaultInjector> s3_faults = nullptr);

}  // namespace ckpt
