#include "ordered_worker.h"

#include <utility>

namespace ckpt {
namespace {

// Buffers of finished jobs kept for the next ones (a body's chunks are mostly of a few sizes).
constexpr size_t kMaxSpareBuffers = 4;

}  // namespace

OrderedWorker::OrderedWorker(size_t max_queued_bytes, size_t inline_below_bytes)
    : max_queued_bytes_(max_queued_bytes), inline_below_bytes_(inline_below_bytes) {}

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status OrderedWorker::Submit(std::span<const uint8_t> bytes, Job job) {
  std::vector<uint8_t> copy;
  {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] {
      return Failed() || queue_.empty() || queued_bytes_ + bytes.size() <= max_queued_bytes_;
    });
    if (exception_) std::rethrow_exception(exception_);
    if (!failure_.ok()) return failure_;
    if (queue_.empty() && bytes.size() < inline_below_bytes_) {
      // Every job before this one has finished (the worker popped it under mu_).
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
  copy.assign(bytes.begin(), bytes.end());  // outside the lock: the worker goes on meanwhile
  {
    std::lock_guard lock(mu_);
    queued_bytes_ += copy.size();
    queue_.push_back(Entry{std::move(copy), std::move(job)});
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  changed_.notify_all();
  return Status::Ok();
}

Status OrderedWorker::Drain() {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return queue_.empty(); });
  if (exception_) std::rethrow_exception(exception_);
  return failure_;
}

void OrderedWorker::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    // The front entry stays where it is while it runs: Submit only appends, which keeps
    // references to a deque's elements valid.
    Entry& entry = queue_.front();
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
      if (!status.ok()) failure_ = std::move(status);
      exception_ = exception;
    }
    queued_bytes_ -= entry.bytes.size();
    if (spare_.size() < kMaxSpareBuffers) spare_.push_back(std::move(entry.bytes));
    queue_.pop_front();
    changed_.notify_all();
  }
}

}  // namespace ckpt
