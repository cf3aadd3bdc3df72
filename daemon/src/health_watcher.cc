// The daemon's watch over the store's write health (health_watcher.h).
#include "health_watcher.h"

#include <spdlog/spdlog.h>

namespace ckpt::daemon {

HealthWatcher::HealthWatcher(CheckpointStore* store, std::chrono::milliseconds interval)
    : store_(store), interval_(interval), thread_([this] { Run(); }) {}

HealthWatcher::~HealthWatcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HealthWatcher::Run() {
  StoreHealthReport::State logged = StoreHealthReport::State::kWritable;
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    const StoreHealthReport health = store_->Health();
    if (health.state != logged) {
      if (health.state == StoreHealthReport::State::kWritable) {
        spdlog::info("storage: writes accepted again ({} free, {} recoveries since start)",
                     health.free_bytes, health.recoveries);
      } else if (health.state == StoreHealthReport::State::kReadOnly) {
        spdlog::error("storage: read-only: {}", health.reason);
      } else {
        spdlog::warn("storage: writes refused ({}): {}", StoreHealthStateName(health.state),
                     health.reason);
      }
      logged = health.state;
    }
    lock.lock();
    wake_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

}  // namespace ckpt::daemon
