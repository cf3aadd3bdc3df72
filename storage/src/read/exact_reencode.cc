#include "read/exact_reencode.h"

#include <rocksdb/slice.h>

#include "ckpt/codec/lossy_codec.h"

namespace ckpt {

Result<EncodedChunk> ReencodeExactly(const StoreContext& ctx, const std::string& model,
                                     uint64_t seq, uint32_t tensor, uint32_t chunk,
                                     const ManifestTensor& entry, std::span<const uint8_t> target,
                                     std::optional<std::span<const uint8_t>> reference) {
  if (entry.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized)) {
    rocksdb::PinnableSlice value;
    CKPT_RETURN_IF_ERROR(
        ctx.backend->GetChunk(rocksdb::ReadOptions(), model, seq, tensor, chunk, &value)
            .WithContext("model '" + model + "': reading chunk to re-encode"));
    CKPT_ASSIGN_OR_RETURN(const ChunkRecord record, ChunkRecord::DecodeFrom(value.ToStringView()));
    if (record.codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized)) {
      const std::span<const uint8_t> payload(
          reinterpret_cast<const uint8_t*>(record.payload.data()), record.payload.size());
      auto on_lattice = EncodeExactOnLattice(entry.dtype, payload, target, reference);
      if (on_lattice.ok() || on_lattice.status().code() != StatusCode::kFailedPrecondition) {
        return on_lattice;
      }
    }
  }
  return ctx.codec->Encode(entry.dtype, target, reference);
}

}  // namespace ckpt
