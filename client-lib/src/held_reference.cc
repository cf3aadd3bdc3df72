// The references a client keeps (held_reference.h).
#include "held_reference.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace ckpt {

using nlohmann::json;

Result<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IoError("cannot stat '" + path + "'");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (data == MAP_FAILED) return Status::IoError("cannot map '" + path + "'");
  return MappedFile(static_cast<const uint8_t*>(data), size);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {
constexpr uint64_t kWritebackBytes = 1 << 20;
}  // namespace

Result<WritebackFile> WritebackFile::Create(const std::string& path) {
  // 0666 less the umask, as any file a program creates (std::ofstream's mode).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return Status::IoError("cannot write '" + path + "': " + std::strerror(errno));
  return WritebackFile(path, fd);
}

WritebackFile::~WritebackFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status WritebackFile::Write(std::span<const uint8_t> bytes) {
  if (fd_ < 0) return Status::Internal("'" + path_ + "' is closed");
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError("writing '" + path_ + "' failed: " + std::strerror(errno));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
    written_ += static_cast<uint64_t>(n);
  }
  if (written_ - handed_ >= kWritebackBytes) {
    // Starts the writeback without waiting for it; its errors are not this write's (a file
    // system without it loses nothing).
    ::sync_file_range(fd_, static_cast<off_t>(handed_), static_cast<off_t>(written_ - handed_),
                      SYNC_FILE_RANGE_WRITE);
    handed_ = written_;
  }
  return Status::Ok();
}

Status WritebackFile::Close() {
  if (fd_ < 0) return Status::Ok();
  const int result = ::close(std::exchange(fd_, -1));
  if (result != 0) {
    return Status::IoError("writing '" + path_ + "' failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

Result<ScratchDir> ScratchDir::Make() {
  std::string dir = (std::filesystem::temp_directory_path() / "ckpt-reference-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    return Status::IoError(std::string("cannot create a temporary directory: ") +
                           std::strerror(errno));
  }
  return ScratchDir(std::move(dir));
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

Result<int> ReferenceLock::Claim(const std::string& dir, std::string_view model, bool wait) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create '" + dir + "': " + ec.message());
  const HeldReference held = HeldReferenceOf(dir, model);
  const int fd = ::open(held.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::IoError("cannot open '" + held.lock + "': " + std::strerror(errno));
  }
  while (::flock(fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    ::close(fd);
    if (!wait && error == EWOULDBLOCK) return -1;
    return Status::IoError("cannot lock '" + held.lock + "': " + std::strerror(error));
  }
  return fd;
}

Result<ReferenceLock> ReferenceLock::Acquire(const std::string& dir, std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(const int fd, Claim(dir, model, /*wait=*/true));
  return ReferenceLock(fd);
}

Result<std::optional<ReferenceLock>> ReferenceLock::TryAcquire(const std::string& dir,
                                                               std::string_view model) {
  CKPT_ASSIGN_OR_RETURN(const int fd, Claim(dir, model, /*wait=*/false));
  if (fd < 0) return std::optional<ReferenceLock>();
  return std::optional<ReferenceLock>(ReferenceLock(fd));
}

ReferenceLock::~ReferenceLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string TemporaryNameFor(const std::string& path) {
  std::random_device rd;
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
}

HeldReference HeldReferenceOf(const std::string& dir, std::string_view model) {
  HeldReference held;
  held.path = (std::filesystem::path(dir) / (std::string(model) + ".safetensors")).string();
  held.sidecar = (std::filesystem::path(dir) / (std::string(model) + ".json")).string();
  held.lock = (std::filesystem::path(dir) / (std::string(model) + ".lock")).string();
  std::ifstream in(held.sidecar);
  const json doc = json::parse(in, nullptr, false);
  if (!doc.is_discarded() && doc.is_object() && std::filesystem::exists(held.path)) {
    held.version = doc.value("version", uint64_t{0});
    held.restored_sha256 = doc.value("restored_sha256", "");
  }
  return held;
}

// Records that `held.path` restores version `version`, whose restored body's SHA-256 is `sha`.
Status WriteSidecar(const HeldReference& held, uint64_t version, const std::string& sha) {
  const std::string tmp = TemporaryNameFor(held.sidecar);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json{{"version", version}, {"restored_sha256", sha}}.dump() << "\n";
    if (!out) return Status::IoError("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, held.sidecar, ec);
  if (ec) return Status::IoError("cannot rename '" + tmp + "': " + ec.message());
  return Status::Ok();
}

Status ForgetSidecar(const HeldReference& held) {
  std::error_code ec;
  std::filesystem::remove(held.sidecar, ec);
  if (ec) return Status::IoError("cannot remove '" + held.sidecar + "': " + ec.message());
  return Status::Ok();
}

}  // namespace ckpt
