// HealthWatcher: asks the store for its write health every second, so that writes resume by
// themselves after a storage error once its cause is gone (CheckpointStore::Health resumes the
// engine), and logs each change of the write state with its reason.
//
// Owns its thread, started by the constructor and joined by the destructor. `store` must
// outlive it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::daemon {

class HealthWatcher {
 public:
  explicit HealthWatcher(CheckpointStore* store,
                         std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~HealthWatcher();

 private:
  void Run();

  CheckpointStore* const store_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon
