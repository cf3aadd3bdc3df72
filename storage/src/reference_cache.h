// ReferenceCache: decoded chunks of each model's latest reconstruction, kept in memory so a
// push rarely has to decode the stored chain to compute its deltas.
//
// Entries are keyed by (model, seq, tensor index, chunk index) and evicted least-recently-used
// once the byte budget is exceeded. A miss is never an error: callers decode from storage.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ckpt {

class ReferenceCache {
 public:
  using Chunk = std::shared_ptr<const std::vector<uint8_t>>;

  explicit ReferenceCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  Chunk Get(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  void Put(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk, Chunk data);
  bool Contains(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) const;
  void Erase(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  // Drops every entry of `model` whose seq differs from `keep_seq` (0 drops all).
  void DropModelExcept(std::string_view model, uint64_t keep_seq);
  // Files every entry of (model, old_seq) under new_seq: the manifest was rewritten under a new
  // seq with the same reconstruction (a garbage-collection rebase).
  void Rekey(std::string_view model, uint64_t old_seq, uint64_t new_seq);

  uint64_t size_bytes() const;
  uint64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Entry {
    std::string key;
    std::string model;
    uint64_t seq;
    Chunk data;
  };
  static std::string MakeKey(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  void EvictLocked();

  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recently used; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;  // guarded by mu_
  uint64_t size_bytes_ = 0;                                            // guarded by mu_
};

}  // namespace ckpt
