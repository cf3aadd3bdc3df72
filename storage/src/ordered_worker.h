// OrderedWorker: runs jobs on one worker thread in the order they were queued, with a bound on
// the bytes waiting. Internal to storage/.
//
// A push hands it the chunks of a body as they arrive: the network thread goes on receiving
// and hashing while the worker encodes and stores (a push then uses two cores), and the queue
// bound keeps a fast sender from buffering a whole checkpoint in memory.
//
// A small job submitted while nothing is queued runs at once on the owner's thread: handing it
// over would cost more than running it (a checkpoint of many small tensors pushed 6-10% slower
// through the worker alone).
//
// Thread safety: Submit, Drain and the destructor are called by one owner, never concurrently
// (the owner may move between threads, as a connection's coroutine does); the jobs run one at a
// time, each seeing what the ones before it wrote.
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

#include "ckpt/codec/status.h"

namespace ckpt {

class OrderedWorker {
 public:
  // A job gets its bytes (a copy of what Submit was given) and returns its status.
  using Job = std::function<Status(std::span<const uint8_t> bytes)>;

  // Submit blocks while more than `max_queued_bytes` wait (one job is always accepted); jobs of
  // fewer than `inline_below_bytes` run inline when nothing is queued.
  OrderedWorker(size_t max_queued_bytes, size_t inline_below_bytes);
  // Waits for the running job; jobs still queued are dropped unrun.
  ~OrderedWorker();

  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  // Queues `job` with a copy of `bytes`. Returns the error of a job that failed before (then
  // nothing more runs: the jobs after a failure are dropped). An exception a job threw is
  // rethrown here or by Drain, as if the job had run on the owner's thread.
  Status Submit(std::span<const uint8_t> bytes, Job job);
  // Waits until every queued job ran; Ok or the first job's error.
  Status Drain();

 private:
  struct Entry {
    std::vector<uint8_t> bytes;
    Job job;
  };

  void Run();
  bool Failed() const { return !failure_.ok() || exception_; }  // mu_ held

  const size_t max_queued_bytes_;
  const size_t inline_below_bytes_;
  std::mutex mu_;
  std::condition_variable changed_;          // a job was queued or finished, or stop_ was set
  std::deque<Entry> queue_;                  // guarded by mu_; the front one may be running
  size_t queued_bytes_ = 0;                  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  Status failure_;                           // guarded by mu_: the first job error
  std::exception_ptr exception_;             // guarded by mu_: or the exception a job threw
  std::vector<std::vector<uint8_t>> spare_;  // guarded by mu_: buffers of finished jobs
  std::thread thread_;                       // started by the first Submit
};

}  // namespace ckpt
