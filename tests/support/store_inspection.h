// Reads a closed ckptd data directory with RocksDB directly, to check what is physically stored.
#pragma once

#include <rocksdb/db.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::testing {

// Every key -> value of column family `family` of the (closed) database at `dir`, in key order.
inline std::vector<std::pair<std::string, std::string>> ReadAll(const std::string& dir,
                                                                const std::string& family) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok()) return out;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, families, &handles, &db).ok()) {
    return out;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != family) continue;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[i]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      out.emplace_back(it->key().ToString(), it->value().ToString());
    }
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  delete db;
  return out;
}

// Number of keys in column family `family` of the (closed) database at `dir`.
inline size_t CountKeys(const std::string& dir, const std::string& family) {
  return ReadAll(dir, family).size();
}

// Writes key -> value into column family `family` of the (closed) database at `dir`, bypassing
// ckptd: to plant damage or leftovers for recovery and scrub tests. Returns false on failure.
inline bool PutKey(const std::string& dir, const std::string& family, const std::string& key,
                   const std::string& value) {
  std::vector<std::string> names;
  if (!rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok()) return false;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::Open(rocksdb::DBOptions(), dir, families, &handles, &db).ok()) return false;
  bool ok = false;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == family) ok = db->Put(rocksdb::WriteOptions(), handles[i], key, value).ok();
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  delete db;
  return ok;
}

// Flips one byte in the middle of the largest file in `dir` whose name ends with `suffix`
// (".blob", ".sst"): damage on disk, below RocksDB. Returns the file's name, empty if none.
inline std::string FlipByteInLargestFile(const std::string& dir, const std::string& suffix) {
  std::filesystem::path largest;
  uintmax_t size = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() >= suffix.size() && name.ends_with(suffix) && entry.file_size() > size) {
      size = entry.file_size();
      largest = entry.path();
    }
  }
  if (largest.empty()) return {};
  std::fstream f(largest, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(size / 2));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(static_cast<std::streamoff>(size / 2));
  f.write(&c, 1);
  return largest.filename().string();
}

}  // namespace ckpt::testing
