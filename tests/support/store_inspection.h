// Reads a closed ckptd data directory with RocksDB directly, to check what is physically stored.
#pragma once

#include <rocksdb/db.h>

#include <memory>
#include <string>
#include <vector>

namespace ckpt::testing {

// Number of keys in column family `family` of the (closed) database at `dir`.
inline size_t CountKeys(const std::string& dir, const std::string& family) {
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok()) return 0;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, families, &handles, &db).ok()) {
    return 0;
  }
  size_t count = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != family) continue;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++count;
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  delete db;
  return count;
}

}  // namespace ckpt::testing
