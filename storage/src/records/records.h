// The records ckptd persists in RocksDB, each with EncodeTo/DecodeFrom and (all but TagRecord) a
// leading format version byte. Byte layouts are documented in docs/format.md. Written to disk:
// fields may be appended under a new format version, never reordered or reinterpreted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/chunk_grid.h"
#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/chunk_record.h"
#include "ckpt/codec/tensor_codec.h"
#include "ckpt/storage/codec_policy.h"

namespace ckpt {

// A record's encoding as a value of its own.
template <typename Record>
std::string Encoded(const Record& record) {
  std::string out;
  record.EncodeTo(&out);
  return out;
}

// models family, key "<model>". Format 2 appended retention_json (format 1: none set).
struct ModelRecord {
  static constexpr uint8_t kFormatVersion = 2;
  int64_t created_at_ms = 0;
  std::string policy_json;     // CodecPolicy::ToJson(); empty = server default
  std::string retention_json;  // RetentionPolicy::ToJson(); empty = server default
  uint64_t latest_version = 0;
  bool has_versions = false;
  uint64_t version_count = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;

  void EncodeTo(std::string* out) const;  // appends
  static Result<ModelRecord> DecodeFrom(std::string_view bytes);
};

struct ManifestRecord;

// versions family, key "<model>\0" + u64 version. What a client sees of a version.
// Format 2 appended restored_sha256_hex and lossy; format 1 records decode with the restored
// body equal to the pushed one. Format 3 appended metrics and labels (older: none). Format 4
// appended dropped_tensors (older: none).
struct VersionRecord {
  static constexpr uint8_t kFormatVersion = 4;
  static constexpr uint8_t kKindKeyframe = 1;
  static constexpr uint8_t kKindDelta = 2;
  static constexpr uint8_t kKindMixed = 3;
  uint64_t seq = 0;        // manifest holding the version's data
  uint64_t floor_seq = 0;  // oldest manifest its delta chains reach
  int64_t created_at_ms = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  uint8_t kind = 0;  // 1 keyframe, 2 delta, 3 mixed
  uint32_t tensor_count = 0;
  std::string sha256_hex;                 // of the pushed body
  std::string raw_header;                 // 8-byte length prefix + JSON header, verbatim as pushed
  std::string restored_sha256_hex;        // of the body a restore sends (differs when lossy)
  bool lossy = false;                     // some tensor was quantized
  std::map<std::string, double> metrics;  // pushed with the version (metric.<name>)
  std::map<std::string, std::string> labels;  // pushed with the version (label.<name>)
  // Tensors of the manifest a retention tensor rule dropped (indices, ascending): a restore
  // leaves them out, and raw_header, raw_bytes and restored_sha256_hex describe the body without
  // them.
  std::vector<uint32_t> dropped_tensors;

  void EncodeTo(std::string* out) const;  // appends
  static Result<VersionRecord> DecodeFrom(std::string_view bytes);

  bool Dropped(uint32_t tensor) const {
    return std::binary_search(dropped_tensors.begin(), dropped_tensors.end(), tensor);
  }

  // The kind of a version stored as `manifest`: keyframe, delta, or mixed when its tensors
  // differ (tensors without chunks do not count).
  static uint8_t KindOf(const ManifestRecord& manifest);
};

// One tensor of a manifest: where its chunks are and how to decode them.
struct ManifestTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t byte_size = 0;
  uint64_t chunk_bytes = 0;  // chunk length used (a multiple of the element size)
  uint32_t chunk_count = 0;
  FrameKind kind = FrameKind::kKeyframe;
  uint64_t base_seq = 0;      // for deltas: manifest of the reference
  uint32_t base_tensor = 0;   // for deltas: index of the tensor in the base manifest
  uint64_t keyframe_seq = 0;  // manifest holding this tensor's chain keyframe
  uint32_t chain_length = 0;  // deltas since the keyframe (0 for keyframes)
  // Since format 2: how the tensor was coded in this version (format 1: lossless, zeros).
  uint16_t codec_id = static_cast<uint16_t>(CodecId::kLosslessBytePlanes);
  uint8_t quantizer = 0;        // lossy: the quantizer of the chunks (0 lossless)
  double bound = 0;             // lossy: largest absolute bound applied to a chunk
  uint64_t stored_bytes = 0;    // chunk records of this tensor in this version
  uint64_t keyframe_bytes = 0;  // stored bytes of the chain's keyframe
  uint64_t chain_bytes = 0;     // stored bytes of the deltas since the keyframe, this included
  double entropy_bits = 0;      // lossy: entropy of the coded symbols (ChunkCodingInfo)
  uint64_t exact_elements = 0;  // lossy: elements stored verbatim
  // Since format 4: the tiles the chunks follow, a count per dimension (ChunkGrid); empty when
  // the tensor is one tile (its chunks are runs of its row-major order).
  std::vector<uint32_t> tile_counts;

  // The grid of this tensor's chunks; DataLoss when the fields do not describe one.
  Result<ChunkGrid> Grid() const;

  // Makes this tensor a delta against tensor `tensor` of manifest `seq`, described by `base`:
  // one link further down base's chain. chain_bytes is base's; the caller adds its own bytes.
  void LinkTo(uint64_t seq, uint32_t tensor, const ManifestTensor& base) {
    kind = FrameKind::kDelta;
    base_seq = seq;
    base_tensor = tensor;
    keyframe_seq = base.keyframe_seq;
    chain_length = base.chain_length + 1;
    keyframe_bytes = base.keyframe_bytes;
    chain_bytes = base.chain_bytes;
  }

  // Makes this tensor a keyframe of `stored` bytes in manifest `seq`: a chain of its own.
  void MakeKeyframe(uint64_t seq, uint64_t stored) {
    kind = FrameKind::kKeyframe;
    base_seq = 0;
    base_tensor = 0;
    keyframe_seq = seq;
    chain_length = 0;
    keyframe_bytes = stored;
    chain_bytes = 0;
  }
};

// manifests family, key "<model>\0" + u64 seq. The internal, immutable description of one
// committed push; kept after its version is deleted for as long as later deltas need it.
struct ManifestRecord {
  // Written as format 3 unless a tensor is tiled: stores without tiles stay readable by builds
  // that predate them.
  static constexpr uint8_t kFormatVersion = 4;
  uint64_t version = 0;
  uint64_t floor_seq = 0;
  uint64_t stored_bytes = 0;
  std::vector<ManifestTensor> tensors;  // body order

  void EncodeTo(std::string* out) const;  // appends
  static Result<ManifestRecord> DecodeFrom(std::string_view bytes);
};

// chunks family, key "<model>\0" + u64 seq + u32 tensor + u32 chunk: a ChunkRecord
// (ckpt/codec/chunk_record.h), the format encoded pushes carry too.

// codec_state family, key "<model>". The per-model codec state: which committed manifest the
// next push takes its deltas against. The reconstruction itself is implied by that manifest's
// chunks (decoded on demand, cached in memory), so the state adds no copy of the checkpoint.
// Format 2 appended next_seq; format 1 records decode with next_seq = reference_seq + 1.
struct CodecStateRecord {
  static constexpr uint8_t kFormatVersion = 2;
  uint64_t reference_seq = 0;
  uint64_t reference_floor_seq = 0;  // informational since format 2 (liveness walks chains)
  // The seq the next manifest (push or garbage-collection rebase) gets. Chunks stored under a
  // seq >= next_seq belong to work that never committed and are removed at open.
  uint64_t next_seq = 1;

  void EncodeTo(std::string* out) const;  // appends
  static Result<CodecStateRecord> DecodeFrom(std::string_view bytes);
};

// default family, key storage_keys::AwaitingCompactionKey(model). Stored bytes of the model
// removed since its chunk range was last compacted: the space its next compaction gives back.
// Persisted so that a restart neither forgets that space nor skips the compaction (no record:
// nothing awaits).
struct AwaitingCompactionRecord {
  static constexpr uint8_t kFormatVersion = 1;
  uint64_t bytes = 0;

  void EncodeTo(std::string* out) const;  // appends
  static Result<AwaitingCompactionRecord> DecodeFrom(std::string_view bytes);
};

// tags family, key "<model>\0<tag>". The version a tag names as 8 bytes, big-endian, without a
// format byte: the layout predates them, and a later layout must differ in length.
struct TagRecord {
  static constexpr int kEncodedBytes = 8;
  uint64_t version = 0;

  void EncodeTo(std::string* out) const;  // appends
  static Result<TagRecord> DecodeFrom(std::string_view bytes);
};

}  // namespace ckpt
