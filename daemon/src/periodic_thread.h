// PeriodicThread: runs a task on a thread of its own every `interval`, until destroyed.
//
// Owns its thread, started by the constructor (the first run is immediate) and joined by the
// destructor, which waits for a run in progress. The task runs on that thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ckpt::daemon {

class PeriodicThread {
 public:
  PeriodicThread(std::chrono::milliseconds interval, std::function<void()> task)
      : interval_(interval), task_(std::move(task)), thread_([this] { Run(); }) {}
  ~PeriodicThread() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      task_();
      lock.lock();
      wake_.wait_for(lock, interval_, [this] { return stop_; });
    }
  }

  const std::chrono::milliseconds interval_;
  const std::function<void()> task_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;   // guarded by mu_
  std::thread thread_;  // last: started after everything it uses
};

}  // namespace ckpt::daemon
