// BackgroundRunner: the work ckptd does on a model after its pushes and periodically, off the
// acknowledgement path — rearranging the latest version (CheckpointStore::RearrangeLatest, so
// that it is one decode away) after every push, and applying the model's retention policy after
// every push and every `interval` for all models — and logs what it did.
//
// At start it queues every model, which catches up on passes a shutdown or crash cut short.
// Owns one worker thread. VersionsChanged() only queues the model and returns at once, so it can be
// called from a network thread. A model busy with a push is retried a second later (a
// rearrangement steps aside when a push asks for the model). Passes after a push leave
// compaction to RocksDB (GcOptions::Compaction::kNone); the periodic pass compacts the tables
// of models that freed space since (kTables), which drops blob files holding only deleted data.
// Thread safety: VersionsChanged and the destructor may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "ckpt/daemon/config.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::daemon {

class BackgroundRunner {
 public:
  // `store` must outlive the runner. Starts the worker thread.
  // `rearrange_latest`: rearrange each model's latest version after its pushes. The passes
  // after a push start `after_push_delay` after the model's last push, so that a burst of
  // pushes is followed by one pass, not raced by one per push.
  BackgroundRunner(CheckpointStore* store, const RetentionOptions& options, bool rearrange_latest,
                   std::chrono::milliseconds after_push_delay);
  ~BackgroundRunner();  // stops and joins the worker

  // Queues the passes that follow a change of `model`'s versions (a push, or a deleted version):
  // the rearrangement of the latest, then retention, which collects what the change left
  // unneeded.
  void VersionsChanged(const std::string& model);

 private:
  void Run();
  // One pass over `model`: its rearrangement, then its retention; false if it was busy and
  // should be retried. `after_push` passes skip retention for models whose policy keeps
  // everything.
  bool Apply(const std::string& model, GcOptions::Compaction compaction, bool after_push);
  // RearrangeLatest; false if the model was busy.
  bool Rearrange(const std::string& model);
  // Retention; false if the model was busy.
  bool ApplyRetention(const std::string& model, GcOptions::Compaction compaction, bool after_push);

  using Clock = std::chrono::steady_clock;

  CheckpointStore* const store_;
  const RetentionOptions options_;
  const bool rearrange_latest_;
  const std::chrono::milliseconds after_push_delay_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::map<std::string, Clock::time_point> pending_;  // model -> when due; guarded by mu_
  bool stop_ = false;                                 // guarded by mu_
  std::thread thread_;
};

}  // namespace ckpt::daemon
