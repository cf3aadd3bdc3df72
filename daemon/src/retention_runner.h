// RetentionRunner: applies each model's retention policy in the background — after every push
// of the model and every `interval` for all models — and logs what it decided.
//
// Owns one worker thread. ModelPushed() only queues the model and returns at once, so it can be
// called from a network thread. A model busy with a push is retried a second later. Passes after
// a push leave compaction to RocksDB (GcOptions::Compaction::kNone); the periodic pass compacts
// the tables of models that freed space since (kTables), which drops blob files holding only
// deleted data. Thread safety: ModelPushed and the destructor may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "ckpt/daemon/config.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::daemon {

class RetentionRunner {
 public:
  // `store` must outlive the runner. Starts the worker thread.
  RetentionRunner(CheckpointStore* store, const RetentionOptions& options);
  ~RetentionRunner();  // stops and joins the worker

  // Queues a pass for `model` (if after_push is set).
  void ModelPushed(const std::string& model);

 private:
  void Run();
  // One pass over `model`; false if it was busy and should be retried. `after_push` passes
  // skip models whose policy keeps everything.
  bool Apply(const std::string& model, GcOptions::Compaction compaction, bool after_push);

  CheckpointStore* const store_;
  const RetentionOptions options_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::set<std::string> pending_;  // guarded by mu_
  bool stop_ = false;              // guarded by mu_
  std::thread thread_;
};

}  // namespace ckpt::daemon
