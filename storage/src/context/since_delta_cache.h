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
// no invalidation beyond that; the least recently used go first beyond the budget. A record
// that no pull sent (the chain it would replace was no larger) is kept by its size only, so that
// the next pull learns that without coding it again.
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

  // What is known of the record coded for a key: the record itself, or only its size.
  struct Known {
    Record record;              // nullptr when only the size is kept, or nothing is
    uint64_t record_bytes = 0;  // 0: nothing is known (a chunk record is never empty)
  };

  explicit SinceDeltaCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  Known Get(const Key& key);
  // Keeps `record` (replacing what is known under the same key) unless it is larger than the
  // budget.
  void Put(const Key& key, Record record);
  // Keeps only the size of the record coded for `key` (no pull sent it), replacing a size known
  // (a record kept under the key stays).
  void PutSizeOnly(const Key& key, uint64_t record_bytes);

  uint64_t size_bytes() const;
  uint64_t budget_bytes() const { return budget_bytes_; }

 private:
  // What an entry known by its size only counts against the budget: about its key and node.
  static constexpr uint64_t kSizeOnlyEntryBytes = 128;

  struct Entry {
    std::string key;
    Known known;
    uint64_t charged_bytes;  // against the budget
  };
  static std::string MakeKey(const Key& key);
  void Insert(const Key& key, Known known, uint64_t charged_bytes);

  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recently used; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;  // guarded by mu_
  uint64_t size_bytes_ = 0;                                            // guarded by mu_
};

}  // namespace ckpt
