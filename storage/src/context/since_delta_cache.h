// SinceDeltaCache: chunk records the daemon coded for encoded pulls, kept so that a follower
// moving between two versions after another did is sent the record coded for it (a pull "since"
// a version whose chain does not run to the one pulled), and a client holding nothing the
// keyframe coded in place of a chain (since_seq 0): read/encoded_restore.cc. Clients asking at
// the same moment may each code it.
//
// Keyed by the reference cache's generation (a model dropped whole and created again reuses
// seqs: entries of the old one are not found again; readers whose snapshot predates a drop
// neither read nor put), the model, both manifests' seqs, the tensor and the chunk. A record
// depends only on the two reconstructions, which never change for a manifest seq, so entries need
// no invalidation beyond that; the least recently used go first beyond the budget.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ckpt {

class SinceDeltaCache {
 public:
  using Record = std::shared_ptr<const std::string>;

  struct Key {
    uint64_t generation = 0;
    std::string_view model;
    uint64_t target_seq = 0;
    uint64_t since_seq = 0;
    uint32_t tensor = 0;  // in the target manifest
    uint32_t chunk = 0;
  };

  explicit SinceDeltaCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // The record, or nullptr.
  Record Get(const Key& key);
  // Keeps `record` (replacing one under the same key) unless it is larger than the budget.
  void Put(const Key& key, Record record);

  uint64_t size_bytes() const;
  uint64_t budget_bytes() const { return budget_bytes_; }

 private:
  using Entry = std::pair<std::string, Record>;
  static std::string MakeKey(const Key& key);

  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recently used; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;  // guarded by mu_
  uint64_t size_bytes_ = 0;                                            // guarded by mu_
};

}  // namespace ckpt
