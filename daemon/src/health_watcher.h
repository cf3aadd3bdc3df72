// HealthWatcher: asks the store for its write health every second, so that writes resume by
// themselves after a storage error once its cause is gone (CheckpointStore::Health resumes the
// engine), and logs each change of the write state with its reason.
//
// Owns its thread (a PeriodicThread), started by the constructor and joined by the destructor.
// `store` must outlive it.
#pragma once

#include <chrono>
#include <memory>

#include "ckpt/storage/checkpoint_store.h"
#include "periodic_thread.h"

namespace ckpt::daemon {

class HealthWatcher {
 public:
  explicit HealthWatcher(CheckpointStore* store,
                         std::chrono::milliseconds interval = std::chrono::seconds(1));

 private:
  void Check();

  CheckpointStore* const store_;
  StoreHealthReport::State logged_ = StoreHealthReport::State::kWritable;  // its thread only
  PeriodicThread thread_;  // last: stopped before the members it uses go
};

}  // namespace ckpt::daemon
