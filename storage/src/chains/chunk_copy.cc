#include "chains/chunk_copy.h"

#include <rocksdb/slice.h>

namespace ckpt {

Status CopyTensorChunks(const StoreContext& ctx, const std::string& model, uint64_t from,
                        uint64_t to, uint32_t tensor, uint32_t chunk_count) {
  for (uint32_t c = 0; c < chunk_count; ++c) {
    rocksdb::PinnableSlice value;
    CKPT_RETURN_IF_ERROR(
        ctx.backend->GetChunk(rocksdb::ReadOptions(), model, from, tensor, c, &value)
            .WithContext("model '" + model + "': reading chunk to copy"));
    CKPT_RETURN_IF_ERROR(ctx.backend->PutChunk(model, to, tensor, c, value.ToStringView())
                             .WithContext("copying chunk"));
  }
  return Status::Ok();
}

}  // namespace ckpt
