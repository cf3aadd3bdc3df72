// ModelLocks: one push/mutation lock per model name.
//
// Locks are taken with try-lock semantics: a second writer to a busy model fails fast instead of
// blocking a network thread. Thread safety: safe for concurrent use.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ckpt {

class ModelLocks {
 public:
  // Holds one model's lock; releases it on destruction.
  class Guard {
   public:
    Guard() = default;
    Guard(Guard&&) = default;
    Guard& operator=(Guard&& other) noexcept {
      if (this != &other) {
        if (mu_) mu_->unlock();
        mu_ = std::move(other.mu_);
      }
      return *this;
    }
    ~Guard() {
      if (mu_) mu_->unlock();
    }
    explicit operator bool() const { return mu_ != nullptr; }

   private:
    friend class ModelLocks;
    explicit Guard(std::shared_ptr<std::mutex> mu) : mu_(std::move(mu)) {}
    std::shared_ptr<std::mutex> mu_;
  };

  // Returns a held guard, or an empty one if the model is locked by someone else.
  Guard TryLock(std::string_view model) {
    std::shared_ptr<std::mutex> mu;
    {
      std::lock_guard lock(registry_mu_);
      auto& slot = locks_[std::string(model)];
      if (!slot) slot = std::make_shared<std::mutex>();
      mu = slot;
    }
    if (!mu->try_lock()) return Guard();
    return Guard(std::move(mu));
  }

 private:
  std::mutex registry_mu_;
  // Entries are never removed: one small mutex per model name ever written, bounded by the
  // number of models.
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> locks_;  // guarded by registry_mu_
};

}  // namespace ckpt
