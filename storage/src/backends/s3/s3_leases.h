// S3Leases: this daemon's write leases on models kept in an S3 bucket, and what the daemon knows
// of each model's ownership. Internal to storage/.
//
// A model's lease is the object models/<model>/lease (JSON: format, owner id, owner URL,
// released, a nonce). It is created with If-None-Match: * and renewed, taken over or released
// with If-Match on the ETag last seen; every write carries a new nonce, so every write changes the
// ETag and of two writers over one ETag only one succeeds. A lease is expired when the store's
// clock says it was last written more than a lease (plus a second of its clock's resolution)
// ago: the answer to a GET carries both times, so the daemons' clocks are never compared (the
// gateways behind one endpoint must agree). The holder counts its lease from before the request
// that renewed it, so it gives it up before anyone else can take it.
//
// The lease decides which daemon writes; safety does not rest on it: commits are fenced by the
// metadata log (s3_metadata_log.h), where a writer that lost its lease finds its generation taken.
//
// Thread safety: safe for concurrent use; a S3ModelState's fields are guarded by its mutexes.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "backends/chunk_store.h"
#include "backends/s3/s3_client.h"
#include "backends/shared_chunks.h"
#include "ckpt/base/status.h"

namespace ckpt {

using S3Clock = std::chrono::steady_clock;

// What this daemon holds of a model's lease. Guarded by S3ModelState::lease_mu, apart from the
// model's mutex, so that renewals never wait for a commit in progress.
struct S3Lease {
  bool owned = false;
  S3Clock::time_point valid_until;  // conservative local view of the lease's expiry
  std::string etag;                 // our lease object's ETag while owned
};

// The write-ownership state of one model in this daemon.
struct S3ModelState {
  std::mutex mu;                       // serializes claims, commits and refreshes of the model
  uint64_t epoch = 0;                  // the model's epoch as of `generation`
  std::optional<uint64_t> generation;  // the log's generation the local cache reflects
  uint64_t snapshot_generation = 0;    // the newest snapshot known
  // The newest log entry this daemon appended (a commit, a takeover, a settling entry): a
  // writer commits only on top of its own entries.
  std::optional<uint64_t> own_generation;
  // The generation of a commit whose outcome is unknown (the store stopped answering before it
  // said): the next claim settles it (kept from compaction, occupied if still free) before any
  // commit.
  std::optional<uint64_t> unsettled_generation;
  // The seqs of the chunk records such commits refer to: never removed by DiscardChunks (the
  // commit may have landed); garbage collection removes them if it did not.
  std::set<uint64_t> kept_seqs;

  // Chunk writes in flight (not under mu: pushes write while others read); more than on RADOS,
  // as each S3 request waits longer.
  ChunkWriteQueue writes{32};

  mutable std::mutex lease_mu;  // taken after mu, never before
  S3Lease lease;                // guarded by lease_mu

  S3Lease Lease() const {
    std::lock_guard lock(lease_mu);
    return lease;
  }
  void SetOwned(bool owned) {
    std::lock_guard lock(lease_mu);
    lease.owned = owned;
  }
  bool HoldsLease() const {
    std::lock_guard lock(lease_mu);
    return lease.owned && S3Clock::now() < lease.valid_until;
  }
  // Whether the local cache is current without asking the store: this daemon is the model's
  // only writer. REQUIRES: mu.
  bool TrustsCache() const { return generation && HoldsLease(); }
};

class S3Leases {
 public:
  // `client` outlives the leases; `advertise_url` is where other daemons redirect writes.
  S3Leases(S3Client* client, std::chrono::milliseconds lease, const std::string& advertise_url);

  S3ModelState& StateOf(const std::string& model);

  // Takes or renews the model's lease. Returns true when this daemon took it (it was free,
  // expired, released, or ours from before a lapse: the caller fences former writers, then marks
  // it owned), false when it renewed the lease it held; Unavailable naming the holder while
  // another daemon holds it. REQUIRES: state.mu.
  Result<bool> Lock(const std::string& model, S3ModelState& state);

  // The URL of the daemon holding the model's lease; nullopt when nobody else does.
  Result<std::optional<std::string>> Holder(const std::string& model);

  // Renews every held lease, concurrently and without the models' mutexes; one that cannot be
  // renewed is given up (claimed again on the next write).
  void RenewAll();
  // Releases every held lease (another daemon may take the models at once) and waits for the
  // chunk writes in flight.
  void ReleaseAll();

  size_t OwnedCount();
  uint64_t leases_lost() const { return leases_lost_.load(std::memory_order_relaxed); }

 private:
  struct Stored {
    std::string owner;
    std::string url;
    bool released = false;
    std::string etag;
    bool expired = false;  // by the server's clock
  };
  Result<std::optional<Stored>> Read(const std::string& model);
  void Renew(const std::string& model, S3ModelState& state);
  // The lease object's body; a fresh nonce in each, so that every write changes the ETag (an
  // If-Match on an ETag seen before a renewal then fails).
  std::string Body(bool released) const;
  // Writes our lease over `etag` (empty: create); the new ETag, or FailedPrecondition if the
  // object changed.
  Result<std::string> Write(const std::string& model, const std::string& etag, bool released);

  S3Client* const client_;
  const std::chrono::milliseconds lease_;
  const std::string url_;
  std::string id_;  // random: identifies this daemon's leases
  std::atomic<uint64_t> leases_lost_{0};
  std::mutex states_mu_;
  std::unordered_map<std::string, std::unique_ptr<S3ModelState>> states_;  // guarded by states_mu_
};

}  // namespace ckpt
