#include "background_runner.h"

#include <spdlog/spdlog.h>

#include <set>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::daemon {

namespace {

std::string Join(const std::vector<uint64_t>& versions) {
  std::string out;
  for (uint64_t v : versions) {
    if (!out.empty()) out += ',';
    out += std::to_string(v);
  }
  return out;
}

}  // namespace

BackgroundRunner::BackgroundRunner(CheckpointStore* store, const RetentionOptions& options,
                                   bool rearrange_latest,
                                   std::chrono::milliseconds after_push_delay)
    : store_(store),
      options_(options),
      rearrange_latest_(rearrange_latest),
      after_push_delay_(after_push_delay),
      thread_([this] { Run(); }) {}

BackgroundRunner::~BackgroundRunner() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void BackgroundRunner::VersionsChanged(const std::string& model) {
  if (!options_.after_push && !rearrange_latest_) return;
  {
    std::lock_guard lock(mu_);
    pending_[model] = Clock::now() + after_push_delay_;
  }
  wake_.notify_all();
}

void BackgroundRunner::Run() {
  const bool periodic = options_.interval.count() > 0;
  Clock::time_point next_pass = Clock::now() + options_.interval;
  // First, every model: a shutdown or a crash may have cut short the passes after a push (a
  // rearrangement gives up at once when asked to stop). Passes with nothing to do are cheap.
  if (rearrange_latest_ || options_.after_push) {
    auto all = store_->ListModels();
    if (all.ok()) {
      std::lock_guard lock(mu_);
      for (const ModelInfo& m : *all) pending_.emplace(m.name, Clock::now());
    } else {
      spdlog::warn("background passes: cannot list models: {}", all.status().ToLogString());
    }
  }
  std::unique_lock lock(mu_);
  while (!stop_) {
    Clock::time_point wake_at = periodic ? next_pass : Clock::time_point::max();
    for (const auto& [model, due] : pending_) wake_at = std::min(wake_at, due);
    // Woken early by a push (which may queue a model due sooner) or a stop.
    wake_.wait_until(lock, wake_at);
    if (stop_) break;
    std::set<std::string> models;
    const Clock::time_point now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      models.insert(it->first);
      it = pending_.erase(it);
    }
    std::vector<std::string> busy;
    GcOptions::Compaction compaction = GcOptions::Compaction::kNone;
    bool after_push = true;
    if (periodic && Clock::now() >= next_pass) {
      after_push = false;
      next_pass = Clock::now() + options_.interval;
      compaction = GcOptions::Compaction::kTables;
      lock.unlock();
      auto all = store_->ListModels();
      if (all.ok()) {
        for (const ModelInfo& m : *all) models.insert(m.name);
      } else {
        spdlog::warn("retention: cannot list models: {}", all.status().ToLogString());
      }
      lock.lock();
    }
    lock.unlock();
    for (const std::string& model : models) {
      if (!Apply(model, compaction, after_push)) busy.push_back(model);
    }
    lock.lock();
    // A busy model is retried a second later, unless a push queued it again meanwhile.
    for (const std::string& model : busy) {
      pending_.emplace(model, Clock::now() + std::chrono::seconds(1));
    }
  }
}

bool BackgroundRunner::Apply(const std::string& model, GcOptions::Compaction compaction,
                             bool after_push) {
  // With a cluster, a model's passes run on the daemon that writes it.
  if (auto owner = store_->WriteOwner(model); !owner.ok() || *owner) return true;
  // Periodic passes rearrange too: they catch up on a model whose pass a stop cut short.
  if (rearrange_latest_ && !Rearrange(model)) return false;
  if (after_push && !options_.after_push) return true;
  return ApplyRetention(model, compaction, after_push);
}

bool BackgroundRunner::Rearrange(const std::string& model) {
  auto report = store_->RearrangeLatest(model, [this] {
    std::lock_guard lock(mu_);
    return stop_;
  });
  if (!report.ok()) {
    if (report.status().code() == StatusCode::kAborted) {
      spdlog::debug("rearrange: model '{}': {}", model, report.status().ToLogString());
      return false;
    }
    // Refused writes (the reserve, a suspended or read-only store) are logged once by the
    // health watcher; the next pass retries.
    if (report.status().code() != StatusCode::kNotFound &&
        report.status().code() != StatusCode::kUnavailable &&
        report.status().subcode() != StatusSubcode::kNoSpace) {
      spdlog::warn("rearrange: model '{}': {}", model, report.status().ToLogString());
    }
    return true;
  }
  {
    spdlog::debug(
        "rearrange: model '{}' version {}: {} tensors stored as keyframes, {} of the version "
        "before as deltas against them, {} left; {} -> {} bytes",
        model, report->version, report->tensors_keyframed, report->tensors_reversed,
        report->tensors_left, report->bytes_before, report->bytes_after);
  }
  return true;
}

bool BackgroundRunner::ApplyRetention(const std::string& model, GcOptions::Compaction compaction,
                                      bool after_push) {
  if (after_push) {
    // A pass after a push only matters when the policy can delete or drop something; the periodic
    // pass still collects what explicit deletes left.
    auto policy = store_->GetRetentionPolicy(model);
    if (policy.ok() && policy->IsEmpty()) return true;
  }
  RetentionRun run;
  run.gc.rebase_min_dead_fraction = options_.rebase_min_dead_fraction;
  run.gc.compaction = compaction;
  auto report = store_->ApplyRetention(model, run);
  if (!report.ok()) {
    if (report.status().code() == StatusCode::kAborted) return false;
    // kUnavailable: another daemon took the model's lease meanwhile; it runs the retention.
    if (report.status().code() != StatusCode::kNotFound &&
        report.status().code() != StatusCode::kUnavailable) {
      spdlog::warn("retention: model '{}': {}", model, report.status().ToLogString());
    }
    return true;
  }
  for (const std::string& problem : report->problems) {
    spdlog::warn("retention: model '{}': {}", model, problem);
  }
  const GcReport& gc = report->gc;
  std::vector<uint64_t> trimmed;  // versions that lost tensors to the tensor rules
  for (const auto& [version, tensors] : report->tensors_dropped) trimmed.push_back(version);
  if (!report->deleted.empty() || !trimmed.empty() || gc.bytes_freed > 0 ||
      gc.versions_rebased > 0) {
    spdlog::info(
        "retention: model '{}' policy {} deleted versions [{}], dropped tensors from versions "
        "[{}]; freed {} bytes ({} stored pushes, {} dropped tensors), rebased {} kept versions "
        "({} bytes rewritten), {} bytes retained for kept chains{}",
        model, report->policy.ToJson(), Join(report->deleted), Join(trimmed), gc.bytes_freed,
        gc.manifests_removed, gc.dropped_tensors_removed, gc.versions_rebased, gc.bytes_rewritten,
        gc.bytes_retained, gc.compacted ? ", compacted" : "");
  } else {
    spdlog::debug("retention: model '{}': nothing to delete", model);
  }
  return true;
}

}  // namespace ckpt::daemon
