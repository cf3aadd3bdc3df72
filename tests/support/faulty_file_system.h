// FaultyFileSystem: RocksDB's file system with failures injected where a test asks for them —
// writes, syncs, reads or renames, after a number of calls or of bytes, as "no space left" or
// as an I/O error — and a free-space figure the test sets. Test support only: the store takes
// it through OpenStoreOn (storage/src/store_open.h).
//
// Thread safety: safe for concurrent use (RocksDB's background threads call it too).
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace ckpt::testing {

class FaultyFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  enum class Op { kWrite, kSync, kRead, kRename };
  struct Fault {
    Op op = Op::kWrite;
    // Calls of `op` (on matching files) that still succeed after arming.
    uint64_t after_calls = 0;
    // kWrite: bytes that still get written after arming; the call that would pass them fails.
    uint64_t after_bytes = UINT64_MAX;
    bool no_space = true;  // ENOSPC; else EIO
    // The EIO is marked retryable, as a remote file system marks a timeout.
    bool retryable = false;
    // Only files whose name contains this (".log", ".blob", ".sst", "MANIFEST"); empty: any.
    std::string file_contains;
    // How many calls fail once the fault fires; then it disarms. UINT64_MAX: until Clear().
    uint64_t failures = UINT64_MAX;
  };

  FaultyFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

  static const char* kClassName() { return "ckptd.FaultyFileSystem"; }
  const char* Name() const override { return kClassName(); }

  // An Env over this file system, for OpenStoreOn.
  static std::pair<std::shared_ptr<FaultyFileSystem>, std::shared_ptr<rocksdb::Env>> NewEnv() {
    auto fs = std::make_shared<FaultyFileSystem>();
    std::shared_ptr<rocksdb::Env> env(rocksdb::NewCompositeEnv(fs).release());
    return {fs, env};
  }

  void Arm(const Fault& fault) {
    std::lock_guard lock(mu_);
    fault_ = fault;
    calls_ = 0;
    bytes_ = 0;
    failed_ = 0;
  }
  void Clear() {
    std::lock_guard lock(mu_);
    fault_.reset();
  }
  // Calls failed since the last Arm.
  uint64_t failed() const {
    std::lock_guard lock(mu_);
    return failed_;
  }
  // What GetFreeSpace reports from now on (nullopt: the real figure; 0 while a no-space fault
  // is armed, as on a full volume).
  void SetFreeSpace(std::optional<uint64_t> bytes) {
    std::lock_guard lock(mu_);
    free_space_ = bytes;
  }

  // Whether a call of `op` on `file` moving `bytes` fails; counts it.
  rocksdb::IOStatus Check(Op op, const std::string& file, uint64_t bytes = 0) {
    std::lock_guard lock(mu_);
    if (!fault_ || fault_->op != op) return rocksdb::IOStatus::OK();
    if (!fault_->file_contains.empty() && file.find(fault_->file_contains) == std::string::npos) {
      return rocksdb::IOStatus::OK();
    }
    const bool by_calls = calls_++ >= fault_->after_calls;
    const bool by_bytes = op == Op::kWrite && fault_->after_bytes != UINT64_MAX &&
                          bytes_ + bytes > fault_->after_bytes;
    bytes_ += bytes;
    if (fault_->after_bytes != UINT64_MAX ? !by_bytes : !by_calls) return rocksdb::IOStatus::OK();
    ++failed_;
    const bool no_space = fault_->no_space;
    const bool retryable = fault_->retryable;
    if (failed_ >= fault_->failures) fault_.reset();
    if (no_space) return rocksdb::IOStatus::NoSpace("injected: No space left on device", file);
    rocksdb::IOStatus error = rocksdb::IOStatus::IOError("injected: Input/output error", file);
    error.SetRetryable(retryable);
    return error;
  }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    auto s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Writable>(this, f, std::move(*r));
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    auto s = target()->ReopenWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Writable>(this, f, std::move(*r));
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    auto s = target()->ReuseWritableFile(f, old, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Writable>(this, f, std::move(*r));
    return s;
  }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f, const rocksdb::FileOptions& o,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override {
    auto s = target()->NewRandomAccessFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<RandomAccess>(this, f, std::move(*r));
    return s;
  }
  rocksdb::IOStatus NewSequentialFile(const std::string& f, const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    auto s = target()->NewSequentialFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Sequential>(this, f, std::move(*r));
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& from, const std::string& to,
                               const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (auto s = Check(Op::kRename, to); !s.ok()) return s;
    return target()->RenameFile(from, to, o, dbg);
  }
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& o,
                                 uint64_t* free, rocksdb::IODebugContext* dbg) override {
    {
      std::lock_guard lock(mu_);
      if (free_space_ || (fault_ && fault_->no_space)) {
        *free = free_space_ ? *free_space_ : 0;
        return rocksdb::IOStatus::OK();
      }
    }
    return target()->GetFreeSpace(path, o, free, dbg);
  }

 private:
  class Writable final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    Writable(FaultyFileSystem* fs, std::string name, std::unique_ptr<rocksdb::FSWritableFile> f)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs), name_(std::move(name)) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kWrite, name_, d.size()); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::Append(d, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kWrite, name_, d.size()); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::Append(d, o, v, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& d, uint64_t offset,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kWrite, name_, d.size()); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::PositionedAppend(d, offset, o, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& d, uint64_t offset,
                                       const rocksdb::IOOptions& o,
                                       const rocksdb::DataVerificationInfo& v,
                                       rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kWrite, name_, d.size()); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::PositionedAppend(d, offset, o, v, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kSync, name_); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::Sync(o, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kSync, name_); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::Fsync(o, dbg);
    }
    rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t n, const rocksdb::IOOptions& o,
                                rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kSync, name_); !s.ok()) return s;
      return FSWritableFileOwnerWrapper::RangeSync(offset, n, o, dbg);
    }

   private:
    FaultyFileSystem* const fs_;
    const std::string name_;
  };

  class RandomAccess final : public rocksdb::FSRandomAccessFileOwnerWrapper {
   public:
    RandomAccess(FaultyFileSystem* fs, std::string name,
                 std::unique_ptr<rocksdb::FSRandomAccessFile> f)
        : FSRandomAccessFileOwnerWrapper(std::move(f)), fs_(fs), name_(std::move(name)) {}
    rocksdb::IOStatus Read(uint64_t offset, size_t n, const rocksdb::IOOptions& o,
                           rocksdb::Slice* result, char* scratch,
                           rocksdb::IODebugContext* dbg) const override {
      if (auto s = fs_->Check(Op::kRead, name_, n); !s.ok()) return s;
      return FSRandomAccessFileOwnerWrapper::Read(offset, n, o, result, scratch, dbg);
    }
    rocksdb::IOStatus MultiRead(rocksdb::FSReadRequest* reqs, size_t num,
                                const rocksdb::IOOptions& o,
                                rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kRead, name_); !s.ok()) {
        for (size_t i = 0; i < num; ++i) reqs[i].status = s;
        return s;
      }
      return FSRandomAccessFileOwnerWrapper::MultiRead(reqs, num, o, dbg);
    }

   private:
    FaultyFileSystem* const fs_;
    const std::string name_;
  };

  class Sequential final : public rocksdb::FSSequentialFileOwnerWrapper {
   public:
    Sequential(FaultyFileSystem* fs, std::string name, std::unique_ptr<rocksdb::FSSequentialFile> f)
        : FSSequentialFileOwnerWrapper(std::move(f)), fs_(fs), name_(std::move(name)) {}
    rocksdb::IOStatus Read(size_t n, const rocksdb::IOOptions& o, rocksdb::Slice* result,
                           char* scratch, rocksdb::IODebugContext* dbg) override {
      if (auto s = fs_->Check(Op::kRead, name_, n); !s.ok()) return s;
      return FSSequentialFileOwnerWrapper::Read(n, o, result, scratch, dbg);
    }

   private:
    FaultyFileSystem* const fs_;
    const std::string name_;
  };

  mutable std::mutex mu_;
  std::optional<Fault> fault_;
  uint64_t calls_ = 0;
  uint64_t bytes_ = 0;
  uint64_t failed_ = 0;
  std::optional<uint64_t> free_space_;
};

}  // namespace ckpt::testing
