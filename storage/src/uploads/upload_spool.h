// UploadSpool: the shards of sharded uploads, kept as files beside the database until their
// version commits (docs/design.md, "Sharded versions"). Internal to storage/.
//
// Layout under the spool's root (<data_dir>/uploads):
//   <model>/<version>/upload.json   the upload: shard count, creation time (format 1)
//   <model>/<version>/shard-<i>     a stored shard: its safetensors body, then a trailer
//                                   (magic "CKSHARD1", u64 LE body size, SHA-256 hex)
//   <model>/<version>/.partial-*    a shard being received (removed at open)
// Every file is written under a temporary name, synced and renamed into place, so a crash
// leaves either the earlier attempt or the new one, never part of one. Model names cannot hold
// '/' or start with '.', so they are safe as directory names.
//
// Thread safety: safe for concurrent use on different shards; the caller (ShardedUploads)
// serializes the creation and removal of one upload against its other uses.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

// upload.json: what an upload is, fixed when its first shard begins.
struct UploadRecord {
  static constexpr int kFormatVersion = 1;
  std::string model;
  uint64_t version = 0;
  uint32_t shard_count = 0;
  int64_t created_at_ms = 0;
};

// A stored shard, as the spool lists it.
struct SpooledShard {
  uint32_t shard = 0;
  uint64_t body_bytes = 0;
  std::string sha256_hex;
  int64_t stored_at_ms = 0;  // the file's modification time
};

// Reads a stored shard's body at any offset. Thread-compatible.
class SpooledShardFile {
 public:
  explicit SpooledShardFile(int fd, uint64_t body_bytes) : fd_(fd), body_bytes_(body_bytes) {}
  ~SpooledShardFile();
  SpooledShardFile(const SpooledShardFile&) = delete;
  SpooledShardFile& operator=(const SpooledShardFile&) = delete;
  uint64_t body_bytes() const { return body_bytes_; }
  // Reads exactly out.size() bytes of the body at `offset`.
  Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;

 private:
  int fd_;
  uint64_t body_bytes_;
};

// Receives one shard into a temporary file; Seal and Publish make it the stored shard. Destroying
// an uncommitted writer removes the temporary file. Thread-compatible.
class SpooledShardWriter {
 public:
  SpooledShardWriter(int fd, std::string dir, std::string partial_name, std::string final_name,
                     std::string what);
  ~SpooledShardWriter();
  SpooledShardWriter(const SpooledShardWriter&) = delete;
  SpooledShardWriter& operator=(const SpooledShardWriter&) = delete;
  Status Append(std::span<const uint8_t> bytes);
  // Writes the trailer and syncs the file.
  Status Seal(const std::string& sha256_hex);
  // After Seal: renames the file over an earlier attempt and syncs the directory.
  Status Publish();

 private:
  Status Flush();
  int fd_;
  const std::string dir_, partial_name_, final_name_, what_;
  std::vector<uint8_t> buffer_;
  uint64_t body_bytes_ = 0;
  bool committed_ = false;
};

class UploadSpool {
 public:
  explicit UploadSpool(std::string root) : root_(std::move(root)) {}

  // Creates the root if needed and removes the partial files a crash left behind.
  Status Open();
  // Every upload with its record (a directory without a readable record is removed: its
  // first shard never finished creating it).
  Result<std::vector<UploadRecord>> List();
  // Creates the upload's directory and record if it has none; returns the stored record.
  Result<UploadRecord> Create(const UploadRecord& record);
  // The stored shards of an upload, by index.
  Result<std::vector<SpooledShard>> Shards(const std::string& model, uint64_t version);
  Result<std::unique_ptr<SpooledShardWriter>> NewShardWriter(const std::string& model,
                                                             uint64_t version, uint32_t shard);
  Result<std::unique_ptr<SpooledShardFile>> OpenShard(const std::string& model, uint64_t version,
                                                      uint32_t shard);
  // Removes an upload and its files (nothing if absent).
  Status Remove(const std::string& model, uint64_t version);
  // Removes one stored shard of an upload (nothing if absent).
  Status RemoveShard(const std::string& model, uint64_t version, uint32_t shard);

 private:
  std::string UploadDir(const std::string& model, uint64_t version) const;
  const std::string root_;
};

}  // namespace ckpt
