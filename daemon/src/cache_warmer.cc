#include "cache_warmer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::daemon {

CacheWarmer::CacheWarmer(CheckpointStore* store, uint64_t budget_bytes,
                         std::function<void(const WarmupResult&)> on_done)
    : store_(store), budget_bytes_(budget_bytes), on_done_(std::move(on_done)) {}

CacheWarmer::~CacheWarmer() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void CacheWarmer::Start() {
  thread_ = std::thread([this] { Run(); });
}

void CacheWarmer::Run() {
  const auto start = std::chrono::steady_clock::now();
  auto models = store_->ListModels();
  if (!models.ok()) {
    spdlog::warn("cache warm-up: cannot list models: {}", models.status().ToLogString());
    if (on_done_) on_done_(result_);
    return;
  }
  // Smallest first, so that the budget fits as many models as it can.
  struct Latest {
    uint64_t size;
    std::string model;
    uint64_t version;
  };
  std::vector<Latest> latest;
  for (const ModelInfo& model : *models) {
    if (!model.latest_version) continue;
    auto info = store_->GetVersion(model.name, *model.latest_version);
    if (info.ok()) latest.push_back({info->raw_bytes, model.name, *model.latest_version});
  }
  std::sort(latest.begin(), latest.end(),
            [](const Latest& a, const Latest& b) { return a.size < b.size; });
  uint64_t total = 0;
  for (const Latest& l : latest) {
    if (stop_.load()) return;
    if (l.size > budget_bytes_ / 2 || total + l.size > budget_bytes_) {
      ++result_.skipped;
      continue;
    }
    // A version pushed or deleted since the listing is simply restored or skipped: the cache
    // is keyed by the manifest it was decoded from, so nothing stale can be used.
    auto restore = store_->OpenRestore(l.model, l.version);
    Status status = restore.status();
    while (status.ok() && !stop_.load()) {
      auto piece = (*restore)->Next();
      if (!piece.ok()) status = piece.status();
      if (!piece.ok() || piece->empty()) break;
    }
    if (stop_.load()) return;
    if (!status.ok()) {
      ++result_.skipped;
      spdlog::warn("cache warm-up: model '{}': {}", l.model, status.ToLogString());
      continue;
    }
    total += l.size;
    ++result_.models;
    result_.bytes += l.size;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("cache warm-up: latest version of {} model(s) restored ({:.1f} MiB) in {:.2f} s{}",
               result_.models, static_cast<double>(result_.bytes) / (1 << 20), seconds,
               result_.skipped ? ", " + std::to_string(result_.skipped) + " left cold" : "");
  if (on_done_) on_done_(result_);
}

}  // namespace ckpt::daemon
