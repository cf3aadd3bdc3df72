// ScopedSnapshot: a RocksDB snapshot, released when the object is destroyed. Internal to
// storage/. Movable, not copyable; thread-compatible (the snapshot itself may be read from any
// number of threads while the object lives).
#pragma once

#include <rocksdb/db.h>

#include <utility>

namespace ckpt {

class ScopedSnapshot {
 public:
  explicit ScopedSnapshot(rocksdb::DB* db) : db_(db), snapshot_(db->GetSnapshot()) {}
  ~ScopedSnapshot() {
    if (snapshot_ != nullptr) db_->ReleaseSnapshot(snapshot_);
  }
  ScopedSnapshot(ScopedSnapshot&& other) noexcept
      : db_(other.db_), snapshot_(std::exchange(other.snapshot_, nullptr)) {}
  ScopedSnapshot& operator=(ScopedSnapshot&&) = delete;
  ScopedSnapshot(const ScopedSnapshot&) = delete;
  ScopedSnapshot& operator=(const ScopedSnapshot&) = delete;

  const rocksdb::Snapshot* get() const { return snapshot_; }

  // Read options that read at this snapshot.
  rocksdb::ReadOptions reads() const {
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot_;
    return ro;
  }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snapshot_;
};

}  // namespace ckpt
