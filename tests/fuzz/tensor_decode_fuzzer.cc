// Fuzzes every codec's decoder with arbitrary payloads: corrupt payloads must yield DataLoss,
// never a crash, an out-of-bounds access or another error. Decoded payloads must decode the
// same way through the chain decoder, and a lossy payload re-encoded exactly
// (EncodeExactOnLattice, what garbage collection does) must decode to the same bits.
//
// Input: codec id (1 byte: even = lossless, odd = lossy, 0xff = an unknown id), dtype (1 byte),
// element count (2 bytes, at most 8192: element history needs chunks of 4096), frame (1 byte:
// even = keyframe, odd = delta), then for a delta the reference (count elements), then the
// payload (the rest).
#include <cstring>
#include <optional>
#include <vector>

#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "fuzz_support.h"

using namespace ckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const uint8_t codec_byte = in.Byte();
  const uint16_t codec_id =
      codec_byte == 0xff ? uint16_t{77}
                         : static_cast<uint16_t>(codec_byte % 2 == 0 ? CodecId::kLosslessBytePlanes
                                                                     : CodecId::kLossyQuantized);
  const auto dtype_tag = static_cast<uint8_t>(in.Byte() % 15 + 1);
  const DType dtype = *DTypeFromTag(dtype_tag);
  const size_t count = in.U16() % 8193;
  const bool delta = in.Byte() % 2 == 1;
  const size_t length = count * DTypeSize(dtype);
  std::vector<uint8_t> reference;
  if (delta) {
    const auto taken = in.Take(length);
    reference.assign(taken.begin(), taken.end());
    reference.resize(length);  // a short input: zeros
  }
  const auto payload = in.Rest();

  auto codec = CodecForDecoding(codec_id);
  if (!codec.ok()) {
    fuzz::CheckStatusIn(codec.status(), {StatusCode::kDataLoss}, "CodecForDecoding");
    return 0;
  }
  std::optional<std::span<const uint8_t>> ref;
  if (delta) ref = std::span<const uint8_t>(reference);

  std::vector<uint8_t> out(length);
  const Status decoded = (*codec)->Decode(dtype, payload, ref, out);
  fuzz::CheckStatusIn(decoded, {StatusCode::kDataLoss}, "Decode");

  // The chain decoder reads the same payload the same way.
  std::unique_ptr<ChainDecoder> chain = (*codec)->NewChainDecoder(dtype, length);
  Status chained = delta ? chain->StartFromDecoded(reference) : chain->StartFromKeyframe(payload);
  if (chained.ok() && delta) chained = chain->ApplyDelta(payload);
  std::vector<uint8_t> chain_out;
  if (chained.ok()) chained = chain->Finish(&chain_out);
  fuzz::CheckStatusIn(chained, {StatusCode::kDataLoss}, "ChainDecoder");
  if (!decoded.ok()) return 0;
  fuzz::Check(chained.ok(), "the chain decoder refused a payload Decode accepted");
  fuzz::Check(chain_out == out, "the chain decoder and Decode disagree");

  // Garbage collection's exact re-encoding of a decodable lossy payload.
  if (codec_id == static_cast<uint16_t>(CodecId::kLossyQuantized)) {
    auto exact = EncodeExactOnLattice(dtype, payload, out, ref);
    fuzz::CheckStatusIn(exact.status(), {StatusCode::kFailedPrecondition, StatusCode::kDataLoss},
                        "EncodeExactOnLattice");
    if (exact.ok()) {
      auto recodec = CodecForDecoding(static_cast<uint16_t>(exact->codec_id));
      fuzz::Check(recodec.ok(), "EncodeExactOnLattice chose an unknown codec");
      std::vector<uint8_t> again(length);
      const std::span<const uint8_t> repayload(
          reinterpret_cast<const uint8_t*>(exact->payload.data()), exact->payload.size());
      const Status redecoded = (*recodec)->Decode(dtype, repayload, ref, again);
      fuzz::Check(redecoded.ok(), "an exact re-encoding does not decode");
      fuzz::Check(again == out, "an exact re-encoding decodes to other bits");
    }
  }
  return 0;
}
