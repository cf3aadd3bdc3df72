// Exact re-encoding of stored chunks: what garbage collection's rebases and the rearrangement
// of a model's newest versions write in place of a chunk, restoring to the same bytes, and the
// deltas encoded pulls send followers whose version the chains do not run through.
//
// Thread-safe: reads only (the chunk's stored payload, through the backend).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ckpt/base/status.h"
#include "ckpt/codec/tensor_codec.h"
#include "context/store_context.h"
#include "records/records.h"

namespace ckpt {

// An encoding of `target` — the reconstruction of chunk `chunk` of tensor `tensor` of manifest
// `seq`, described by `entry` — that decodes against `reference` (none: a keyframe) to exactly
// `target`: on the lattice of its stored payload when it has one (a lossy tensor coded on the
// lattice re-encodes at about the cost of one delta), otherwise losslessly.
Result<EncodedChunk> ReencodeExactly(const StoreContext& ctx, const std::string& model,
                                     uint64_t seq, uint32_t tensor, uint32_t chunk,
                                     const ManifestTensor& entry, std::span<const uint8_t> target,
                                     std::optional<std::span<const uint8_t>> reference);

}  // namespace ckpt
