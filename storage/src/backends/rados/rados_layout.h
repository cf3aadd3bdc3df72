// The layout of ckptd's data in a RADOS pool (docs/format.md, "RADOS pool"; docs/design.md,
// "Scale-out on Ceph RADOS"): object names, the control keys of model objects, and how the
// metadata records of a model map to its object's omap and back to the local cache. Internal to
// storage/. Written to disk: names and keys never change; a new layout bumps kLayoutVersion.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <cstdint>
#include <map>
#include <rados/librados.hpp>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/store_backend.h"
#include "ckpt/base/status.h"

namespace ckpt::rados_layout {

inline constexpr char kLockName[] = "owner";  // the model object's exclusive lock: the lease
inline constexpr char kIndexObject[] = "models";
// Control keys of a model object start with \001, below every record's family letter.
inline constexpr char kEpochKey[] = "\001epoch";
inline constexpr char kGenerationKey[] = "\001generation";
// The layout of a model object: written at every takeover; a daemon refuses a model whose
// layout is newer than it understands.
inline constexpr char kLayoutKey[] = "\001layout";
inline constexpr uint64_t kLayoutVersion = 1;
// Seqs a daemon allocates for a model lie above epoch << kSeqEpochShift.
inline constexpr int kSeqEpochShift = 40;
// Largest omap page read at once.
inline constexpr uint64_t kOmapPage = 4096;

using OmapValues = std::map<std::string, librados::bufferlist>;

// A control value: u64, big-endian.
librados::bufferlist U64(uint64_t v);
// A control key's value (0 when absent); DataLoss when malformed.
Result<uint64_t> ReadU64(const OmapValues& values, const std::string& key);
// FailedPrecondition when the model object has a layout newer than this daemon's.
Status CheckLayout(const std::string& model, const OmapValues& control);

std::string ModelObject(std::string_view model);
std::string ChunkPrefix(std::string_view model);
std::string ChunkObject(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk);
std::vector<std::string> ChunkNames(const std::string& model, const ChunkSet& set);

// A chunk object's address, from its name.
struct ListedChunk {
  std::string name;
  uint64_t seq;
  uint32_t tensor;
  uint32_t chunk;
};
// The chunk objects among `names` (listed under ChunkPrefix(model)); other names are skipped.
std::vector<ListedChunk> ParseChunkObjects(const std::string& model,
                                           std::vector<std::string> names);

// The metadata records of a model as omap keys of its object: a family letter plus the key
// within the model. Thread-safe (immutable after construction).
class MetadataLayout {
 public:
  // `db` and `families` are the local cache; they outlive the layout.
  MetadataLayout(rocksdb::DB* db, const MetadataFamilies& families);

  // The omap changes of a change of the model's records. DeleteRange is expanded over the
  // keys the local cache holds (current while this daemon owns the model).
  Status Translate(const std::string& model, const rocksdb::WriteBatch& batch, OmapValues* sets,
                   std::set<std::string>* removals) const;

  // A batch replacing the local cache of `model` by the records of its object's omap `all`.
  Status CacheBatch(const std::string& model, const OmapValues& all,
                    rocksdb::WriteBatch* batch) const;

 private:
  rocksdb::ColumnFamilyHandle* FamilyOf(uint32_t cf) const;
  // Family letter + the key within the model: "" for the records keyed by the model name alone
  // (models, codec_state), the rest after "<model>\0" for the others.
  Result<std::string> OmapKey(const std::string& model, uint32_t cf, std::string_view key) const;

  rocksdb::DB* const db_;
  const MetadataFamilies families_;
  std::unordered_map<uint32_t, char> letters_;
};

}  // namespace ckpt::rados_layout
