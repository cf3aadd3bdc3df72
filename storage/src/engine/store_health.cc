// The store's write health: reserve, engine errors, resumption (store_health.h).
#include "engine/store_health.h"

#include <algorithm>
#include <string>
#include <utility>

namespace ckpt {

// Records the engine's errors in the StoreHealth and keeps RocksDB from resuming by itself.
class StoreHealthListener final : public rocksdb::EventListener {
 public:
  explicit StoreHealthListener(StoreHealth* health) : health_(health) {}

  const char* Name() const override { return "ckptd.StoreHealth"; }

  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override {
    if (error == nullptr || error->ok()) return;
    // A write-ahead log write that failed other than for space leaves the log writer failed:
    // RocksDB (7.8) resumes, yet every later write fails on that log. Only a reopen recovers.
    const bool log_failed = reason == rocksdb::BackgroundErrorReason::kWriteCallback &&
                            error->IsIOError() && !error->IsNoSpace();
    health_->OnEngineError(*error, log_failed);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    if (auto_recovery) *auto_recovery = false;
  }
  void OnErrorRecoveryEnd(const rocksdb::BackgroundErrorRecoveryInfo& info) override {
    if (info.new_bg_error.ok()) health_->OnRecovered();
  }

 private:
  StoreHealth* const health_;
};

std::string_view StoreHealthStateName(StoreHealthReport::State state) {
  switch (state) {
    case StoreHealthReport::State::kWritable:
      return "writable";
    case StoreHealthReport::State::kReserveReached:
      return "reserve_reached";
    case StoreHealthReport::State::kSuspended:
      return "suspended";
    case StoreHealthReport::State::kReadOnly:
      return "read_only";
  }
  return "unknown";
}

namespace {

bool Stops(const rocksdb::Status& error) {
  return error.severity() >= rocksdb::Status::Severity::kHardError;
}

bool Unrecoverable(const rocksdb::Status& error) {
  return error.severity() >= rocksdb::Status::Severity::kFatalError;
}

// Why the engine takes no writes, in words for clients; the engine's text is the detail.
Status Refusal(const rocksdb::Status& error, bool read_only) {
  Status s;
  if (read_only) {
    s = Status::Unavailable(
        "the store is read-only after a storage error it cannot recover from; reads work, "
        "writes need a restart of ckptd once the cause is fixed (see the server log)");
  } else if (error.IsNoSpace()) {
    s = Status::NoSpace(
        "writes are suspended: the data volume ran out of space; they resume by themselves once "
        "space is free");
  } else {
    s = Status::Unavailable(
        "writes are suspended after a storage write error; they resume by themselves once its "
        "cause is gone (see the server log)");
  }
  return s.WithDetail(error.ToString());
}

}  // namespace

StoreHealth::StoreHealth(rocksdb::Env* env, std::string data_dir, uint64_t min_free_bytes)
    : env_(env), data_dir_(std::move(data_dir)), min_free_bytes_(min_free_bytes) {}

std::shared_ptr<rocksdb::EventListener> StoreHealth::NewListener() {
  return std::make_shared<StoreHealthListener>(this);
}

void StoreHealth::Attach(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* chunks) {
  std::lock_guard lock(mu_);
  db_ = db;
  chunks_ = chunks;
  memtable_chunks_.store(chunks, std::memory_order_release);
  memtable_db_.store(db, std::memory_order_release);
}

bool StoreHealth::RoomFor(uint64_t bytes) const {
  const uint64_t free = FreeBytes();
  // A margin for the tables and logs the compaction writes beside the payloads.
  constexpr uint64_t kMargin = 16ull << 20;
  return free == UINT64_MAX || free >= bytes + kMargin;
}

void StoreHealth::OnEngineError(const rocksdb::Status& error, bool unrecoverable) {
  std::lock_guard lock(mu_);
  engine_errors_.fetch_add(1, std::memory_order_relaxed);
  // A stopping error is not overwritten by a lesser one reported after it.
  if (engine_error_.ok() || error.severity() >= engine_error_.severity() || unrecoverable) {
    engine_error_ = error;
  }
  if (unrecoverable || Unrecoverable(error)) read_only_ = true;
}

void StoreHealth::OnRecovered() {
  std::lock_guard lock(mu_);
  if (!engine_error_.ok() && !read_only_) {
    engine_error_ = rocksdb::Status::OK();
    ++recoveries_;
  }
}

uint64_t StoreHealth::EngineErrors() const {
  return engine_errors_.load(std::memory_order_relaxed);
}

void StoreHealth::AddUnloggedBytes(uint64_t bytes) {
  unlogged_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void StoreHealth::RemoveUnloggedBytes(uint64_t bytes) {
  unlogged_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

uint64_t StoreHealth::FreeBytes() const {
  uint64_t free = 0;
  if (!env_->GetFreeSpace(data_dir_, &free).ok()) return UINT64_MAX;
  // Large chunk records skip the write-ahead log and reach the volume only when their memtable
  // is flushed: they are spoken for already. Records a writer gave up stay in the memtable
  // until the flush drops them, so they are not counted.
  rocksdb::DB* db = memtable_db_.load(std::memory_order_acquire);
  uint64_t unflushed = 0;
  if (db != nullptr &&
      db->GetIntProperty(memtable_chunks_.load(std::memory_order_acquire),
                         rocksdb::DB::Properties::kCurSizeAllMemTables, &unflushed)) {
    free -= std::min({free, unflushed, unlogged_bytes_.load(std::memory_order_relaxed)});
  }
  return free;
}

Status StoreHealth::EngineRefusalLocked() {
  if (engine_error_.ok()) return Status::Ok();
  if (read_only_) return Refusal(engine_error_, true);
  const auto now = std::chrono::steady_clock::now();
  // After running out of space, resume only once the volume has room again: a write that
  // fails on the log a resumption just opened leaves RocksDB (7.8) with a failed log writer
  // that the next resumption keeps (the next write then fails, or aborts the process).
  const bool room =
      !engine_error_.IsNoSpace() || FreeBytes() >= std::max(min_free_bytes_, kResumeMinFreeBytes);
  if (db_ != nullptr && !resuming_ && room && now - last_resume_ >= kResumeInterval) {
    last_resume_ = now;
    resuming_ = true;
    // Resume flushes the memtables and reports through the listener (OnRecovered), which
    // takes mu_: it runs unlocked, and a check meanwhile sees the error still set.
    rocksdb::DB* db = db_;
    const rocksdb::Status stopped_with = engine_error_;
    mu_.unlock();
    const rocksdb::Status resumed = db->Resume();
    mu_.lock();
    resuming_ = false;
    if (resumed.ok()) {
      if (!engine_error_.ok() && engine_error_ == stopped_with) {
        engine_error_ = rocksdb::Status::OK();
        ++recoveries_;
      }
    } else if (Unrecoverable(resumed)) {
      read_only_ = true;
    }
  }
  if (read_only_) return Refusal(engine_error_, true);
  if (engine_error_.ok() || !Stops(engine_error_)) return Status::Ok();
  return Refusal(engine_error_, false);
}

Status StoreHealth::CheckWrite() {
  std::unique_lock lock(mu_);
  return EngineRefusalLocked();
}

Status StoreHealth::CheckPush(uint64_t incoming_bytes) {
  {
    std::unique_lock lock(mu_);
    CKPT_RETURN_IF_ERROR(EngineRefusalLocked());
  }
  if (min_free_bytes_ == 0) return Status::Ok();
  const uint64_t free = FreeBytes();
  if (free == UINT64_MAX) return Status::Ok();  // unknown: the engine's own errors decide
  if (free >= min_free_bytes_ && free - min_free_bytes_ >= incoming_bytes) return Status::Ok();
  std::string why = incoming_bytes > 0
                        ? "a push of " + std::to_string(incoming_bytes) +
                              " bytes does not fit: the data volume has " + std::to_string(free) +
                              " bytes free"
                        : "the data volume has " + std::to_string(free) + " bytes free";
  return Status::NoSpace(why + " and keeps " + std::to_string(min_free_bytes_) +
                         " in reserve (storage.min_free_bytes); delete versions or models, or "
                         "run garbage collection, to make room");
}

StoreHealthReport StoreHealth::Report() {
  StoreHealthReport report;
  report.reserved_bytes = min_free_bytes_;
  const uint64_t free = FreeBytes();
  report.free_bytes = free == UINT64_MAX ? 0 : free;
  std::unique_lock lock(mu_);
  const Status refusal = EngineRefusalLocked();
  report.engine_errors = engine_errors_.load(std::memory_order_relaxed);
  report.recoveries = recoveries_;
  const bool low = min_free_bytes_ > 0 && free != UINT64_MAX && free < min_free_bytes_;
  if (db_ != nullptr && chunks_ != nullptr && low != blob_gc_paused_ && !read_only_) {
    const rocksdb::Status set =
        db_->SetOptions(chunks_, {{"enable_blob_garbage_collection", low ? "false" : "true"}});
    if (set.ok()) blob_gc_paused_ = low;
  }
  if (!refusal.ok()) {
    report.state =
        read_only_ ? StoreHealthReport::State::kReadOnly : StoreHealthReport::State::kSuspended;
    report.reason = refusal.message();
  } else if (low) {
    report.state = StoreHealthReport::State::kReserveReached;
    report.reason = "the data volume has " + std::to_string(free) + " bytes free, below the " +
                    std::to_string(min_free_bytes_) +
                    " bytes kept in reserve (storage.min_free_bytes): pushes are refused; "
                    "deletes, retention and garbage collection work";
  }
  return report;
}

}  // namespace ckpt
