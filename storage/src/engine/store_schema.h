// The RocksDB layout of a store: its column families and their options (docs/design.md,
// "Schema"). Internal to storage/.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/listener.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

// The RocksDB column families of the metadata, as the store opened them.
struct MetadataFamilies {
  rocksdb::ColumnFamilyHandle* models = nullptr;
  rocksdb::ColumnFamilyHandle* versions = nullptr;
  rocksdb::ColumnFamilyHandle* manifests = nullptr;
  rocksdb::ColumnFamilyHandle* codec_state = nullptr;
  rocksdb::ColumnFamilyHandle* tags = nullptr;
};

// The column families of an open store: the metadata families, the local backend's chunk
// records, and every handle. The handles belong to the store, which destroys them before
// closing the database.
struct StoreFamilies : MetadataFamilies {
  rocksdb::ColumnFamilyHandle* chunks = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> all;  // the default family's included
};

// Opens (creating if needed) the store's database in `data_dir` with every family, through
// `env` (null: the default), telling `listener` (if set) of the engine's events and passing its
// log lines to `engine_log` (null: standard error; never a file in `data_dir`).
Status OpenStoreDatabase(const std::string& data_dir, rocksdb::Env* env,
                         std::shared_ptr<rocksdb::EventListener> listener,
                         std::function<void(std::string_view)> engine_log,
                         std::unique_ptr<rocksdb::DB>* db, StoreFamilies* families);

}  // namespace ckpt
