// ShardedUploads: the uploads of sharded versions in progress (CheckpointStore::BeginShard and
// the calls after it). Shards are stored in the spool (backends/upload_spool.h), checked against
// each other as they arrive, and assembled into one push of global tensors when the last one is
// in (shard_assembly.h). Internal to storage/.
//
// With a shared spool (a cluster's pool), any daemon stores shards of any upload; the upload is
// committed by the model's writer only: the daemon that stores the last shard commits it if it
// may write the model, else answers that the upload is complete and where its commit goes.
//
// Owns the spool and the in-memory description of every upload's stored shards (rebuilt from
// the spool at open, and read again from a shared spool before each decision about an upload).
// Thread safety: safe for concurrent use; sessions of different shards run in parallel, and a
// commit runs outside the lock (an upload being committed refuses new shards with Aborted).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/upload_spool.h"
#include "ckpt/storage/checkpoint_store.h"
#include "engine/store_health.h"
#include "uploads/encoded_shard.h"
#include "uploads/shard_assembly.h"

namespace ckpt {

// A committed sharded version, as a shard sent again after its commit is checked against.
struct CommittedShards {
  VersionInfo info;
  uint32_t shard_count = 0;
  std::vector<std::string> shard_sha256;
};

class ShardedUploads {
 public:
  // Begins the push of an assembled version (waiting for the model's turn).
  using BeginPushFn = std::function<Result<std::unique_ptr<PushSession>>(
      const std::string& model, uint64_t version, uint64_t body_size, const PushOptions& options)>;
  // Begins the push of an assembled version fed chunk by chunk (some shards coded by ranks).
  using BeginChunkedFn = std::function<Result<std::unique_ptr<ChunkedPush>>(
      const std::string& model, uint64_t version, uint64_t body_size, const PushOptions& options)>;
  // The plan the store makes now for a shard (described in global terms) of `shard_count`;
  // `arriving`: for a shard arriving (refused while an earlier version's upload is in progress,
  // whose commit would make it stale), else for the commit of its upload.
  using PlanShardFn = std::function<Result<CodingPlan>(const std::string& model, uint64_t version,
                                                       const ShardHeader& shard,
                                                       uint32_t shard_count, bool arriving)>;
  // Whether a version is committed.
  using VersionExistsFn = std::function<Result<bool>(const std::string& model, uint64_t version)>;
  // The committed version's shards, if it is committed.
  using CommittedFn = std::function<Result<std::optional<CommittedShards>>(const std::string& model,
                                                                           uint64_t version)>;
  // Where writes to `model` go: nullopt when this daemon may commit its uploads, else the
  // advertised URL of the daemon that does (StoreBackend::WriteOwner). With `claim`, this daemon
  // first takes the model's write lease if nobody holds it (StoreBackend::ClaimWrites): nullopt
  // then means it holds it, so no other daemon commits the model meanwhile.
  using WriteOwnerFn =
      std::function<Result<std::optional<std::string>>(const std::string& model, bool claim)>;

  // `options` and `health` must outlive the uploads.
  ShardedUploads(const StoreOptions* options, StoreHealth* health, BeginPushFn begin_push,
                 BeginChunkedFn begin_chunked, PlanShardFn plan_shard, CommittedFn committed,
                 WriteOwnerFn write_owner);

  // Opens `spool` and loads its uploads; removes those whose version is committed (a crash
  // between the commit and the removal).
  Status Open(std::unique_ptr<UploadSpool> spool, const VersionExistsFn& version_exists);

  // A session for one shard: a safetensors body, or an encoded shard when
  // options.body_format is kEncoded. `committed`: the version exists as a sharded version (the
  // shard is then only compared with the one it was committed with).
  Result<std::unique_ptr<ShardSession>> Begin(const std::string& model, uint64_t version,
                                              uint32_t shard, uint32_t shard_count,
                                              std::optional<uint64_t> body_size,
                                              PushOptions options,
                                              std::optional<CommittedShards> committed);
  Result<ShardUploadInfo> Get(const std::string& model, uint64_t version);
  std::vector<ShardUploadInfo> List();
  Result<ShardResult> Commit(const std::string& model, uint64_t version,
                             const PushOptions& options);
  Status Abort(const std::string& model, uint64_t version);
  // Removes uploads created before now_ms - upload_expiry that are not being committed.
  Result<std::vector<ShardUploadInfo>> Expire(int64_t now_ms);
  // The oldest upload of `model` in progress above `latest` (nullopt: the model has no versions)
  // and below `version`, if any: its commit will change the base a shard of `version` is coded
  // against (uploads at or below the latest version can never commit).
  std::optional<uint64_t> UploadBetween(const std::string& model, std::optional<uint64_t> latest,
                                        uint64_t version);
  // Removes every upload of `model` (it is being deleted).
  Status RemoveModel(const std::string& model);
  // Calls `on_end` once the commit of an upload of `model` in progress ends (either way), on the
  // committing thread, holding no lock of this class; returns false without keeping it if none
  // is being committed. `on_end` must be quick: it only tells the waiter to try again.
  bool CallAfterCommit(const std::string& model, std::function<void()> on_end);

 private:
  class Session;
  using Key = std::pair<std::string, uint64_t>;
  struct StoredShard {
    SpooledShard spooled;
    ShardHeader header;
    std::optional<EncodedShardIndex> encoded;  // an encoded shard's
    // Whether header and encoded are read: a shard another daemon stored is listed by the
    // spool and read only by the commit.
    bool described = true;
  };
  struct Upload {
    UploadRecord record;
    std::map<uint32_t, StoredShard> shards;  // stored, by index
    bool committing = false;
    int sessions = 0;            // shards being received: the upload does not expire meanwhile
    int64_t last_active_ms = 0;  // its creation, or the last shard begun or stored
    uint64_t reload_ticket = 0;  // of the Reload whose listing `shards` reflects
  };

  // The upload's description; REQUIRES: mu_ held.
  ShardUploadInfo InfoOf(const Upload& upload) const;
  // A stored shard's description, read from the spool; nullopt (and the shard removed) when an
  // encoded shard no longer reads.
  Result<std::optional<StoredShard>> LoadStoredShard(const UploadRecord& record,
                                                     SpooledShard spooled);
  // With a shared spool: reads the upload's state from the spool into uploads_ (shards other
  // daemons stored, or removed; the upload itself when another daemon created or removed it).
  // An upload this daemon is committing is left as it is. No-op with a local spool.
  Status Reload(const std::string& model, uint64_t version);
  // Reload of every upload in the spool (listings, expiry); one that cannot be read now is left
  // as this daemon last saw it.
  Status ReloadAll();
  // The stored shards of a shared upload marked as being committed, as the spool lists them,
  // each described (read from the spool unless this daemon knows that attempt).
  Result<std::map<uint32_t, StoredShard>> ShardsToCommit(const UploadRecord& record);
  // Stores a received shard's description after its file is in place. REQUIRES: mu_ held.
  Status CheckAgainstUpload(const Upload& upload, const ShardHeader& header) const;
  // Called by a session as it ends (stored or not).
  void SessionEnded(const std::string& model, uint64_t version);
  // Called by a session once its shard `shard` is stored: commits when it was the last.
  Result<ShardResult> ShardStored(const std::string& model, uint64_t version, uint32_t shard,
                                  const PushOptions& options);
  // Commit; by a shard just stored (`stored_shard`), an upload still incomplete or being
  // committed by another shard is reported as it is instead of refused. A commit that drops
  // other shards than `stored_shard` (coded by a stale plan or against a drifted reference) is
  // refused as ShardsDropped; one that drops `stored_shard` itself sets *own_shard_dropped (which
  // may be null without a `stored_shard`).
  Result<ShardResult> CommitUpload(const std::string& model, uint64_t version,
                                   const PushOptions& options, std::optional<uint32_t> stored_shard,
                                   bool* own_shard_dropped);

  const StoreOptions* const options_;
  StoreHealth* const health_;
  // The longest chunk record an encoded shard may carry.
  uint64_t MaxRecordBytes() const;
  // Commits a complete upload some of whose shards are encoded.
  // Encoded shards whose plan is no longer the store's are put in `stale` (and refused).
  Result<VersionInfo> CommitChunked(const std::string& model, uint64_t version,
                                    const PushOptions& options,
                                    const std::vector<const StoredShard*>& shards,
                                    const AssemblyPlan& plan, std::vector<uint32_t>* stale);

  const BeginPushFn begin_push_;
  const BeginChunkedFn begin_chunked_;
  const PlanShardFn plan_shard_;
  const CommittedFn committed_;
  const WriteOwnerFn write_owner_;
  std::unique_ptr<UploadSpool> spool_;
  std::mutex mu_;
  std::condition_variable commit_ended_;  // notified when a commit ends, either way
  std::map<Key, Upload> uploads_;         // guarded by mu_
  // Reloads begun and local changes of shared uploads, in order; guarded by mu_. A Reload whose
  // listing is older than a change leaves it (and an upload erased after the listing began is
  // not brought back).
  uint64_t reload_tickets_ = 0;
  uint64_t erased_ticket_ = 0;  // the ticket of the last upload erased
  // CallAfterCommit's callbacks, by model; guarded by mu_.
  std::map<std::string, std::vector<std::function<void()>>> after_commit_;
};

}  // namespace ckpt
