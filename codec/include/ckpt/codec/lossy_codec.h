// Error-bounded lossy codecs for float tensors.
//
// Guarantee: for every element x of a chunk encoded with absolute bound e, the decoded element
// r (in the chunk's own dtype) satisfies |x - r| <= e (with a pointwise bound: |x - r| <= e|x|,
// or max(e|x|, the drop floor) under LossyCodecOptions::zero_below_mean); NaN and ±Inf decode
// bit-exactly. The
// encoder checks every element against the decoder's exact output and stores any element that
// would miss the bound verbatim (an "exact" element), so the bound holds by construction, for
// keyframes and deltas alike, whatever the values.
//
// Closed loop: a delta is taken against the reference the caller passes, which must be the
// previous *reconstruction* (EncodedChunk::reconstruction of the previous version), never the
// previous input; then the error of version t is only the quantization error of version t and
// nothing accumulates along a chain. Encoder and decoder share one reconstruction function, so
// they agree to the bit.
//
// Payloads record the quantizer, the bound and the step they were written with; decoding needs
// no options (CodecForDecoding(CodecId::kLossyQuantized)).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "ckpt/codec/tensor_codec.h"

namespace ckpt {

// The quantizer of a lossy payload. Persisted in payloads: never change a value.
enum class Quantizer : uint8_t {
  kAuto = 0,      // choose per chunk by estimated size (never stored)
  kUniform = 1,   // error-bounded lattice of pitch 2 * bound (QD-Compressor, Delta-DNN)
  kExponent = 2,  // sign + binary exponent buckets (LC-Checkpoint)
  kFloat = 3,     // low-bit float after per-chunk scaling (OMC)
  kCosine = 4,    // cosine levels, finer for large magnitudes (CosSGD)
  kLog = 5,       // lattice on log2|x| for pointwise-relative bounds (the only one they use)
};

std::string_view QuantizerName(Quantizer q);
std::optional<Quantizer> QuantizerFromName(std::string_view name);

// The error bound of a tensor. Relative bounds are relative to the value range (max - min of
// the finite values) of the tensor in the version being encoded; the codec applies them per
// chunk with the chunk's range, which is never larger than the tensor's, so the tensor-wide
// guarantee holds. Pointwise bounds are relative to each element: |x - r| <= value * |x| (zeros
// restore exactly, signs never change); they suit values spanning many orders of magnitude,
// such as Adam's moments, and always use Quantizer::kLog.
struct ErrorBound {
  enum class Kind : uint8_t { kAbsolute = 1, kRelative = 2, kPointwise = 3 };
  Kind kind = Kind::kAbsolute;
  double value = 0;

  friend bool operator==(const ErrorBound&, const ErrorBound&) = default;
};

// The machine code a lossy codec runs: the vector kernels the CPU has (AVX2 and FMA where
// present) or their portable twins, which write and read the same bytes and are slower.
enum class LossyKernels : uint8_t { kFastest, kPortable };

struct LossyCodecOptions {
  Quantizer quantizer = Quantizer::kAuto;
  ErrorBound bound;
  // kFloat's format: exponent bits (1..8, 0 = 4) and mantissa bits (0 = the fewest that meet
  // the bound for the largest deltas). E + M <= 16.
  uint8_t float_exponent_bits = 0;
  uint8_t float_mantissa_bits = 0;
  // Reclaimable coding (the policy's "reclaimable"), uniform quantizer: reconstructions are
  // points of a fixed lattice, fl(k * step) for an integer k, rather than the reference plus a
  // move, so a version's lattice points depend on its own values and not on the chain that led to
  // it (their lowest three mantissa bits carry the element history, as in other payloads of large
  // F32/F64 chunks). Garbage collection can then re-encode a kept version against any other version
  // exactly and cheaply (EncodeExactOnLattice). Other quantizers ignore it.
  bool reclaimable = false;
  // Element history (every quantizer but log): in F32/F64 chunks of at least 4096 elements, each
  // reconstruction carries in its lowest three mantissa bits how its element moved in earlier
  // versions, and a delta's symbols are coded in that context (smaller deltas on training runs:
  // docs/decisions.md). false: deltas on the lattice code order-0, others in the context of the
  // two previous symbols. An exact re-encoding of a lattice version with history must carry every
  // element's state too (a few bits per element for a keyframe, less for a delta), so storage turns
  // history off on the lattice for models whose retention rules delete versions.
  bool history = true;
  // Low-rank shift of the lattice (the policy's "low_rank"): when set, a lattice delta with element
  // history of an F32 or F64 chunk that is a matrix of this many columns (its length a multiple of
  // it, at least 16 x 16) may shift each element's lattice by a low-rank matrix fitted to the delta
  // and sent as small integer factors (docs/format.md, "Low-rank shift"), when that is estimated to
  // be smaller. The reconstructions then lie on a lattice 64 times finer, which exact re-encodings
  // keep. 0: chunks are coded flat.
  uint32_t low_rank_columns = 0;
  // The drop rule (pointwise bounds, keyframes): finite non-zero elements with |x| <= this
  // factor times the mean |x| of the chunk's finite elements restore as +0; the others keep the
  // pointwise bound. So every element meets |x - r| <= max(eps |x|, factor * mean |x|). For
  // tensors whose small entries matter little and change completely between versions, such
  // as Adam's first moment (ExCP drops momentum below 2 x its mean the same way). Deltas ignore
  // it (their symbol 0 is "unchanged"). 0: off.
  double zero_below_mean = 0;
  // Which kernels Encode and Decode of this codec run; the bytes are the same either way (tests
  // run both on one machine). Not part of a policy and never stored.
  LossyKernels kernels = LossyKernels::kFastest;

  friend bool operator==(const LossyCodecOptions&, const LossyCodecOptions&) = default;
};

// True for the dtypes the lossy codecs quantize (F64, F32, F16, BF16). Other dtypes are always
// stored losslessly.
bool LossyCodecSupports(DType dtype);

// A lossy codec with fixed options; Encode fails with InvalidArgument for unsupported dtypes.
// Immutable, safe for concurrent use.
std::unique_ptr<TensorCodec> NewLossyCodec(const LossyCodecOptions& options);

// Exact re-encoding, for garbage collection. `original` is a stored lossy payload and `target`
// its reconstruction (what it decodes to). Returns a chunk that decodes against `reference`
// (none: a keyframe) to exactly `target`, bit for bit: a lattice payload with the original's
// step and bound (elements off that lattice verbatim), or a lossless one when that is smaller.
// The cost is small when `target` and `reference` are both lattice reconstructions: the
// payload then holds the lattice moves between them (and, with element history, each element's
// history state, mostly predictable). FailedPrecondition when `original` is not
// a uniform-quantizer payload (there is no lattice to re-encode on); DataLoss when it cannot
// be parsed. `kernels` as in LossyCodecOptions.
Result<EncodedChunk> EncodeExactOnLattice(DType dtype, std::span<const uint8_t> original,
                                          std::span<const uint8_t> target,
                                          std::optional<std::span<const uint8_t>> reference,
                                          LossyKernels kernels = LossyKernels::kFastest);

// Whether `payload` (a lossy payload coded elsewhere: a client's, in an encoded push) could have
// been written by a lossy codec with `options` for a chunk of `elements` elements of `dtype`,
// as a delta or a keyframe, by its header: the dtype, the element count and the frame kind, the
// quantizer (the one the options name, kLog under a pointwise bound), an absolute bound no
// larger than the options', and element history or a low-rank shift only where the options allow
// them. Fills `info` with the header's quantizer, bound and exact elements. InvalidArgument naming
// the difference; DataLoss when the header cannot be parsed.
Status CheckLossyPayloadFollows(const LossyCodecOptions& options, DType dtype, uint64_t elements,
                                bool delta, std::span<const uint8_t> payload,
                                ChunkCodingInfo* info);

// Whether a stored lossy payload's reconstruction is a point of its lattice and nothing more:
// a uniform-quantizer lattice payload without element-history state or a low-rank shift. Such
// a reconstruction does not depend on the chain that led to it, so EncodeExactOnLattice
// re-encodes it against any other on the same lattice, in either direction, at the cost of one
// delta. DataLoss when the payload's header cannot be parsed.
Result<bool> LossyPayloadIsPlainLattice(std::span<const uint8_t> payload);

}  // namespace ckpt
