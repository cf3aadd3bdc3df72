// ModelChains: everything stored for one model — its records, versions and manifests — loaded
// into memory, with the chain walks that decide which manifests are still needed.
//
// A manifest is *live* when a version record points at it or it is the codec state's reference
// (the next push deltas against it). It is *needed* when it is live or lies on the delta chain
// of any tensor of a live manifest. Everything else can be removed without changing a single
// byte that any version restores to.
//
// Thread-compatible: loaded and used by one thread holding the model's lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "ckpt/codec/status.h"
#include "core/store_context.h"
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

  // Adds to `change` the removal of every manifest (and its chunks) not in `needed`; returns
  // the bytes they held and how many there were.
  struct Removal {
    uint64_t manifests = 0;
    uint64_t bytes = 0;
  };
  Removal RemoveUnneeded(const StoreContext& ctx, const std::set<uint64_t>& needed,
                         ModelChange* change) const;

  // Sum of the stored bytes of the manifests in `seqs`.
  uint64_t StoredBytes(const std::set<uint64_t>& seqs) const;
};

}  // namespace ckpt
