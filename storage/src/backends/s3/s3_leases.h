// S3Leases: this daemon's write leases on models kept in an S3 bucket, and what the daemon knows
// of each model's ownership. Internal to storage/.
//
// A model's lease is the object models/<model>/lease (JSON: format, owner id, owner URL,
// released). It is created with If-None-Match: * and renewed, taken over or released with
// If-Match on the ETag last seen, so two daemons never both succeed. A lease is expired when the
// server's own clock says it was last written more than a lease (plus a second of its clock's
// resolution) ago: the answer to a GET carries both times, so no two daemons' clocks are
// compared. The holder counts its lease from before the request that renewed it, so it gives it
// up before anyone else can take it.
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
#include <string>
#include <unordered_map>

#include "backends/chunk_store.h"
#include "backends/s3/s3_client.h"
#include "backends/shared_chunks.h"
#include "ckpt/base/status.h"

namespace ckpt {

using S3Clock = std::chrono::steady_clock;

// The write-ownership state of one model in this daemon.
struct S3ModelState {
  std::mutex mu;  // serializes claims, commits and refreshes of the model
  bool owned = false;
  uint64_t epoch = 0;                     // the model's epoch as of `generation`
  S3Clock::time_point lease_valid_until;  // conservative local view of the lease's expiry
  std::string lease_etag;                 // our lease object's ETag while owned
  std::optional<uint64_t> generation;     // the log's generation the local cache reflects
  uint64_t snapshot_generation = 0;       // the newest snapshot known
  // A commit whose outcome is unknown (the store stopped answering): until a resync tells, the
  // chunks of failed writes are left for garbage collection instead of removed.
  bool outcome_unknown = false;

  // Chunk writes in flight (not under mu: pushes write while others read); more than on RADOS,
  // as each S3 request waits longer.
  ChunkWriteQueue writes{32};

  // REQUIRES: mu.
  bool TrustsCache() const { return owned && generation && S3Clock::now() < lease_valid_until; }
  bool HoldsLease() const { return owned && S3Clock::now() < lease_valid_until; }
};

class S3Leases {
 public:
  // `client` outlives the leases; `advertise_url` is where other daemons redirect writes.
  S3Leases(S3Client* client, std::chrono::milliseconds lease, const std::string& advertise_url);

  S3ModelState& StateOf(const std::string& model);

  // Takes or renews the model's lease. Returns true when this daemon took it (it was free,
  // expired, released, or ours from before a lapse: the caller fences former writers), false
  // when it renewed the lease it held; Unavailable naming the holder while another daemon holds
  // it. REQUIRES: state.mu.
  Result<bool> Lock(const std::string& model, S3ModelState& state);

  // The URL of the daemon holding the model's lease; nullopt when nobody else does.
  Result<std::optional<std::string>> Holder(const std::string& model);

  // Renews every held lease; one that cannot be renewed is given up (claimed again on the next
  // write).
  void RenewAll();
  // Releases every held lease (another daemon may take the models at once) and waits for the
  // chunk writes in flight.
  void ReleaseAll();

  size_t OwnedCount();
  uint64_t leases_lost() const { return leases_lost_.load(std::memory_order_relaxed); }

 private:
  struct Lease {
    std::string owner;
    std::string url;
    bool released = false;
    std::string etag;
    bool expired = false;  // by the server's clock
  };
  Result<std::optional<Lease>> Read(const std::string& model);
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
