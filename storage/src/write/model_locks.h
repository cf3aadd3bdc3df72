// ModelLocks: one push/mutation lock per model name.
//
// Locks are taken with try-lock semantics: a second writer to a busy model fails fast instead of
// blocking a network thread, and may ask to be called back when the lock is released
// (CallOnRelease) to try again then; background work waits on a condition variable instead
// (LockWithin). A lock is a name in a set rather than a std::mutex because a push
// session is created on one thread and may end on another (HTTP sessions are coroutines that
// resume on any thread of the pool), and a std::mutex must be unlocked by the thread that locked
// it. A holder doing deferrable work (the rearrangement of a model's newest versions) asks
// Contended() between steps and steps aside when another writer has asked for the lock since.
// Thread safety: safe for concurrent use; a Guard may be released from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckpt {

class ModelLocks {
 public:
  // Holds one model's lock; releases it on destruction.
  class Guard {
   public:
    Guard() = default;
    Guard(Guard&& other) noexcept
        : locks_(std::exchange(other.locks_, nullptr)), model_(std::move(other.model_)) {}
    Guard& operator=(Guard&& other) noexcept {
      if (this != &other) {
        Release();
        locks_ = std::exchange(other.locks_, nullptr);
        model_ = std::move(other.model_);
      }
      return *this;
    }
    ~Guard() { Release(); }
    explicit operator bool() const { return locks_ != nullptr; }
    // Whether another writer failed to take (or waited for) this lock while it was held.
    bool Contended() const { return locks_ && locks_->IsContended(model_); }

   private:
    friend class ModelLocks;
    Guard(ModelLocks* locks, std::string model) : locks_(locks), model_(std::move(model)) {}
    void Release() {
      if (locks_) locks_->Unlock(model_);
      locks_ = nullptr;
    }
    ModelLocks* locks_ = nullptr;
    std::string model_;
  };

  // Returns a held guard, or an empty one if the model is locked by someone else.
  Guard TryLock(std::string_view model) { return LockWithin(model, std::chrono::milliseconds(0)); }

  // Like TryLock, but waits up to `timeout` for the model to become free. Blocks the calling
  // thread: for background work, administrative passes and the commit of a sharded version
  // (which runs off the network threads, or on a `shards:commit` request's thread).
  Guard LockWithin(std::string_view model, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(mu_);
    const std::string name(model);
    // Every holder met while waiting learns that a writer waits (Contended), including one
    // that took the lock from another waiter meanwhile.
    for (auto it = busy_.find(name); it != busy_.end(); it = busy_.find(name)) {
      it->second = true;
      if (free_.wait_until(lock, deadline) == std::cv_status::timeout && busy_.count(name)) {
        return Guard();
      }
    }
    busy_.emplace(name, false);
    return Guard(this, name);
  }

  // Calls `on_release` once the model's lock is next released, on the releasing thread, holding
  // no lock of this class; returns false without keeping it if the model is free now. Counts as
  // asking for the lock (the holder's Contended() turns true). `on_release` must be quick, must
  // not block and must not call the store: it only tells the waiter to try again.
  bool CallOnRelease(std::string_view model, std::function<void()> on_release) {
    std::lock_guard lock(mu_);
    auto it = busy_.find(std::string(model));
    if (it == busy_.end()) return false;
    it->second = true;
    waiters_[it->first].push_back(std::move(on_release));
    return true;
  }

 private:
  bool IsContended(const std::string& model) {
    std::lock_guard lock(mu_);
    auto it = busy_.find(model);
    return it != busy_.end() && it->second;
  }

  void Unlock(const std::string& model) {
    std::vector<std::function<void()>> waiters;
    {
      std::lock_guard lock(mu_);
      busy_.erase(model);
      if (auto it = waiters_.find(model); it != waiters_.end()) {
        waiters = std::move(it->second);
        waiters_.erase(it);
      }
    }
    free_.notify_all();
    for (auto& on_release : waiters) on_release();
  }

  std::mutex mu_;
  std::condition_variable free_;
  // Held locks, and whether another writer has asked for each since; guarded by mu_.
  std::unordered_map<std::string, bool> busy_;
  // Callbacks for the next release of each held lock; guarded by mu_.
  std::unordered_map<std::string, std::vector<std::function<void()>>> waiters_;
};

}  // namespace ckpt
