// ModelLeases: this daemon's write leases on models — the exclusive lock "owner" of each model
// object, renewed every third of its duration — and what the daemon knows of each model's
// ownership. Internal to storage/.
//
// Thread safety: safe for concurrent use; a ModelState's fields are guarded by its own mutexes.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <rados/librados.hpp>
#include <string>
#include <unordered_map>

#include "backends/chunk_store.h"
#include "backends/shared_chunks.h"
#include "ckpt/base/status.h"

namespace ckpt {

using RadosClock = std::chrono::steady_clock;

// The write-ownership state of one model in this daemon.
struct ModelState {
  std::mutex mu;  // serializes claims, commits and refreshes of the model
  bool owned = false;
  uint64_t epoch = 0;                        // ours while owned
  RadosClock::time_point lease_valid_until;  // conservative local view of the lock's expiry
  std::optional<uint64_t> generation;        // the cluster's generation the local cache reflects
  bool indexed = false;                      // known to be in the index (set while owned)

  ChunkWriteQueue writes;  // chunk writes in flight (not under mu: pushes write while others read)

  // Whether the local cache of the model is current without asking the cluster: this daemon is
  // its only writer (it holds the lease, renewed recently enough). After a pause longer than
  // that, reads check the generation like any other daemon's. REQUIRES: mu.
  bool TrustsCache() const { return owned && generation && RadosClock::now() < lease_valid_until; }
  // Whether this daemon holds the lease now. REQUIRES: mu.
  bool HoldsLease() const { return owned && RadosClock::now() < lease_valid_until; }
};

class ModelLeases {
 public:
  // `io` (the pool) outlives the leases; `advertise_url` is where other daemons redirect writes.
  ModelLeases(librados::IoCtx* io, std::chrono::milliseconds lease,
              const std::string& advertise_url);

  ModelState& StateOf(const std::string& model);

  // Takes (or renews) the model's lock; on success the lease is valid for most of its duration
  // from the request. Returns librados's code: -EBUSY or -EEXIST while another daemon holds it.
  // REQUIRES: state.mu.
  int Lock(const std::string& model, ModelState& state);

  // The advertised URL of the daemon holding the model's lease; nullopt when nobody else does.
  Result<std::optional<std::string>> Holder(const std::string& model);

  // Renews every held lease; a lease that cannot be renewed is given up (claimed again on the
  // next write).
  void RenewAll();

  // Releases every held lease (another daemon can take the models over at once) and waits for
  // the chunk writes in flight.
  void ReleaseAll();

  size_t OwnedCount();
  uint64_t leases_lost() const { return leases_lost_.load(std::memory_order_relaxed); }
  std::chrono::milliseconds duration() const { return lease_; }

 private:
  int LockWithFlags(const std::string& model, ModelState& state, uint8_t flags);

  librados::IoCtx* const io_;
  const std::chrono::milliseconds lease_;
  std::string cookie_;  // "<random id> <advertised URL>": identifies this daemon's leases
  std::atomic<uint64_t> leases_lost_{0};
  std::mutex states_mu_;
  std::unordered_map<std::string, std::unique_ptr<ModelState>> states_;  // guarded by states_mu_
};

}  // namespace ckpt
