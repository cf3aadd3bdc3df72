// DeferredRemovals: chunk objects a commit made unreachable, removed a grace period later so
// that restores other daemons started from the previous generation can still read them.
// Internal to storage/. Thread safety: safe for concurrent use.
#pragma once

#include <chrono>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/chunk_store.h"

namespace ckpt {

using RemovalClock = std::chrono::steady_clock;

class DeferredRemovals {
 public:
  // Removes `names` once `grace` has passed.
  void Defer(std::vector<std::string> names, RemovalClock::duration grace) {
    if (names.empty()) return;
    std::lock_guard lock(mu_);
    pending_.push_back({RemovalClock::now() + grace, std::move(names)});
  }

  // Removes what is due from `chunks` (best effort: the rest are orphans for garbage collection).
  void RunDue(ChunkStore& chunks) {
    std::vector<std::string> due;
    {
      std::lock_guard lock(mu_);
      while (!pending_.empty() && pending_.front().due <= RemovalClock::now()) {
        auto& names = pending_.front().names;
        due.insert(due.end(), names.begin(), names.end());
        pending_.pop_front();
      }
    }
    (void)chunks.DeleteAll(due);
  }

  // Every name still waiting (left alone by orphan removal).
  std::set<std::string> Pending() {
    std::set<std::string> out;
    std::lock_guard lock(mu_);
    for (const Entry& e : pending_) out.insert(e.names.begin(), e.names.end());
    return out;
  }

 private:
  struct Entry {
    RemovalClock::time_point due;
    std::vector<std::string> names;
  };
  std::mutex mu_;
  std::deque<Entry> pending_;  // guarded by mu_, oldest first
};

}  // namespace ckpt
