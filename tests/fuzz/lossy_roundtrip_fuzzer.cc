// Fuzzes the lossy encoder with chains of versions an input describes, under every codec option
// a policy can set. Every version must encode; its payload must decode (Decode, and the chain
// decoder over the whole chain) to exactly the reconstruction the encoder returned; that
// reconstruction must keep the guarantee against the pushed values (finite elements within the
// bound in their own dtype, NaN and ±Inf bit-exact, zeros exact under a pointwise bound); and
// garbage collection's exact re-encodings of a version (as a keyframe, and against the version
// before the one it was coded against) must decode to the same bits.
//
// Input: options (5 bytes: dtype, bound kind, lattice and history flags; quantizer, float
// format and matrix columns; float mantissa bits or, for pointwise bounds, the drop rule's
// factor; the bound), element count (2 bytes, at most 8192: element history
// needs chunks of 4096), versions (1 byte, 1..4), then per version a mode byte:
//   mode % 4 == 0  the elements' raw bytes from the input (cycled when the input runs short)
//   mode % 4 == 1  the previous version plus a drift of a few bounds (seed and scale: 5 bytes)
//   mode % 4 == 2  the previous version scaled by 2^k, then drifted (k, seed and scale: 6 bytes)
//   mode % 4 == 3  the previous version unchanged
// then, for every mode, a count byte and that many (u16 index, kind) special values written over
// elements: NaN, ±Inf, ±0, the smallest denormal, the largest finite value of the dtype.
// Policy changes: when the first options byte has bit 7 set, a later version whose mode byte has
// bit 7 set reads 5 more option bytes right after it (the dtype bits ignored) and is encoded, as
// every version after it, with those options against the reconstruction the old ones made — what
// a policy change between two pushes does.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "fuzz_support.h"
#include "test_support.h"

using namespace ckpt;

namespace {

using Bytes = std::vector<uint8_t>;

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

double Load(DType dtype, const uint8_t* p) {
  return testing::LoadFloat(dtype, reinterpret_cast<const char*>(p));
}

uint16_t Bits16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

void SetBits16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// Stores `v` as an element of `dtype`: F64 and F32 by rounding, BF16 by rounding to nearest even
// through float. F16 is moved in the bit domain instead (`v` is ignored; see Drift).
void Store(DType dtype, double v, uint8_t* p) {
  if (dtype == DType::kF64) {
    std::memcpy(p, &v, 8);
  } else if (dtype == DType::kF32) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
  } else if (dtype == DType::kBF16) {
    const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
    SetBits16(p, std::isnan(v) ? uint16_t{0x7fc0}
                               : static_cast<uint16_t>((bits + 0x7fff + (bits >> 16 & 1)) >> 16));
  }
}

// Moves every element of `x` by a normal drift of `scale` (F16: by a normal number of units in
// the last place, `scale` of them), as training moves weights between checkpoints.
void Drift(DType dtype, double scale, uint32_t seed, Bytes& x) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  const size_t size = DTypeSize(dtype);
  for (size_t i = 0; i < x.size() / size; ++i) {
    uint8_t* p = x.data() + i * size;
    if (dtype == DType::kF16) {
      SetBits16(
          p, static_cast<uint16_t>(Bits16(p) + static_cast<int>(std::lround(normal(rng) * scale))));
    } else {
      Store(dtype, Load(dtype, p) + normal(rng) * scale, p);
    }
  }
}

void Rescale(DType dtype, int k, Bytes& x) {
  const size_t size = DTypeSize(dtype);
  for (size_t i = 0; i < x.size() / size; ++i) {
    uint8_t* p = x.data() + i * size;
    if (dtype == DType::kF16) {
      // Shift the exponent field by k (clamped to the finite range) where the element is normal.
      const uint16_t h = Bits16(p);
      const int e = h >> 10 & 0x1f;
      if (e != 0 && e != 0x1f) {
        SetBits16(p, static_cast<uint16_t>((h & 0x83ff) | std::clamp(e + k, 1, 30) << 10));
      }
    } else {
      Store(dtype, std::ldexp(Load(dtype, p), k), p);
    }
  }
}

void WriteSpecial(DType dtype, uint8_t kind, uint8_t* p) {
  if (dtype == DType::kF16) {
    constexpr uint16_t kHalves[] = {0x7e00, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x7bff, 0xfbff};
    SetBits16(p, kHalves[kind % 8]);
    return;
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double max =
      dtype == DType::kF64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  const double denorm = dtype == DType::kF64 ? std::numeric_limits<double>::denorm_min()
                                             : std::numeric_limits<float>::denorm_min();
  const double values[] = {
      std::numeric_limits<double>::quiet_NaN(), kInf, -kInf, 0.0, -0.0, denorm, max, -max};
  if (dtype == DType::kBF16 && kind % 8 >= 5) {
    constexpr uint16_t kBf[] = {0x0001, 0x7f7f, 0xff7f};
    SetBits16(p, kBf[kind % 8 - 5]);
    return;
  }
  Store(dtype, values[kind % 8], p);
}

// The bound the encoder promised for `x` (ResolveBound's arithmetic for relative bounds).
double AllowedError(const ErrorBound& bound, DType dtype, const Bytes& x) {
  if (bound.kind != ErrorBound::Kind::kRelative) return bound.value;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  const size_t size = DTypeSize(dtype);
  for (size_t i = 0; i < x.size() / size; ++i) {
    const double v = Load(dtype, x.data() + i * size);
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (!(hi >= lo)) return 0;
  return bound.value * (hi - lo);
}

// The drop rule's floor: zero_below_mean times the mean |x| of the finite elements, with room
// for the last bits of the encoder's long double sum.
double DropFloor(const LossyCodecOptions& options, DType dtype, const Bytes& x) {
  if (options.zero_below_mean <= 0) return 0;
  long double sum = 0;
  size_t count = 0;
  const size_t size = DTypeSize(dtype);
  for (size_t i = 0; i < x.size() / size; ++i) {
    const double v = Load(dtype, x.data() + i * size);
    if (std::isfinite(v)) sum += std::abs(v), ++count;
  }
  if (count == 0) return 0;
  return options.zero_below_mean * static_cast<double>(sum / count) * (1 + 1e-12);
}

void CheckGuarantee(const LossyCodecOptions& options, DType dtype, const Bytes& pushed,
                    const Bytes& restored) {
  const ErrorBound& bound = options.bound;
  fuzz::Check(pushed.size() == restored.size(), "the reconstruction has another length");
  const double allowed = AllowedError(bound, dtype, pushed);
  const double floor = DropFloor(options, dtype, pushed);
  const size_t size = DTypeSize(dtype);
  for (size_t i = 0; i < pushed.size() / size; ++i) {
    const uint8_t* p = pushed.data() + i * size;
    const uint8_t* r = restored.data() + i * size;
    const double x = Load(dtype, p), y = Load(dtype, r);
    const bool same = std::memcmp(p, r, size) == 0;
    if (!std::isfinite(x)) {
      fuzz::Check(same, "a non-finite element did not restore bit-exactly");
      continue;
    }
    if (bound.kind == ErrorBound::Kind::kPointwise) {
      if (x == 0) fuzz::Check(same, "a zero did not restore exactly under a pointwise bound");
      if (y == 0 && x != 0 && std::abs(x) <= floor) {
        fuzz::Check(!std::signbit(y), "the drop rule restored -0.0");
        continue;
      }
      fuzz::Check(std::abs(x - y) <= bound.value * std::abs(x), "pointwise bound broken");
    } else {
      fuzz::Check(std::abs(x - y) <= allowed, "error bound broken");
    }
  }
}

// A bound of `kind` inside the range a policy accepts: absolute (0, 1e300], relative (0, 1],
// pointwise (0, 0.5]; from the tiniest to the largest.
ErrorBound BoundFrom(ErrorBound::Kind kind, uint8_t mantissa, uint8_t exponent) {
  const double m = 1.0 + mantissa / 256.0;
  switch (kind) {
    case ErrorBound::Kind::kAbsolute:
      if (exponent == 0xff) return {kind, 1e300};
      if (exponent == 0xfe) return {kind, std::numeric_limits<double>::denorm_min()};
      return {kind, m * std::ldexp(1.0, exponent % 200 - 150)};
    case ErrorBound::Kind::kRelative:
      return {kind, std::min(1.0, m * std::ldexp(1.0, -(exponent % 64)))};
    default:
      return {kind, std::min(0.5, m * std::ldexp(1.0, -1 - exponent % 48))};
  }
}

// Codec options from 5 input bytes: flags (bits 2-7 the bound kind modulo 3, 0x20 lattice,
// 0x40 history), quantizer (byte % 5), float exponent bits (byte / 5 % 9) and matrix columns
// (byte / 45: none, 16, 64, 17, 128, 256 — low-rank lattice deltas where the count divides),
// float mantissa bits, the bound.
LossyCodecOptions ReadOptions(fuzz::InputReader& in) {
  const uint8_t flags = in.Byte();
  const uint8_t quantizer_byte = in.Byte();
  const uint8_t mantissa_byte = in.Byte();
  const uint8_t bound_mantissa = in.Byte();
  const uint8_t bound_exponent = in.Byte();
  constexpr ErrorBound::Kind kKinds[] = {ErrorBound::Kind::kAbsolute, ErrorBound::Kind::kRelative,
                                         ErrorBound::Kind::kPointwise};
  LossyCodecOptions options;
  options.bound = BoundFrom(kKinds[(flags >> 2) % 3], bound_mantissa, bound_exponent);
  options.reclaimable = flags & 0x20;
  options.history = flags & 0x40;
  constexpr Quantizer kQuantizers[] = {Quantizer::kAuto, Quantizer::kUniform, Quantizer::kExponent,
                                       Quantizer::kFloat, Quantizer::kCosine};
  // As a policy compiles: the log quantizer exactly for pointwise bounds.
  options.quantizer = options.bound.kind == ErrorBound::Kind::kPointwise
                          ? Quantizer::kLog
                          : kQuantizers[quantizer_byte % 5];
  options.float_exponent_bits = static_cast<uint8_t>(quantizer_byte / 5 % 9);  // 0 = auto
  constexpr uint32_t kColumns[] = {0, 16, 64, 17, 128, 256};
  options.low_rank_columns = kColumns[quantizer_byte / 45];
  if (options.float_exponent_bits != 0) {
    options.float_mantissa_bits =
        static_cast<uint8_t>(mantissa_byte % (17 - options.float_exponent_bits));
  }
  // Pointwise bounds have no float format: the byte sets the drop rule's factor (0: off).
  if (options.bound.kind == ErrorBound::Kind::kPointwise) {
    options.zero_below_mean = mantissa_byte / 32.0;
  }
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const uint8_t flags = size > 0 ? data[0] : 0;
  constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};
  const DType dtype = kDTypes[flags & 3];
  const bool policy_changes = flags & 0x80;
  LossyCodecOptions options = ReadOptions(in);

  const size_t count = in.U16() % 8193;
  const size_t versions = in.Byte() % 4 + 1;
  const size_t element = DTypeSize(dtype);
  const size_t length = count * element;
  auto codec = NewLossyCodec(options);

  Bytes current(length);
  std::vector<Bytes> reconstructions;
  std::vector<std::string> payloads;
  bool one_codec = true;  // every payload is the lossy codec's (the chain decoder needs that)
  for (size_t v = 0; v < versions; ++v) {
    const uint8_t mode_byte = in.Byte();
    const uint8_t mode = mode_byte % 4;
    if (v > 0 && policy_changes && (mode_byte & 0x80)) {
      options = ReadOptions(in);
      codec = NewLossyCodec(options);
    }
    if (mode == 0 || v == 0) {
      const auto raw = in.Take(length);
      for (size_t i = 0; i < length; ++i) current[i] = raw.empty() ? 0 : raw[i % raw.size()];
    } else if (mode == 1 || mode == 2) {
      if (mode == 2) Rescale(dtype, static_cast<int>(in.Byte() % 41) - 20, current);
      const uint32_t seed = in.U16() | uint32_t{in.U16()} << 16;
      const int scale_exponent = static_cast<int>(in.Byte() % 24) - 12;
      const double unit = options.bound.kind == ErrorBound::Kind::kAbsolute
                              ? options.bound.value
                              : options.bound.value * 0.05;
      const double scale = dtype == DType::kF16 ? std::ldexp(1.0, scale_exponent % 12 + 1)
                                                : std::ldexp(unit, scale_exponent);
      Drift(dtype, scale, seed, current);
    }
    const size_t specials = in.Byte() % 16;
    for (size_t s = 0; s < specials && count > 0; ++s) {
      const size_t index = in.U16() % count;
      WriteSpecial(dtype, in.Byte(), current.data() + index * element);
    }

    std::optional<std::span<const uint8_t>> reference;
    if (v > 0) reference = std::span<const uint8_t>(reconstructions.back());
    auto encoded = codec->Encode(dtype, current, reference);
    fuzz::CheckStatusIn(encoded.status(), {}, "Encode");
    const Bytes reconstruction =
        encoded->reconstruction_is_input ? current : encoded->reconstruction;
    CheckGuarantee(options, dtype, current, reconstruction);

    auto decoder = CodecForDecoding(static_cast<uint16_t>(encoded->codec_id));
    fuzz::Check(decoder.ok(), "the encoder named an unknown codec");
    Bytes decoded(length);
    const Status status = (*decoder)->Decode(dtype, AsBytes(encoded->payload), reference, decoded);
    fuzz::CheckStatusIn(status, {}, "Decode of a fresh payload");
    fuzz::Check(decoded == reconstruction, "the decoder and the encoder's reconstruction differ");

    if (encoded->codec_id == CodecId::kLossyQuantized) {
      // Garbage collection's rebases: this version as a keyframe, and against the version
      // before its reference (the reference deleted).
      std::optional<std::span<const uint8_t>> rebase_references[] = {std::nullopt, std::nullopt};
      if (v >= 2) rebase_references[1] = std::span<const uint8_t>(reconstructions[v - 2]);
      for (const auto& rebase_reference : rebase_references) {
        auto exact = EncodeExactOnLattice(dtype, AsBytes(encoded->payload), reconstruction,
                                          rebase_reference);
        fuzz::CheckStatusIn(exact.status(), {StatusCode::kFailedPrecondition},
                            "EncodeExactOnLattice");
        if (!exact.ok()) break;
        auto recodec = CodecForDecoding(static_cast<uint16_t>(exact->codec_id));
        fuzz::Check(recodec.ok(), "EncodeExactOnLattice chose an unknown codec");
        Bytes again(length);
        const Status redecoded =
            (*recodec)->Decode(dtype, AsBytes(exact->payload), rebase_reference, again);
        fuzz::CheckStatusIn(redecoded, {}, "Decode of an exact re-encoding");
        fuzz::Check(again == reconstruction, "an exact re-encoding decodes to other bits");
      }
    } else {
      one_codec = false;
    }
    reconstructions.push_back(reconstruction);
    payloads.push_back(std::move(encoded->payload));
  }

  // The chain decoder replays the whole chain to the last reconstruction.
  if (one_codec) {
    auto lossy = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
    std::unique_ptr<ChainDecoder> chain = (*lossy)->NewChainDecoder(dtype, length);
    Status chained = chain->StartFromKeyframe(AsBytes(payloads[0]));
    for (size_t v = 1; v < payloads.size() && chained.ok(); ++v) {
      chained = chain->ApplyDelta(AsBytes(payloads[v]));
    }
    Bytes out;
    if (chained.ok()) chained = chain->Finish(&out);
    fuzz::CheckStatusIn(chained, {}, "the chain decoder");
    fuzz::Check(out == reconstructions.back(), "the chain decoder ends elsewhere");
  }
  return 0;
}
