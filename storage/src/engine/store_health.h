// StoreHealth: whether the store takes writes now — the free-space reserve and the storage
// engine's errors — and the recovery from the errors RocksDB can recover from. Internal to
// storage/; docs/design.md, "Faults of the disk".
//
// RocksDB stops writing after a failed write, sync or flush (a "background error"): every
// later write returns that error until DB::Resume() succeeds. The listener this creates
// records each such error and turns RocksDB's own automatic recovery off, so that one party
// (this class) decides when to resume: on the next write check or report, at most every
// kResumeInterval, and after running out of space only once the volume has room again.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/listener.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt {

class StoreHealth {
 public:
  // `env` and `data_dir` tell the free space; both outlive this object.
  StoreHealth(rocksdb::Env* env, std::string data_dir, uint64_t min_free_bytes);

  // The listener to register in the database's options before it opens.
  std::shared_ptr<rocksdb::EventListener> NewListener();
  // The open database (null before it opens: checks pass, nothing to resume) and its chunks
  // family, whose blob garbage collection pauses while the volume is at the reserve.
  void Attach(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks);

  // Before a push stores anything: Ok when `incoming_bytes` more keep the reserve free and the
  // engine takes writes; NoSpace naming free and reserved bytes, or the engine's refusal.
  Status CheckPush(uint64_t incoming_bytes);
  // Before any other change (deletes, GC, tags, policies): the engine's refusal only.
  Status CheckWrite();
  // The state, after trying to resume a stopped engine. Pauses the chunks family's blob garbage
  // collection while the volume is at the reserve, and resumes it once it is not: the
  // collection copies the live payloads of a blob file before the file goes, and a compaction
  // that meets a full volume is an error the engine cannot be trusted to survive.
  StoreHealthReport Report();
  // Whether the volume has room for `bytes` more (a compaction rewriting that much), reserve
  // or not: garbage collection may use the reserve, as freeing space is what it is for.
  bool RoomFor(uint64_t bytes) const;
  // The errors the engine reported since it opened (failed writes, flushes, compactions),
  // whether it recovered from them or not.
  uint64_t EngineErrors() const;
  // Chunk records written without the write-ahead log that no flush has written yet and no
  // writer has given up (LocalBackend): spoken for on the volume, so free space excludes them.
  void AddUnloggedBytes(uint64_t bytes);
  void RemoveUnloggedBytes(uint64_t bytes);

 private:
  friend class StoreHealthListener;
  static constexpr std::chrono::milliseconds kResumeInterval{250};
  // Free space a resumption after running out of space waits for (or the reserve, if larger).
  static constexpr uint64_t kResumeMinFreeBytes = 64ull << 20;

  // `unrecoverable`: whatever RocksDB's severity, only a reopen recovers (read-only until then).
  void OnEngineError(const rocksdb::Status& error, bool unrecoverable);
  void OnRecovered();
  // Ok, or why the engine takes no writes, after trying to resume it. REQUIRES: mu_ held.
  Status EngineRefusalLocked();
  // The volume's free bytes less the unlogged records' (at most what the chunks family's
  // memtables hold: a record a writer left behind is counted until it is flushed, not longer).
  uint64_t FreeBytes() const;

  rocksdb::Env* const env_;
  const std::string data_dir_;
  const uint64_t min_free_bytes_;

  std::mutex mu_;
  rocksdb::DB* db_ = nullptr;
  rocksdb::ColumnFamilyHandle* chunks_ = nullptr;
  bool blob_gc_paused_ = false;
  // db_ and chunks_ for FreeBytes, which runs with and without mu_ (set before db).
  std::atomic<rocksdb::DB*> memtable_db_{nullptr};
  std::atomic<rocksdb::ColumnFamilyHandle*> memtable_chunks_{nullptr};
  // The error the engine stopped writing with; ok while it writes.
  rocksdb::Status engine_error_;
  bool read_only_ = false;
  bool resuming_ = false;  // one thread calls DB::Resume at a time
  std::chrono::steady_clock::time_point last_resume_{};
  // Read without mu_: every chunk record written asks (LocalBackend::PutChunk).
  std::atomic<uint64_t> engine_errors_{0};
  std::atomic<uint64_t> unlogged_bytes_{0};
  uint64_t recoveries_ = 0;
};

}  // namespace ckpt
