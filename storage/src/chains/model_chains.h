// ModelChains: everything stored for one model — its records, versions and manifests — loaded
// into memory, with the chain walks that decide which manifests are still needed.
//
// A manifest is *live* when a version record points at it or it is the codec state's reference
// (the next push deltas against it). A tensor of a manifest is *needed* when it is a tensor of
// a live manifest that its version has not dropped (VersionRecord::dropped_tensors), or a link
// of such a tensor's delta chain; a manifest is needed when it is live or holds a needed tensor.
// Everything else can be removed without changing a single byte that any version restores to.
//
// Thread-compatible: loaded and used by one thread holding the model's lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "ckpt/base/status.h"
#include "context/store_context.h"
#include "records/records.h"

namespace ckpt {

struct ModelChains {
  std::string model;
  ModelRecord record;
  std::optional<CodecStateRecord> codec_state;
  std::map<uint64_t, VersionRecord> versions;    // by version number
  std::map<uint64_t, ManifestRecord> manifests;  // by seq

  // Reads the model's records through `ro`. NotFound if the model does not exist.
  static Result<ModelChains> Load(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                  const std::string& model);

  // Seqs of live manifests: those of the versions (except `excluded_version`) and the codec
  // state's reference.
  std::set<uint64_t> LiveSeqs(std::optional<uint64_t> excluded_version = std::nullopt) const;

  // Seqs of every manifest needed by `live`: the live ones and every link of their chains.
  // DataLoss if a chain points at a missing manifest or tensor.
  Result<std::set<uint64_t>> NeededSeqs(const std::set<uint64_t>& live) const;

  // The (seq, tensor) pairs needed by `live`: their tensors but those their versions dropped,
  // and every link of those tensors' chains. DataLoss as NeededSeqs.
  using TensorRef = std::pair<uint64_t, uint32_t>;
  Result<std::set<TensorRef>> NeededTensors(const std::set<uint64_t>& live) const;

  // Adds to `change` the removal of every manifest (and its chunks) not in `needed`; returns
  // the bytes they held and how many there were.
  struct Removal {
    uint64_t manifests = 0;
    uint64_t bytes = 0;
  };
  Removal RemoveUnneeded(const StoreContext& ctx, const std::set<uint64_t>& needed,
                         ModelChange* change) const;

  // For a change that re-points versions or chains (a rearrangement's or a rebase's switch):
  // adds to `change` the removal of every manifest the live versions no longer need, and
  // forgets them here, so that the switch and the removal commit together and no reader ever
  // sees a manifest that nothing needs. DataLoss as NeededSeqs.
  Result<Removal> RemoveNoLongerNeeded(const StoreContext& ctx, ModelChange* change);

  // The versions by the seq of their manifest.
  std::map<uint64_t, const VersionRecord*> VersionsBySeq() const;

  // Sum of the stored bytes of the manifests in `seqs`.
  uint64_t StoredBytes(const std::set<uint64_t>& seqs) const;
};

}  // namespace ckpt
