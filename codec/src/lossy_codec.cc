// The lossy codec behind the TensorCodec interface. The codec itself lives in lossy/:
//
//   format.{h,cc}         the payload's byte layout (header, parameters, sections)
//   symbols.h             the symbol alphabet and context models
//   history.h             element history: the state carried in a reconstruction's low bits
//   element.h             loading and storing each float dtype
//   quantizers.h          the five quantizers' arithmetic
//   deterministic_math.*  exp2 and cos with the same bits on every build
//   plan.{h,cc}           how a chunk is coded: every decision the encoder takes
//   quantize.h, quantize_additive.cc, quantize_lattice.cc   the encoder's element loops
//   encoder.cc            plan, quantize, code the symbols, lay out the payload
//   decoder.cc            parse, decode the symbols, reconstruct the elements
//   kernels_sse2.h, kernels_avx2.h   vector kernels, each with a portable twin in the loops
//   kernel_choice.{h,cc}  which of the two a call runs (LossyCodecOptions::kernels)
//   low_rank.{h,cc}       the low-rank shift of the lattice: fit, factors, apply
//   bit_stream.h          the extra-bits stream
//
// Payload layout and the exact decoding arithmetic: docs/format.md.
#include "ckpt/codec/lossy_codec.h"

#include "ckpt/base/binary.h"
#include "lossy/chunk_codec.h"
#include "lossy/format.h"
#include "lossy/kernel_choice.h"

namespace ckpt {
namespace {

class LossyQuantizedCodec final : public TensorCodec {
 public:
  explicit LossyQuantizedCodec(const LossyCodecOptions& options) : options_(options) {}

  CodecId id() const override { return CodecId::kLossyQuantized; }

  Result<EncodedChunk> Encode(DType dtype, std::span<const uint8_t> current,
                              std::optional<std::span<const uint8_t>> reference) const override {
    const lossy::ScopedKernelChoice kernels(options_.kernels);
    return lossy::EncodeChunk(options_, dtype, current, reference);
  }

  Status Decode(DType dtype, std::span<const uint8_t> payload,
                std::optional<std::span<const uint8_t>> reference,
                std::span<uint8_t> out) const override {
    const lossy::ScopedKernelChoice kernels(options_.kernels);
    return lossy::DecodeChunk(dtype, payload, reference, out);
  }

 private:
  const LossyCodecOptions options_;
};

}  // namespace

std::string_view QuantizerName(Quantizer q) {
  switch (q) {
    case Quantizer::kAuto:
      return "auto";
    case Quantizer::kUniform:
      return "uniform";
    case Quantizer::kExponent:
      return "exponent";
    case Quantizer::kFloat:
      return "float";
    case Quantizer::kCosine:
      return "cosine";
    case Quantizer::kLog:
      return "log";
  }
  return "unknown";
}

std::optional<Quantizer> QuantizerFromName(std::string_view name) {
  for (Quantizer q : {Quantizer::kAuto, Quantizer::kUniform, Quantizer::kExponent,
                      Quantizer::kFloat, Quantizer::kCosine, Quantizer::kLog}) {
    if (QuantizerName(q) == name) return q;
  }
  return std::nullopt;
}

bool LossyCodecSupports(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

std::unique_ptr<TensorCodec> NewLossyCodec(const LossyCodecOptions& options) {
  return std::make_unique<LossyQuantizedCodec>(options);
}

Result<EncodedChunk> EncodeExactOnLattice(DType dtype, std::span<const uint8_t> original,
                                          std::span<const uint8_t> target,
                                          std::optional<std::span<const uint8_t>> reference,
                                          LossyKernels kernels) {
  const lossy::ScopedKernelChoice choice(kernels);
  return lossy::EncodeChunkExactly(dtype, original, target, reference);
}

Status CheckLossyPayloadFollows(const LossyCodecOptions& options, DType dtype, uint64_t elements,
                                bool delta, std::span<const uint8_t> payload,
                                ChunkCodingInfo* info) {
  ByteReader in(payload, "lossy payload");
  lossy::PayloadHeader header;
  CKPT_RETURN_IF_ERROR(header.DecodeFrom(&in));
  const auto differs = [](std::string what) {
    return Status::InvalidArgument("the lossy payload's " + what);
  };
  if (header.dtype != dtype) return differs("dtype is not the tensor's");
  if (header.elements != elements) return differs("element count is not the chunk's");
  if (header.delta != delta) return differs("frame kind is not the plan's");
  const Quantizer wanted =
      options.bound.kind == ErrorBound::Kind::kPointwise ? Quantizer::kLog : options.quantizer;
  if (header.quantizer == Quantizer::kAuto ||
      (wanted != Quantizer::kAuto && header.quantizer != wanted)) {
    return differs("quantizer " + std::string(QuantizerName(header.quantizer)) +
                   " is not the plan's " + std::string(QuantizerName(wanted)));
  }
  if (options.bound.kind == ErrorBound::Kind::kAbsolute && !(header.bound <= options.bound.value)) {
    return differs("bound is larger than the plan's");
  }
  if (header.history && !options.history) return differs("element history is not in the plan");
  if (header.low_rank && options.low_rank_columns == 0) {
    return differs("low-rank shift is not in the plan");
  }
  info->quantizer = static_cast<uint8_t>(header.quantizer);
  info->bound = header.bound;
  info->exact_elements = header.exact;
  return Status::Ok();
}

Result<bool> LossyPayloadIsPlainLattice(std::span<const uint8_t> payload) {
  ByteReader in(payload, "lossy payload");
  lossy::PayloadHeader header;
  CKPT_RETURN_IF_ERROR(header.DecodeFrom(&in));
  return header.quantizer == Quantizer::kUniform && header.lattice && !header.history &&
         !header.low_rank;
}

}  // namespace ckpt
