// StoreMaintenance: the store's upkeep of its own data — scrub (every record and version
// checked), backups, compaction of freed ranges, removal of what a crash or an interrupted push
// left behind. Used by the store's maintenance calls and at open. Internal to storage/.
//
// Thread safety: safe for concurrent use; callers hold the model's lock where a method says so.
#pragma once

#include <rocksdb/db.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"

namespace ckpt {

class StoreMaintenance {
 public:
  explicit StoreMaintenance(const StoreContext& ctx) : ctx_(ctx) {}

  // Recovery at open, local backend only: loads what awaits compaction, removes the chunks of
  // pushes and rebases that never committed, then manifests no version needs any more.
  Status Recover();

  // Every chunk record's checksum and owner, and every version restored in full.
  Result<ScrubReport> Scrub(const std::string& model);

  // A verified RocksDB backup of the local store into `backup_dir`.
  Result<BackupResult> Backup(const std::string& backup_dir);
  static Status RestoreBackup(const std::string& backup_dir, const std::string& data_dir);

  // Chunk records of `model` that no stored push owns (interrupted pushes of this or a former
  // owner, on a shared backend). REQUIRES: the model's lock.
  Result<uint64_t> RemoveOrphanChunks(const std::string& model);

  // Records `freed` bytes of the model as awaiting compaction (persisted, local backend: a
  // restart keeps the count, AwaitingCompactionRecord) and, per `compaction`, compacts when any
  // await it. Outside the model lock: pushes proceed meanwhile. Returns the bytes the
  // compaction took off the volume — `freed` and what earlier passes freed since the last
  // compaction — or 0 if it did not compact.
  Result<uint64_t> MaybeCompact(const std::string& model, uint64_t freed,
                                GcOptions::Compaction compaction);

  // Stored bytes removed (of every model) whose space the next compaction gives back.
  uint64_t BytesAwaitingCompaction() const;
  // Forgets what `model` had awaiting compaction (the model is deleted: its records go with
  // its whole key range).
  void ForgetModel(const std::string& model);

  // Flushes every family's memtable (waiting, as SealChunkWrites does) once the write-ahead log
  // holds more than a little: its files hold every byte written since the last flush of any
  // family in them, so until then a store that went quiet occupies several times what it
  // stores. Called when a model's pushes and their pass are done.
  Status SettleJournal();

 private:
  Result<ScrubReport> ScrubAt(const rocksdb::ReadOptions& ro, const std::string& name);
  Status CompactModelChunks(const std::string& model, bool force_blob_gc);
  Status RemoveInterruptedPushes();
  Status LoadAwaitingCompaction();
  // Writes the model's count of bytes awaiting compaction (0: removes it). REQUIRES: freed_mu_,
  // so that the last count written is the last one counted.
  void PersistAwaiting(const std::string& model, uint64_t bytes);
  Status RemoveOrphanedManifests();

  const StoreContext& ctx_;
  mutable std::mutex freed_mu_;
  std::unordered_map<std::string, uint64_t> freed_since_compaction_;  // guarded by freed_mu_
};

}  // namespace ckpt
