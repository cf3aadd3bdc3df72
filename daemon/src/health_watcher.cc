// The daemon's watch over the store's write health (health_watcher.h).
#include "health_watcher.h"

#include <spdlog/spdlog.h>

namespace ckpt::daemon {

HealthWatcher::HealthWatcher(CheckpointStore* store, std::chrono::milliseconds interval)
    : store_(store), thread_(interval, [this] { Check(); }) {}

void HealthWatcher::Check() {
  const StoreHealthReport health = store_->Health();
  if (health.state == logged_) return;
  if (health.state == StoreHealthReport::State::kWritable) {
    spdlog::info("storage: writes accepted again ({} free, {} recoveries since start)",
                 health.free_bytes, health.recoveries);
  } else if (health.state == StoreHealthReport::State::kReadOnly) {
    spdlog::error("storage: read-only: {}", health.reason);
  } else {
    spdlog::warn("storage: writes refused ({}): {}", StoreHealthStateName(health.state),
                 health.reason);
  }
  logged_ = health.state;
}

}  // namespace ckpt::daemon
