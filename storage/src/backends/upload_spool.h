// UploadSpool: where the shards of sharded uploads are kept until their version commits
// (docs/design.md, "Sharded versions"). The store's backend decides where: files beside the
// local database (NewLocalUploadSpool), or objects in the cluster's pool, where every daemon
// of the cluster stores and reads the shards of any upload (the RADOS backend's spool). Internal
// to storage/.
//
// A stored shard is published whole or not at all: a crash or a refused publication leaves the
// upload as it was (an attempt's remains are removed with the upload, or at open for local
// spools).
//
// Thread safety: implementations are safe for concurrent use on different shards; the caller
// (ShardedUploads) serializes, within one daemon, the creation and removal of one upload against
// its other uses. A shared spool also serializes, across daemons, the publication of a shard
// against a commit in progress (BeginCommit).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

// What an upload is, fixed when its first shard begins.
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
  int64_t stored_at_ms = 0;
  // Which attempt of the shard this is, in spools where one shard's attempts coexist (shared
  // spools: a shard sent again names a new attempt); empty where the stored shard is replaced
  // in place.
  std::string attempt;

  bool SameAttempt(const SpooledShard& other) const {
    return shard == other.shard && body_bytes == other.body_bytes &&
           sha256_hex == other.sha256_hex && attempt == other.attempt;
  }
};

// Reads a stored shard's body at any offset. Thread-compatible.
class SpooledShardFile {
 public:
  virtual ~SpooledShardFile() = default;
  virtual uint64_t body_bytes() const = 0;
  // Reads exactly out.size() bytes of the body at `offset`.
  virtual Status ReadAt(uint64_t offset, std::span<uint8_t> out) const = 0;
};

// Receives one shard; Seal and Publish make it the stored shard. Destroying a writer that did
// not publish removes what it wrote. Thread-compatible.
class SpooledShardWriter {
 public:
  virtual ~SpooledShardWriter() = default;
  virtual Status Append(std::span<const uint8_t> bytes) = 0;
  // Makes the body durable; `sha256_hex` is the digest the shard is listed with.
  virtual Status Seal(const std::string& sha256_hex) = 0;
  // After Seal: makes it the upload's stored shard, replacing an earlier attempt. Aborted while
  // the upload is being committed (shared spools); NotFound when the upload was removed.
  virtual Status Publish() = 0;
  // The attempt this writer stores (SpooledShard::attempt).
  virtual std::string attempt() const { return ""; }
};

class UploadSpool {
 public:
  virtual ~UploadSpool() = default;

  // Whether other daemons store shards of the same uploads: the caller then reads an upload's
  // state from the spool before deciding anything about it (committing, answering its state).
  virtual bool shared() const = 0;

  // Prepares the spool; a local spool removes the partial files a crash left behind.
  virtual Status Open() = 0;
  // Every upload with its record (an upload without a readable record is removed: its first
  // shard never finished creating it).
  virtual Result<std::vector<UploadRecord>> List() = 0;
  // The upload's record, if it exists.
  virtual Result<std::optional<UploadRecord>> Find(const std::string& model, uint64_t version) = 0;
  // Creates the upload with `record` if it does not exist; returns the stored record.
  virtual Result<UploadRecord> Create(const UploadRecord& record) = 0;
  // The stored shards of an upload, by index.
  virtual Result<std::vector<SpooledShard>> Shards(const std::string& model, uint64_t version) = 0;
  virtual Result<std::unique_ptr<SpooledShardWriter>> NewShardWriter(const std::string& model,
                                                                     uint64_t version,
                                                                     uint32_t shard) = 0;
  // The stored shard `stored` (as Shards listed it); NotFound if that attempt is gone.
  virtual Result<std::unique_ptr<SpooledShardFile>> OpenShard(const std::string& model,
                                                              uint64_t version,
                                                              const SpooledShard& stored) = 0;
  // Removes an upload and its shards (nothing if absent).
  virtual Status Remove(const std::string& model, uint64_t version) = 0;
  // Removes one stored shard of an upload (nothing if absent).
  virtual Status RemoveShard(const std::string& model, uint64_t version, uint32_t shard) = 0;

  // Marks the upload as being committed by this daemon: until EndCommit, shards published by
  // any daemon are refused, so the shards the commit reads stay the upload's. Takes the mark over
  // from a commit that never ended (its daemon died). Returns the commit's token. Where one
  // daemon owns the spool (its caller refuses shards itself) nothing is marked.
  virtual Result<std::string> BeginCommit(const std::string& /*model*/, uint64_t /*version*/) {
    return std::string();
  }
  // Clears the mark if it is still `token`'s (another commit may have taken it over); an empty
  // token clears whatever mark there is. Best effort.
  virtual void EndCommit(const std::string& /*model*/, uint64_t /*version*/,
                         const std::string& /*token*/) {}
};

// "version V of model 'M'", as messages about an upload name it.
inline std::string UploadName(const std::string& model, uint64_t version) {
  return "version " + std::to_string(version) + " of model '" + model + "'";
}

// The local spool: files under `root` (<data_dir>/uploads), owned by one daemon.
//   <model>/<version>/upload.json   the upload's record (format 1)
//   <model>/<version>/shard-<i>     a stored shard: its body, then a trailer
//                                   (magic "CKSHARD1", u64 LE body size, SHA-256 hex)
//   <model>/<version>/.partial-*    a shard being received (removed at open)
// Every file is written under a temporary name, synced and renamed into place. Model names
// cannot hold '/' or start with '.', so they are safe as directory names.
std::unique_ptr<UploadSpool> NewLocalUploadSpool(std::string root);

}  // namespace ckpt
