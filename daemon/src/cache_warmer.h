// CacheWarmer: after a restart, restores the latest version of each model once so that its
// reconstruction is back in the store's reference cache. Two things gain: the first `latest`
// a restarted training job asks for is then served from memory instead of being decoded, and
// the next push of each model finds its reference there instead of decoding it from storage.
//
// Owns its worker thread, which calls `on_done` when the warm-up has finished (not when it was
// stopped). Start() is called once; Stop() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::daemon {

struct WarmupResult {
  uint64_t models = 0;   // models whose latest version was restored
  uint64_t bytes = 0;    // body bytes restored
  uint64_t skipped = 0;  // models left cold: too large for the cache, over budget, or failed
};

class CacheWarmer {
 public:
  // `store` must outlive the warmer. Restores latest versions, smallest first, while their total
  // stays within `budget_bytes` (the cache's size); a model larger than half of it is skipped,
  // as the cache would not keep it.
  CacheWarmer(CheckpointStore* store, uint64_t budget_bytes,
              std::function<void(const WarmupResult&)> on_done);
  ~CacheWarmer();  // Stop() and join.

  void Start();
  // Asks the warm-up to stop at the next chunk; returns at once.
  void Stop() { stop_.store(true); }

 private:
  void Run();

  CheckpointStore* const store_;
  const uint64_t budget_bytes_;
  const std::function<void(const WarmupResult&)> on_done_;
  std::atomic<bool> stop_{false};
  WarmupResult result_;  // written by the worker thread only
  std::thread thread_;
};

}  // namespace ckpt::daemon
