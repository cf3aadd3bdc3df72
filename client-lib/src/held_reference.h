// What the client keeps of models it pushes or pulls encoded: per model, the restored body of
// the last version it pushed or pulled (the base of the next delta either way), read mapped.
// Internal to client-lib.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ckpt/base/status.h"

namespace ckpt {

// A file mapped read-only for the lifetime of the object. Move-only.
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&&) = delete;
  ~MappedFile();
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  size_t size_;
};

// The reference kept for a model in a directory: <dir>/<model>.safetensors, and the sidecar
// <dir>/<model>.json naming the version it restores and that body's SHA-256. Pushes and pulls
// that use or replace them hold <dir>/<model>.lock (ReferenceLock), so that processes sharing a
// directory never pair one's file with another's sidecar.
struct HeldReference {
  std::string path;
  std::string sidecar;
  std::string lock;
  uint64_t version = 0;         // 0: none held (no file, or no readable sidecar)
  std::string restored_sha256;  // empty: none held
};

// A private temporary directory, removed with what it holds on destruction. Move-only.
class ScratchDir {
 public:
  static Result<ScratchDir> Make();
  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir();
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// An exclusive claim (flock) on a model's reference in its directory, for one push or pull;
// released on destruction. Waits for another holder. Move-only.
class ReferenceLock {
 public:
  // Creates `dir` if it is missing, then claims `model`'s reference in it.
  static Result<ReferenceLock> Acquire(const std::string& dir, std::string_view model);
  // The same without waiting: nullopt while another holds it.
  static Result<std::optional<ReferenceLock>> TryAcquire(const std::string& dir,
                                                         std::string_view model);
  ReferenceLock(ReferenceLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ReferenceLock& operator=(ReferenceLock&&) = delete;
  ~ReferenceLock();

 private:
  explicit ReferenceLock(int fd) : fd_(fd) {}
  // The locked file of Acquire (waiting) or TryAcquire (not: -1 while another holds it).
  static Result<int> Claim(const std::string& dir, std::string_view model, bool wait);
  int fd_;
};

// A file written front to back that is renamed into place once whole (a reference, a pulled
// body). Each MiB written is handed to the kernel's writeback at once: ext4 flushes a file
// renamed over another before the rename returns (its guard against an empty file after a
// crash), and a flush begun while the body was still coming leaves that rename little to wait
// for. Move-only; one writer.
class WritebackFile {
 public:
  static Result<WritebackFile> Create(const std::string& path);
  WritebackFile(WritebackFile&& other) noexcept
      : path_(std::move(other.path_)),
        fd_(std::exchange(other.fd_, -1)),
        written_(other.written_),
        handed_(other.handed_) {}
  WritebackFile& operator=(WritebackFile&&) = delete;
  ~WritebackFile();  // closes the file if Close was not called

  Status Write(std::span<const uint8_t> bytes);
  Status Write(std::string_view bytes) {
    return Write({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  }
  // Closes the file. Not synced (a pulled body is as durable as any file a program writes; a
  // reference is a copy of what the server holds), and ext4 writes a file renamed over another
  // before it commits the rename.
  Status Close();

 private:
  WritebackFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
  uint64_t written_ = 0;
  uint64_t handed_ = 0;  // bytes handed to writeback
};

// A name beside `path` no other writer uses: where a file is written before it is renamed.
std::string TemporaryNameFor(const std::string& path);

HeldReference HeldReferenceOf(const std::string& dir, std::string_view model);
// Records that `held.path` restores version `version`, of restored SHA-256 `sha`.
Status WriteSidecar(const HeldReference& held, uint64_t version, const std::string& sha);
// Removes the sidecar before `held.path` is replaced, so that a process that dies between the
// two leaves a reference nothing vouches for (the next push or sync pulls) rather than a
// sidecar naming another version's file.
Status ForgetSidecar(const HeldReference& held);

}  // namespace ckpt
