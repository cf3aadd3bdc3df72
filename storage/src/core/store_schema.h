// The RocksDB layout of a store: its column families and their options (docs/design.md,
// "Schema"). Internal to storage/.
#pragma once

#include <rocksdb/db.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/codec/status.h"

namespace ckpt {

// The column families of an open store. The handles belong to the store, which destroys them
// before closing the database.
struct StoreFamilies {
  rocksdb::ColumnFamilyHandle* models = nullptr;
  rocksdb::ColumnFamilyHandle* versions = nullptr;
  rocksdb::ColumnFamilyHandle* manifests = nullptr;
  rocksdb::ColumnFamilyHandle* chunks = nullptr;  // the local backend's chunk records
  rocksdb::ColumnFamilyHandle* codec_state = nullptr;
  rocksdb::ColumnFamilyHandle* tags = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> all;  // every handle, the default family's included
};

// Opens (creating if needed) the store's database in `data_dir` with every family.
Status OpenStoreDatabase(const std::string& data_dir, std::unique_ptr<rocksdb::DB>* db,
                         StoreFamilies* families);

}  // namespace ckpt
