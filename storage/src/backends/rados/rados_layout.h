// The layout of ckptd's data in a RADOS pool (docs/format.md, "RADOS pool"; docs/design.md,
// "Scale-out on Ceph RADOS"): object names, the control keys of model objects, and how the
// metadata records of a model map to its object's omap and back to the local cache. Internal to
// storage/. Written to disk: names and keys never change; a new layout bumps kLayoutVersion.
#pragma once

#include <cstdint>
#include <map>
#include <rados/librados.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backends/model_records.h"
#include "backends/shared_chunks.h"
#include "backends/store_backend.h"
#include "ckpt/base/status.h"

namespace ckpt::rados_layout {

inline constexpr char kLockName[] = "owner";  // the model object's exclusive lock: the lease
inline constexpr char kIndexObject[] = "models";
// Control keys of a model object start with kControlKeyPrefix, below every record's family
// letter.
inline constexpr char kEpochKey[] = "\001epoch";
inline constexpr char kGenerationKey[] = "\001generation";
// The layout of a model object: written at every takeover; a daemon refuses a model whose
// layout is newer than it understands.
inline constexpr char kLayoutKey[] = "\001layout";
inline constexpr uint64_t kLayoutVersion = 1;
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

// The chunk objects among `names` (listed under ChunkPrefix(model)); other names are skipped.
std::vector<ListedChunk> ParseChunkObjects(const std::string& model,
                                           std::vector<std::string> names);

// The omap form of records (model_records.h) and back.
std::map<std::string, librados::bufferlist> ToOmap(const RecordMap& records);
RecordMap FromOmap(const std::map<std::string, librados::bufferlist>& omap);

}  // namespace ckpt::rados_layout
