// Dropping tensors from a stored version (tensor_drop.h).
#include "chains/tensor_drop.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/base/hashing.h"
#include "engine/scoped_snapshot.h"
#include "read/catalog.h"
#include "read/restore_stream.h"

namespace ckpt {
namespace {

// The header of the body without the dropped tensors: the stored header's JSON (its key order
// kept) less those tensors, the others' data_offsets packed in body order, padded with spaces
// to 8 bytes as safetensors writers do, behind its u64 length.
Result<std::string> HeaderWithout(const VersionRecord& record, const ManifestRecord& manifest,
                                  const VersionRecord& result) {
  if (record.raw_header.size() < 8) return Status::DataLoss("stored header is too short");
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(record.raw_header.substr(8), nullptr,
                                                             /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::DataLoss("stored header is not a JSON object");
  }
  uint64_t offset = 0;
  for (uint32_t t = 0; t < manifest.tensors.size(); ++t) {
    const ManifestTensor& e = manifest.tensors[t];
    if (result.Dropped(t)) {
      doc.erase(e.name);  // (one dropped before is not in the stored header any more)
      continue;
    }
    if (!doc.contains(e.name)) {
      return Status::DataLoss("stored header lacks tensor '" + e.name + "'");
    }
    doc[e.name]["data_offsets"] = {offset, offset + e.byte_size};
    offset += e.byte_size;
  }
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);  // little-endian hosts only, as the parser
  return out + text;
}

}  // namespace

Result<VersionRecord> WithTensorsDropped(const StoreContext& ctx, const std::string& model,
                                         uint64_t version, const VersionRecord& record,
                                         const ManifestRecord& manifest,
                                         const std::vector<uint32_t>& drop) {
  VersionRecord result = record;
  for (uint32_t t : drop) {
    if (t >= manifest.tensors.size()) return Status::Internal("dropped tensor index out of range");
    result.dropped_tensors.push_back(t);
  }
  std::sort(result.dropped_tensors.begin(), result.dropped_tensors.end());
  result.dropped_tensors.erase(
      std::unique(result.dropped_tensors.begin(), result.dropped_tensors.end()),
      result.dropped_tensors.end());
  CKPT_ASSIGN_OR_RETURN(result.raw_header, HeaderWithout(record, manifest, result));

  // The remaining body's SHA-256: the new header, then every byte of the old body outside the
  // dropped tensors, as a restore of the old record sends (and checks) them.
  std::vector<std::pair<uint64_t, uint64_t>> dropped_ranges;  // body offsets, ascending
  uint64_t position = record.raw_header.size();
  result.raw_bytes = result.raw_header.size();
  result.tensor_count = 0;
  result.lossy = false;
  for (uint32_t t = 0; t < manifest.tensors.size(); ++t) {
    const ManifestTensor& e = manifest.tensors[t];
    if (record.Dropped(t) || !result.Dropped(t)) {
      if (!record.Dropped(t)) {
        result.raw_bytes += e.byte_size;
        ++result.tensor_count;
        result.lossy |= e.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized);
        position += e.byte_size;
      }
      continue;
    }
    dropped_ranges.emplace_back(position, position + e.byte_size);
    position += e.byte_size;
  }
  Sha256 sha;
  sha.Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(result.raw_header.data()),
                                      result.raw_header.size()));
  CKPT_ASSIGN_OR_RETURN(auto stream, OpenRestoreStream(ctx, ScopedSnapshot(ctx.db), model,
                                                       MakeVersionInfo(model, version, record),
                                                       record, 0, /*use_cache=*/false));
  uint64_t at = 0;
  auto range = dropped_ranges.begin();
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(std::span<const uint8_t> piece, stream->Next());
    if (piece.empty()) break;
    const uint64_t begin = at, end = at + piece.size();
    at = end;
    uint64_t from = std::max<uint64_t>(begin, record.raw_header.size());  // the old header: out
    while (from < end) {
      while (range != dropped_ranges.end() && range->second <= from) ++range;
      const uint64_t keep_to =
          range == dropped_ranges.end() ? end : std::min(end, std::max(from, range->first));
      if (keep_to > from) sha.Update(piece.subspan(from - begin, keep_to - from));
      from = keep_to;
      if (range != dropped_ranges.end() && from >= range->first)
        from = std::min(end, range->second);
    }
  }
  result.restored_sha256_hex = sha.FinishHex();
  return result;
}

}  // namespace ckpt
