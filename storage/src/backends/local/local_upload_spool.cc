// The local upload spool: files beside the database (upload_spool.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "backends/upload_spool.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kTrailerMagic[8] = {'C', 'K', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr size_t kTrailerBytes = 8 + 8 + 64;
constexpr size_t kWriteBufferBytes = 1 << 20;
constexpr char kPartialPrefix[] = ".partial-";
constexpr char kRecordName[] = "upload.json";

// A failed system call as a Status: what failed in the client's words, the path for the log.
Status FileError(int error, const std::string& what, const std::string& path) {
  if (error == ENOSPC || error == EDQUOT) {
    return Status::NoSpace(what + ": the data volume is full").WithDetail(path);
  }
  return Status::IoError(what + ": " + std::strerror(error)).WithDetail(path);
}

Status SyncDirectory(const std::string& dir, const std::string& what) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, what, dir);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : FileError(error, what, dir);
}

Status WriteAll(int fd, const uint8_t* data, size_t size, const std::string& what,
                const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, what, path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

void StoreLe64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string ShardName(uint32_t shard) { return "shard-" + std::to_string(shard); }

// A unique suffix for temporary names within this process (the spool has one owner).
std::string NextNonce() {
  static std::atomic<uint64_t> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

Result<SpooledShard> ReadTrailer(const std::string& path, uint32_t shard) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "reading shard " + std::to_string(shard), path);
  struct stat st {};
  uint8_t trailer[kTrailerBytes];
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = FileError(errno, "reading shard " + std::to_string(shard), path);
  } else if (static_cast<uint64_t>(st.st_size) < kTrailerBytes ||
             ::pread(fd, trailer, kTrailerBytes, st.st_size - kTrailerBytes) !=
                 static_cast<ssize_t>(kTrailerBytes) ||
             std::memcmp(trailer, kTrailerMagic, 8) != 0 ||
             LoadLe64(trailer + 8) != static_cast<uint64_t>(st.st_size) - kTrailerBytes) {
    status =
        Status::DataLoss("stored shard " + std::to_string(shard) + " is damaged").WithDetail(path);
  }
  ::close(fd);
  CKPT_RETURN_IF_ERROR(status);
  const int64_t stored_at_ms =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  return SpooledShard{shard, LoadLe64(trailer + 8),
                      std::string(reinterpret_cast<const char*>(trailer + 16), 64), stored_at_ms,
                      std::string()};
}

// Reads a stored shard's file. Thread-compatible.
class LocalShardFile final : public SpooledShardFile {
 public:
  LocalShardFile(int fd, uint64_t body_bytes) : fd_(fd), body_bytes_(body_bytes) {}
  ~LocalShardFile() override { ::close(fd_); }
  LocalShardFile(const LocalShardFile&) = delete;
  LocalShardFile& operator=(const LocalShardFile&) = delete;
  uint64_t body_bytes() const override { return body_bytes_; }
  Status ReadAt(uint64_t offset, std::span<uint8_t> out) const override;

 private:
  const int fd_;
  const uint64_t body_bytes_;
};

// Receives a shard into a temporary file that Publish renames into place. Thread-compatible.
class LocalShardWriter final : public SpooledShardWriter {
 public:
  LocalShardWriter(int fd, std::string dir, std::string partial_name, std::string final_name,
                   std::string what);
  ~LocalShardWriter() override;
  LocalShardWriter(const LocalShardWriter&) = delete;
  LocalShardWriter& operator=(const LocalShardWriter&) = delete;
  Status Append(std::span<const uint8_t> bytes) override;
  // Writes the trailer and syncs the file.
  Status Seal(const std::string& sha256_hex) override;
  // Renames the file over an earlier attempt and syncs the directory.
  Status Publish() override;

 private:
  Status Flush();
  const int fd_;
  const std::string dir_, partial_name_, final_name_, what_;
  std::vector<uint8_t> buffer_;
  uint64_t body_bytes_ = 0;
  bool committed_ = false;
};

class LocalUploadSpool final : public UploadSpool {
 public:
  explicit LocalUploadSpool(std::string root) : root_(std::move(root)) {}
  bool shared() const override { return false; }
  Status Open() override;
  Result<std::vector<UploadRecord>> List() override;
  Result<std::optional<UploadRecord>> Find(const std::string& model, uint64_t version) override;
  Result<UploadRecord> Create(const UploadRecord& record) override;
  Result<std::vector<SpooledShard>> Shards(const std::string& model, uint64_t version) override;
  Result<std::unique_ptr<SpooledShardWriter>> NewShardWriter(const std::string& model,
                                                             uint64_t version,
                                                             uint32_t shard) override;
  Result<std::unique_ptr<SpooledShardFile>> OpenShard(const std::string& model, uint64_t version,
                                                      const SpooledShard& stored) override;
  Status Remove(const std::string& model, uint64_t version) override;
  Status RemoveShard(const std::string& model, uint64_t version, uint32_t shard) override;

 private:
  std::string UploadDir(const std::string& model, uint64_t version) const;
  const std::string root_;
};

// The record in `dir`, or nullopt if it has none that reads.
std::optional<UploadRecord> ReadRecord(const fs::path& dir) {
  std::string text;
  if (FILE* f = std::fopen((dir / kRecordName).c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || doc.value("format", 0) != UploadRecord::kFormatVersion) {
    return std::nullopt;
  }
  UploadRecord r;
  r.model = doc.value("model", "");
  r.version = doc.value("version", uint64_t{0});
  r.shard_count = doc.value("shard_count", 0u);
  r.created_at_ms = doc.value("created_at_ms", int64_t{0});
  return r;
}

Status LocalShardFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  if (offset + out.size() > body_bytes_) return Status::Internal("shard read past its body");
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return n == 0 ? Status::DataLoss("stored shard ends early")
                    : FileError(errno, "reading a stored shard", "");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

LocalShardWriter::LocalShardWriter(int fd, std::string dir, std::string partial_name,
                                   std::string final_name, std::string what)
    : fd_(fd),
      dir_(std::move(dir)),
      partial_name_(std::move(partial_name)),
      final_name_(std::move(final_name)),
      what_(std::move(what)) {
  buffer_.reserve(kWriteBufferBytes);
}

LocalShardWriter::~LocalShardWriter() {
  ::close(fd_);
  if (!committed_) ::unlink((dir_ + "/" + partial_name_).c_str());
}

Status LocalShardWriter::Flush() {
  Status s = WriteAll(fd_, buffer_.data(), buffer_.size(), what_, dir_ + "/" + partial_name_);
  buffer_.clear();
  return s;
}

Status LocalShardWriter::Append(std::span<const uint8_t> bytes) {
  body_bytes_ += bytes.size();
  if (buffer_.size() + bytes.size() > kWriteBufferBytes) CKPT_RETURN_IF_ERROR(Flush());
  if (bytes.size() >= kWriteBufferBytes) {
    return WriteAll(fd_, bytes.data(), bytes.size(), what_, dir_ + "/" + partial_name_);
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  return Status::Ok();
}

Status LocalShardWriter::Seal(const std::string& sha256_hex) {
  uint8_t trailer[kTrailerBytes];
  std::memcpy(trailer, kTrailerMagic, 8);
  StoreLe64(body_bytes_, trailer + 8);
  std::memcpy(trailer + 16, sha256_hex.data(), std::min<size_t>(64, sha256_hex.size()));
  CKPT_RETURN_IF_ERROR(Append(std::span<const uint8_t>(trailer, kTrailerBytes)));
  CKPT_RETURN_IF_ERROR(Flush());
  const std::string partial = dir_ + "/" + partial_name_;
  if (::fsync(fd_) != 0) return FileError(errno, what_, partial);
  return Status::Ok();
}

Status LocalShardWriter::Publish() {
  const std::string partial = dir_ + "/" + partial_name_;
  if (::rename(partial.c_str(), (dir_ + "/" + final_name_).c_str()) != 0) {
    return FileError(errno, what_, partial);
  }
  committed_ = true;
  return SyncDirectory(dir_, what_);
}

std::string LocalUploadSpool::UploadDir(const std::string& model, uint64_t version) const {
  return root_ + "/" + model + "/" + std::to_string(version);
}

Status LocalUploadSpool::Open() {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return FileError(ec.value(), "creating the upload spool", root_);
  for (const auto& model : fs::directory_iterator(root_, ec)) {
    for (const auto& upload : fs::directory_iterator(model.path(), ec)) {
      for (const auto& file : fs::directory_iterator(upload.path(), ec)) {
        const std::string name = file.path().filename().string();
        if (name.starts_with(kPartialPrefix) || name.ends_with(".tmp")) {
          fs::remove(file.path(), ec);
        }
      }
    }
  }
  if (ec) return FileError(ec.value(), "scanning the upload spool", root_);
  return Status::Ok();
}

Result<std::vector<UploadRecord>> LocalUploadSpool::List() {
  std::vector<UploadRecord> uploads;
  std::error_code ec;
  for (const auto& model : fs::directory_iterator(root_, ec)) {
    for (const auto& upload : fs::directory_iterator(model.path(), ec)) {
      std::optional<UploadRecord> record = ReadRecord(upload.path());
      if (!record) {
        fs::remove_all(upload.path(), ec);
        continue;
      }
      uploads.push_back(std::move(*record));
    }
  }
  if (ec) return FileError(ec.value(), "listing the upload spool", root_);
  return uploads;
}

Result<std::optional<UploadRecord>> LocalUploadSpool::Find(const std::string& model,
                                                           uint64_t version) {
  return ReadRecord(UploadDir(model, version));
}

Result<UploadRecord> LocalUploadSpool::Create(const UploadRecord& record) {
  const std::string dir = UploadDir(record.model, record.version);
  const std::string what = "creating the upload of model '" + record.model + "' version " +
                           std::to_string(record.version);
  if (std::optional<UploadRecord> stored = ReadRecord(dir)) return *stored;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FileError(ec.value(), what, dir);
  const json doc = {{"format", UploadRecord::kFormatVersion},
                    {"model", record.model},
                    {"version", record.version},
                    {"shard_count", record.shard_count},
                    {"created_at_ms", record.created_at_ms}};
  const std::string text = doc.dump();
  const std::string tmp = dir + "/" + kRecordName + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, what, tmp);
  Status s = WriteAll(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), what, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = FileError(errno, what, tmp);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), (dir + "/" + kRecordName).c_str()) != 0) {
    s = FileError(errno, what, tmp);
  }
  if (s.ok()) s = SyncDirectory(dir, what);
  if (s.ok()) s = SyncDirectory(root_ + "/" + record.model, what);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return record;
}

Result<std::vector<SpooledShard>> LocalUploadSpool::Shards(const std::string& model,
                                                           uint64_t version) {
  std::vector<SpooledShard> shards;
  std::error_code ec;
  for (const auto& file : fs::directory_iterator(UploadDir(model, version), ec)) {
    const std::string name = file.path().filename().string();
    if (!name.starts_with("shard-")) continue;
    char* end = nullptr;
    const unsigned long shard = std::strtoul(name.c_str() + 6, &end, 10);
    if (*end != '\0' || shard > UINT32_MAX) continue;
    CKPT_ASSIGN_OR_RETURN(SpooledShard s,
                          ReadTrailer(file.path().string(), static_cast<uint32_t>(shard)));
    shards.push_back(std::move(s));
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return FileError(ec.value(), "listing the shards of an upload", UploadDir(model, version));
  }
  std::sort(shards.begin(), shards.end(),
            [](const SpooledShard& a, const SpooledShard& b) { return a.shard < b.shard; });
  return shards;
}

Result<std::unique_ptr<SpooledShardWriter>> LocalUploadSpool::NewShardWriter(
    const std::string& model, uint64_t version, uint32_t shard) {
  const std::string dir = UploadDir(model, version);
  const std::string partial = std::string(kPartialPrefix) + NextNonce();
  const std::string what = "storing shard " + std::to_string(shard) + " of model '" + model +
                           "' version " + std::to_string(version);
  const int fd =
      ::open((dir + "/" + partial).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, what, dir + "/" + partial);
  return std::unique_ptr<SpooledShardWriter>(
      std::make_unique<LocalShardWriter>(fd, dir, partial, ShardName(shard), what));
}

Result<std::unique_ptr<SpooledShardFile>> LocalUploadSpool::OpenShard(const std::string& model,
                                                                      uint64_t version,
                                                                      const SpooledShard& listed) {
  const uint32_t shard = listed.shard;
  const std::string path = UploadDir(model, version) + "/" + ShardName(shard);
  CKPT_ASSIGN_OR_RETURN(SpooledShard stored, ReadTrailer(path, shard));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "reading shard " + std::to_string(shard), path);
  return std::unique_ptr<SpooledShardFile>(std::make_unique<LocalShardFile>(fd, stored.body_bytes));
}

Status LocalUploadSpool::RemoveShard(const std::string& model, uint64_t version, uint32_t shard) {
  std::error_code ec;
  const std::string path = UploadDir(model, version) + "/" + ShardName(shard);
  fs::remove(path, ec);
  if (ec) return FileError(ec.value(), "removing shard " + std::to_string(shard), path);
  return Status::Ok();
}

Status LocalUploadSpool::Remove(const std::string& model, uint64_t version) {
  std::error_code ec;
  const std::string dir = UploadDir(model, version);
  fs::remove_all(dir, ec);
  if (ec) return FileError(ec.value(), "removing an upload", dir);
  // The model's directory goes with its last upload (not an error if another is in it).
  fs::remove(root_ + "/" + model, ec);
  return Status::Ok();
}

}  // namespace

std::unique_ptr<UploadSpool> NewLocalUploadSpool(std::string root) {
  return std::make_unique<LocalUploadSpool>(std::move(root));
}

}  // namespace ckpt
