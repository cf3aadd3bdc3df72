// ReferenceCache: decoded chunks of stored versions, kept in memory so that a push rarely has to
// decode the stored chain to compute its deltas, and a restore rarely replays a whole chain.
//
// Entries are keyed by (model, seq, tensor index, chunk index); a manifest's reconstruction
// never changes, so an entry stays exact for as long as its seq exists. Two kinds share one
// byte budget: references (each model's latest reconstruction, which the next push deltas
// against) and restored chunks (of versions a restore decoded or whose reference role a push
// took over: a restore of that version replays nothing, one of the next version one link).
// Once the budget is exceeded restored chunks are evicted first, least-recently-used, so they
// never push out a reference; then references.
// A miss is never an error: callers decode from storage.
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

  // What an entry is kept for; decides the order of eviction.
  enum class Kind : uint8_t {
    kReference = 0,  // a model's latest reconstruction: evicted last
    kRestored = 1,   // a chunk a restore decoded, or a former reference: evicted first
  };

  // For Get and Put: whatever the generation.
  static constexpr uint64_t kAnyGeneration = ~uint64_t{0};

  explicit ReferenceCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // The entry, or nullptr; also nullptr when `generation` is given and differs from
  // generation().
  Chunk Get(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk,
            uint64_t generation = kAnyGeneration);
  // Caches `data` (replacing an entry with the same key), unless `generation` is given and
  // differs from generation(). An entry that is a reference stays one when the same chunk is
  // put again as restored.
  void Put(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk, Chunk data,
           Kind kind = Kind::kReference, uint64_t generation = kAnyGeneration);
  // How many times a model was dropped whole (DropModelExcept with keep_seq 0: deleted, or its
  // first push aborted). On the local backend a model created again reuses seqs (a cluster's
  // deletion bumps the lease epoch, and so the seq floor), so a reader working from a snapshot
  // taken before such a drop must neither cache what it decodes nor use what the cache holds
  // (it may belong to the new model): it reads generation() before taking its snapshot and
  // passes it to Get and Put. Writers hold the model's lock, so no drop can overlap them.
  uint64_t generation() const;
  bool Contains(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) const;
  void Erase(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  // Makes the entry, if it is a reference, a restored chunk (most recently used of those): a
  // push consumed it, so it no longer needs protecting, but a restore of its version may still
  // use it.
  void Demote(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  // Demotes every reference entry of `model` whose seq differs from `keep_seq` (a push made
  // `keep_seq` the model's reference).
  void DemoteModelExcept(std::string_view model, uint64_t keep_seq);
  // Drops every entry of `model` whose seq differs from `keep_seq` (0 drops all).
  void DropModelExcept(std::string_view model, uint64_t keep_seq);
  // Files every entry of (model, old_seq) under new_seq: the manifest was rewritten under a new
  // seq with the same reconstruction (a garbage-collection rebase).
  void Rekey(std::string_view model, uint64_t old_seq, uint64_t new_seq);

  uint64_t size_bytes() const;
  uint64_t size_bytes(Kind kind) const;
  uint64_t budget_bytes() const { return budget_bytes_; }
  // Whether a whole version of `raw_bytes` is kept once restored: up to half the budget, so
  // that one large restore does not flush every other model's references.
  bool KeepsVersionOf(uint64_t raw_bytes) const { return raw_bytes <= budget_bytes_ / 2; }

 private:
  struct Entry {
    std::string key;
    std::string model;
    uint64_t seq;
    Kind kind;
    Chunk data;
  };
  using List = std::list<Entry>;
  static std::string MakeKey(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
  List& ListOf(Kind kind) { return lists_[static_cast<size_t>(kind)]; }
  // Removes the entry at `it` of `list`; returns the next one.
  List::iterator RemoveLocked(List& list, List::iterator it);
  // Moves the reference entry at `it` to the front of the restored chunks.
  void DemoteLocked(List::iterator it);
  void EvictLocked();

  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  List lists_[2];  // by Kind; front = most recently used; guarded by mu_
  std::unordered_map<std::string, List::iterator> index_;  // guarded by mu_
  uint64_t size_bytes_[2] = {0, 0};                        // by Kind; guarded by mu_
  uint64_t generation_ = 0;                                // guarded by mu_
};

}  // namespace ckpt
