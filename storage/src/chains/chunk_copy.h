// Copying a tensor's stored chunk records from one manifest to another, unchanged: what a
// rearrangement or a rebase does with a tensor it need not re-encode.
//
// Thread-compatible: called by the holder of the model's lock.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/base/status.h"
#include "context/store_context.h"

namespace ckpt {

// Copies tensor `tensor`'s chunk records from manifest `from` to manifest `to` unchanged.
Status CopyTensorChunks(const StoreContext& ctx, const std::string& model, uint64_t from,
                        uint64_t to, uint32_t tensor, uint32_t chunk_count);

}  // namespace ckpt
