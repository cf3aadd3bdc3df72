// Expiry of abandoned sharded uploads (upload_expirer.h).
#include "upload_expirer.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace ckpt::daemon {
namespace {

std::chrono::milliseconds CheckInterval(std::chrono::seconds expiry) {
  const auto tenth = std::chrono::duration_cast<std::chrono::milliseconds>(expiry) / 10;
  return std::clamp<std::chrono::milliseconds>(tenth, std::chrono::seconds(1),
                                               std::chrono::seconds(60));
}

}  // namespace

UploadExpirer::UploadExpirer(CheckpointStore* store, std::chrono::seconds expiry)
    : store_(store), thread_(CheckInterval(expiry), [this] { Expire(); }) {}

void UploadExpirer::Expire() {
  auto expired = store_->ExpireUploads();
  if (!expired.ok()) {
    spdlog::warn("uploads: expiry failed: {}", expired.status().ToLogString());
    return;
  }
  for (const ShardUploadInfo& u : *expired) {
    spdlog::warn(
        "uploads: removed the uncommitted upload of model '{}' version {} ({} of {} "
        "shards, {} bytes)",
        u.model, u.version, u.received.size(), u.shard_count, u.received_bytes);
  }
}

}  // namespace ckpt::daemon
