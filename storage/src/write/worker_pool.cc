#include "write/worker_pool.h"

#include <algorithm>
#include <utility>

namespace ckpt {
namespace {

// Buffers of finished jobs kept for the next ones (a body's chunks are mostly of a few sizes).
constexpr size_t kMaxSpareBuffers = 4;

}  // namespace

WorkerPool::WorkerPool(size_t threads, size_t max_queued_bytes, size_t inline_below_bytes)
    : max_threads_(std::max<size_t>(1, threads)),
      max_queued_bytes_(max_queued_bytes),
      inline_below_bytes_(inline_below_bytes) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

Status WorkerPool::Submit(std::span<const uint8_t> bytes, Job job) {
  std::vector<uint8_t> copy;
  {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] {
      return Failed() || Idle() || queued_bytes_ + bytes.size() <= max_queued_bytes_;
    });
    if (exception_) std::rethrow_exception(exception_);
    if (!failure_.ok()) return failure_;
    if (Idle() && bytes.size() < inline_below_bytes_) {
      // Every job before this one has finished (workers count themselves out under mu_).
      lock.unlock();
      Status status = job(bytes);
      if (!status.ok()) {
        lock.lock();
        failure_ = status;
      }
      return status;
    }
    if (!spare_.empty()) {
      copy = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  copy.assign(bytes.begin(), bytes.end());  // outside the lock: the workers go on meanwhile
  {
    std::lock_guard lock(mu_);
    queued_bytes_ += copy.size();
    waiting_.push_back(Entry{std::move(copy), std::move(job)});
    if (threads_.size() < max_threads_ && threads_.size() < waiting_.size() + running_) {
      threads_.emplace_back([this] { Run(); });
    }
  }
  changed_.notify_all();
  return Status::Ok();
}

Status WorkerPool::Drain() {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return Idle(); });
  if (exception_) std::rethrow_exception(exception_);
  return failure_;
}

void WorkerPool::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
    if (stop_) return;
    Entry entry = std::move(waiting_.front());
    waiting_.pop_front();
    ++running_;
    if (!Failed()) {
      lock.unlock();
      Status status;
      std::exception_ptr exception;
      try {
        status = entry.job(entry.bytes);
      } catch (...) {  // a bug: rethrown to the owner, as if the job had run on its thread
        exception = std::current_exception();
      }
      lock.lock();
      if (!status.ok() && failure_.ok()) failure_ = std::move(status);
      if (exception && !exception_) exception_ = exception;
    }
    queued_bytes_ -= entry.bytes.size();
    if (spare_.size() < kMaxSpareBuffers) spare_.push_back(std::move(entry.bytes));
    --running_;
    changed_.notify_all();
  }
}

}  // namespace ckpt
