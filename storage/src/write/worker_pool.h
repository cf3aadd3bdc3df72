// WorkerPool: runs jobs on up to N worker threads, starting them in the order they were queued,
// with a bound on the bytes waiting or running. Internal to storage/.
//
// A push hands it the chunks of a body as they arrive: the network thread goes on receiving
// and hashing while the workers encode and store (a push then uses 1 + N cores), and the byte
// bound keeps a fast sender from buffering a whole checkpoint in memory.
//
// A small job submitted while the pool is idle runs at once on the owner's thread: handing it
// over would cost more than running it (checkpoints of many small tensors push slower through a
// worker alone).
//
// With one thread, jobs run one at a time in order, each seeing what the ones before it wrote.
// With more, they start in order but run concurrently and finish in any order: jobs must not
// depend on each other.
//
// Thread safety: Submit, Drain and the destructor are called by one owner, never concurrently
// (the owner may move between threads, as a connection's coroutine does).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt {

class WorkerPool {
 public:
  // A job gets its bytes (a copy of what Submit was given) and returns its status.
  using Job = std::function<Status(std::span<const uint8_t> bytes)>;

  // `threads` >= 1 workers, started as jobs need them. Submit blocks while the jobs waiting
  // and running hold more than `max_queued_bytes` (one job is always accepted); jobs of fewer
  // than `inline_below_bytes` run inline when nothing waits or runs.
  WorkerPool(size_t threads, size_t max_queued_bytes, size_t inline_below_bytes);
  // Waits for the running jobs; jobs still waiting are dropped unrun.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `job` with a copy of `bytes`. Returns the error of a job that failed before (then
  // no further job starts: the waiting ones are dropped). An exception a job threw is rethrown
  // here or by Drain, as if the job had run on the owner's thread.
  Status Submit(std::span<const uint8_t> bytes, Job job);
  // Waits until every queued job finished; Ok or the first error.
  Status Drain();

 private:
  struct Entry {
    std::vector<uint8_t> bytes;
    Job job;
  };

  void Run();
  bool Failed() const { return !failure_.ok() || exception_; }     // mu_ held
  bool Idle() const { return waiting_.empty() && running_ == 0; }  // mu_ held

  const size_t max_threads_;
  const size_t max_queued_bytes_;
  const size_t inline_below_bytes_;
  std::mutex mu_;
  std::condition_variable changed_;          // a job was queued or finished, or stop_ was set
  std::deque<Entry> waiting_;                // guarded by mu_: jobs not started yet
  size_t running_ = 0;                       // guarded by mu_
  size_t queued_bytes_ = 0;                  // guarded by mu_: of the waiting and running jobs
  bool stop_ = false;                        // guarded by mu_
  Status failure_;                           // guarded by mu_: the first job error
  std::exception_ptr exception_;             // guarded by mu_: or the exception a job threw
  std::vector<std::vector<uint8_t>> spare_;  // guarded by mu_: buffers of finished jobs
  std::vector<std::thread> threads_;         // started by Submit, at most max_threads_
};

}  // namespace ckpt
