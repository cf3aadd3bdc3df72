// The lossy encoder and decoder entry points (internal to codec/; lossy_codec.cc adapts them to
// the TensorCodec interface). Pure functions, safe for concurrent use.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt::lossy {

// TensorCodec::Encode for a lossy codec with `options` (lossy_codec.h states the guarantee).
// InvalidArgument for a dtype the codec does not quantize, a reference of another length, an
// error bound that is negative or not finite.
Result<EncodedChunk> EncodeChunk(const LossyCodecOptions& options, DType dtype,
                                 std::span<const uint8_t> current,
                                 std::optional<std::span<const uint8_t>> reference);

// EncodeExactOnLattice (lossy_codec.h).
Result<EncodedChunk> EncodeChunkExactly(DType dtype, std::span<const uint8_t> original,
                                        std::span<const uint8_t> target,
                                        std::optional<std::span<const uint8_t>> reference);

// TensorCodec::Decode for lossy payloads: DataLoss for anything that is not a payload the
// encoder could have written for this dtype, length and reference.
Status DecodeChunk(DType dtype, std::span<const uint8_t> payload,
                   std::optional<std::span<const uint8_t>> reference, std::span<uint8_t> out);

}  // namespace ckpt::lossy
