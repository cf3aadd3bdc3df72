// ModelPacks: which packs (s3_packs.h) hold a model's chunk records, as this daemon knows it:
// the pack the writer is filling, the packs it wrote that no commit refers to yet, and the pack
// index of every committed seq (from the model's log, rebuilt with the local cache), and for a
// grace period the index entries a commit replaced, so that readers that started before it still
// find the records whose removal the commit deferred. Decides what a commit adds to and removes
// from the index. Does no I/O. Internal to storage/.
//
// Thread safety: safe for concurrent use (one mutex; readers look records up while a push adds
// to the open pack).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/model_records.h"
#include "backends/s3/s3_packs.h"
#include "backends/store_backend.h"
#include "ckpt/base/status.h"

namespace ckpt {

class ModelPacks {
 public:
  using Clock = std::chrono::steady_clock;

  // `pack_bytes`: a pack is written once its records reach this size. `grace`: how long records
  // a commit made unreachable stay found (RemovalGrace).
  ModelPacks(std::string model, uint64_t pack_bytes, Clock::duration grace);

  // ---- the writer

  // A pack to write: its object name and whole content (records and footer).
  struct FullPack {
    std::string key;
    std::string bytes;
  };
  // Adds a record to the open pack; returns the packs to write now: the open one if the record
  // starts another seq or would overflow it, and the new one once it reaches pack_bytes. A
  // record added again (same address) supersedes the earlier one.
  std::vector<FullPack> Add(uint64_t seq, uint32_t tensor, uint32_t chunk, std::string_view record);
  // The open pack, closed (nothing if empty).
  std::optional<FullPack> Close();
  // Gives up the written, uncommitted packs of `set` (an aborted push): the names of the packs
  // no record of which stays.
  std::vector<std::string> Discard(const ChunkSet& set);

  // ---- readers

  // Where a record is. `open`: in the pack being filled (`bytes` is the record);
  // `uncommitted`: in a pack written (or being written) that no commit refers to yet.
  struct Location {
    std::string key;
    uint64_t offset = 0;
    uint32_t length = 0;
    s3_layout::ReadBlock block;  // the read block holding it
    bool open = false;
    bool uncommitted = false;
    std::string bytes;
  };
  // nullopt when no pack holds it (a record of its own object, or none).
  std::optional<Location> Find(uint64_t seq, uint32_t tensor, uint32_t chunk) const;

  // ---- commits

  struct Change {
    RecordMap sets;                  // pack index records (control keys)
    std::set<std::string> removals;  // pack index records
    std::vector<std::string> dead;   // packs nothing refers to any more
    std::vector<uint64_t> attached;  // the written seqs the change refers to
    std::map<uint64_t, std::optional<s3_layout::PackedSeq>> seqs;  // nullopt: removed
    bool whole_model = false;
  };
  // What a commit changes in the index: it stores the manifests of `new_seqs` (the records each
  // lists join the index from the packs written under the seq; written records it does not list,
  // left by an attempt that never committed, do not) and makes `unreachable` unreachable (every
  // pack of the model if `whole_model`). `unpacked` receives the addresses of unreachable
  // records no pack holds (single objects). REQUIRES: the open pack closed.
  Change Plan(const std::vector<ChunkSet>& new_seqs, const std::vector<ChunkSet>& unreachable,
              bool whole_model, std::vector<StoreBackend::ChunkAddress>* unpacked) const;
  // After the commit of `change` landed.
  void Apply(const Change& change);
  // After a commit of the written `seqs` whose outcome is unknown: the index learns from the log
  // whether they joined it, and a pack of theirs no commit lists is an orphan.
  void Forget(const std::vector<uint64_t>& seqs);

  // ---- the index as the log holds it

  // Replaces the committed index by the pack index records among `records` (a snapshot).
  Status Replace(const RecordMap& records);
  // Applies a log entry's record changes (the pack index records among them).
  Status ApplyRecords(const RecordMap& sets, const std::set<std::string>& removals);
  // Every pack index record (for a snapshot).
  RecordMap Records() const;
  // Forgets the retired entries past their grace (also done by every lookup and change).
  void Prune();

  // Whether pack `id` of `seq` is referred to by the index (or was, within the grace) or is this
  // writer's (written or open): orphan removal leaves it.
  bool Known(uint64_t seq, uint64_t id) const;
  // The committed packs of seqs below `seq_end`: (seq, key, members).
  struct CommittedPack {
    uint64_t seq;
    std::string key;
    std::vector<s3_layout::PackMember> members;
  };
  std::vector<CommittedPack> Committed(uint64_t seq_end) const;

 private:
  // The committed packs of one seq, with a lookup by address.
  struct SeqIndex {
    s3_layout::PackedSeq packed;
    std::string encoded;
    struct Slot {
      uint32_t tensor, chunk, pack, member;
    };
    std::vector<Slot> slots;  // by (tensor, chunk)
    std::vector<std::vector<s3_layout::ReadBlock>> blocks;
    std::vector<std::vector<uint32_t>> block_of_member;

    static SeqIndex Of(s3_layout::PackedSeq packed);
    const Slot* Find(uint32_t tensor, uint32_t chunk) const;
  };
  struct OpenPack {
    uint64_t seq = 0;
    uint64_t id = 0;
    std::string bytes;
    std::vector<s3_layout::PackMember> members;
    std::unordered_map<uint64_t, size_t> where;  // address -> index in members
  };
  // An index entry a commit replaced, found until `until`.
  struct Retired {
    uint64_t seq;
    SeqIndex index;
    Clock::time_point until;
  };

  FullPack CloseLocked();  // REQUIRES: mu_, open_
  // Replaces the committed entry of `seq`, retiring the one it replaces. REQUIRES: mu_.
  void SetCommitted(uint64_t seq, std::optional<s3_layout::PackedSeq> packed);
  void PruneLocked() const;  // REQUIRES: mu_
  std::optional<Location> FindIn(uint64_t seq, const SeqIndex& index, uint32_t tensor,
                                 uint32_t chunk) const;

  const std::string model_;
  const uint64_t pack_bytes_;
  const Clock::duration grace_;
  mutable std::mutex mu_;
  std::optional<OpenPack> open_;                      // guarded by mu_
  std::map<uint64_t, s3_layout::PackedSeq> written_;  // guarded by mu_; in writing order
  std::map<uint64_t, SeqIndex> committed_;            // guarded by mu_
  mutable std::deque<Retired> retired_;               // guarded by mu_; oldest first
};

}  // namespace ckpt
