// The layout of ckptd's data in a RADOS pool (rados_layout.h).
#include "backends/rados/rados_layout.h"

#include <cstdio>

#include "records/keys.h"

namespace ckpt::rados_layout {

namespace keys = storage_keys;

librados::bufferlist U64(uint64_t v) {
  std::string s;
  keys::AppendBigEndian(s, v, 8);
  librados::bufferlist bl;
  bl.append(s);
  return bl;
}

Result<uint64_t> ReadU64(const OmapValues& values, const std::string& key) {
  auto it = values.find(key);
  if (it == values.end()) return uint64_t{0};
  const std::string s = it->second.to_str();
  if (s.size() != 8) return Status::DataLoss("rados: malformed control key in model object");
  return keys::ReadBigEndian(s, 0, 8);
}

std::string ModelObject(std::string_view model) { return "model." + std::string(model); }

std::string ChunkPrefix(std::string_view model) { return "chunk/" + std::string(model) + "/"; }

std::string ChunkObject(std::string_view model, uint64_t seq, uint32_t tensor, uint32_t chunk) {
  char tail[64];
  std::snprintf(tail, sizeof tail, "%016llx/%u/%u", static_cast<unsigned long long>(seq), tensor,
                chunk);
  return ChunkPrefix(model) + tail;
}

// FailedPrecondition when the model object has a layout newer than this daemon's.
Status CheckLayout(const std::string& model, const OmapValues& control) {
  CKPT_ASSIGN_OR_RETURN(const uint64_t layout, ReadU64(control, kLayoutKey));
  if (layout <= kLayoutVersion) return Status::Ok();
  return Status::FailedPrecondition(
      "model '" + model + "' was written by a newer ckptd (RADOS layout " + std::to_string(layout) +
      "; this one knows up to " + std::to_string(kLayoutVersion) + "): upgrade this daemon");
}

std::vector<std::string> ChunkNames(const std::string& model, const ChunkSet& set) {
  return ChunkSetNames(set, [&](uint64_t seq, uint32_t tensor, uint32_t chunk) {
    return ChunkObject(model, seq, tensor, chunk);
  });
}

std::vector<ListedChunk> ParseChunkObjects(const std::string& model,
                                           std::vector<std::string> names) {
  const std::string prefix = ChunkPrefix(model);
  std::vector<ListedChunk> out;
  for (std::string& oid : names) {
    unsigned long long seq = 0;
    unsigned tensor = 0, chunk = 0;
    if (oid.starts_with(prefix) &&
        std::sscanf(oid.c_str() + prefix.size(), "%16llx/%u/%u", &seq, &tensor, &chunk) == 3) {
      out.push_back({std::move(oid), seq, tensor, chunk});
    }
  }
  return out;
}

std::map<std::string, librados::bufferlist> ToOmap(const RecordMap& records) {
  std::map<std::string, librados::bufferlist> omap;
  for (const auto& [key, value] : records) omap[key].append(value);
  return omap;
}

RecordMap FromOmap(const std::map<std::string, librados::bufferlist>& omap) {
  RecordMap records;
  for (const auto& [key, value] : omap) records[key] = value.to_str();
  return records;
}

}  // namespace ckpt::rados_layout
