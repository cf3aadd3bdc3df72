// Error-bounded lossy codec: a quantizer (quantizers.h) maps the closed-loop delta of each
// element to a symbol, and the symbols are coded with a context-modelled rANS coder (rans.h).
//
// Per element (x = input, p = reference element, 0 for keyframes): the quantizer proposes a
// symbol z for d = x - p, the reconstruction is r = T(p + V(z)) (sum in double, rounded once to
// the dtype T), and the element is stored verbatim instead when x or p is not finite (unless x
// is bit-identical to p: then z = 0), when |x - r| > bound, when r is a zero of the wrong sign,
// or when r < 0 in a chunk without negative values. The decoder computes T(p + V(z)) the same
// way, so r is bit-identical on both sides. The log quantizer (pointwise-relative bounds) is
// multiplicative instead: r = T(R(z, p)), checked against eps * |x|.
//
// Symbols: z < 32 is its own symbol; larger z are coded as the symbol of their bit length plus
// the bits below the leading one (raw, in a separate bit stream); one symbol marks a verbatim
// element. Lattice payloads (LossyCodecOptions::lattice, uniform only) reconstruct instead
// T((kp + q) * step) from the reference's lattice index kp = round(p / step), so that every
// reconstruction is the lattice point nearest the pushed value whatever the chain. In large
// F32/F64 chunks each reconstruction (lattice point or not) carries a small history state in its
// lowest mantissa bits (how the element moved in earlier versions; see HistoryOf) and a delta's
// symbols are coded in the context of their element's state. Otherwise the context of a symbol
// is the class (zero, ±1, larger) of the two symbols before it, or none (small chunks, lattice
// deltas without history). Large chunks interleave four
// rANS states. The common case of the uniform quantizer on F32 has SSE2 paths in both
// directions (four elements at a time, the same arithmetic); anything else goes element by
// element.
//
// Payload layout (little-endian) and the exact decoding arithmetic: docs/format.md.
#include "ckpt/codec/lossy_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "ckpt/codec/binary.h"
#include "lossy_kernels.h"
#include "low_rank.h"
#include "quantizers.h"
#include "rans.h"

namespace ckpt {
namespace {

using lossy::CosineQuantizer;
using lossy::Element;
using lossy::ElementBits;
using lossy::HistoryFits;
using lossy::HistoryOf;
using lossy::kCanCarryHistory;
using lossy::kDirectSymbols;
using lossy::kHistoryMask;
using lossy::kKeyframeHistory;
using lossy::LatticeHistoryOf;
using lossy::NextHistory;
using lossy::SetHistory;
using lossy::WithHistory;
#if defined(__SSE2__)
using lossy::DecodeFourDirectF32;
using lossy::QuantizeFourF32;
#endif
using lossy::ExponentQuantizer;
using lossy::FloatQuantizer;
using lossy::LogQuantizer;
using lossy::UniformQuantizer;

constexpr uint8_t kPayloadVersion = 1;
// Lattice payloads (kFlagLattice) are version 2, so that a release that predates them refuses
// them instead of decoding them by the additive rule.
constexpr uint8_t kPayloadVersionLattice = 2;
// Lattice payloads with element history (kFlagLattice | kFlagHistory) are version 3, for the
// same reason.
constexpr uint8_t kPayloadVersionLatticeHistory = 3;
// Lattice deltas with a low-rank shift (kFlagLattice | kFlagLowRank) are version 4.
constexpr uint8_t kPayloadVersionLowRank = 4;
constexpr uint8_t kContextModelPrevious2 = 1;  // 9 contexts: classes of the two previous symbols
constexpr uint8_t kContextModelNone = 2;       // 1 context, for small chunks (tables cost less)
constexpr uint8_t kContextModelHistory = 3;    // 8 contexts: the element's history state (below)
constexpr uint8_t kFlagDelta = 1;
constexpr uint8_t kFlagHistory = 2;  // reconstructions carry their history state in their low bits
constexpr uint8_t kFlagFourStates = 4;  // the rANS stream interleaves four states
constexpr uint8_t kFlagLattice = 8;     // uniform: reconstructions are lattice points (below)
// Lattice with history: every element's history state is coded explicitly (exact re-encodings).
constexpr uint8_t kFlagExplicitHistory = 16;
// Lattice delta whose lattice is shifted by a low-rank matrix (QuantizeLowRankElements).
constexpr uint8_t kFlagLowRank = 32;
// The low-rank lattice: pitch step / kLowRankFine, moves of kLowRankFine pitches.
constexpr double kLowRankFine = 64;
// Matrices smaller than this on either side are coded flat.
constexpr uint32_t kMinLowRankSide = 16;
// The ranks the encoder compares with the plain lattice (multiples of 8 up to this), and the
// rows it compares them on (an unshifted fine lattice, rank 0, never paid on training runs).
constexpr uint32_t kLowRankMaxRank = 16;
constexpr uint32_t kLowRankSampleRows = 32;
constexpr uint32_t kContexts = 9;
constexpr uint32_t kHistoryContexts = 8;
// Chunks with fewer elements use kContextModelNone.
constexpr size_t kMinElementsForContexts = 4096;
// auto: candidates are compared on about this many elements spread over the chunk.
constexpr size_t kAutoSampleElements = 1024;

constexpr uint32_t ContextCount(uint8_t context_model) {
  return context_model == kContextModelPrevious2 ? kContexts
         : context_model == kContextModelHistory ? kHistoryContexts
                                                 : 1;
}

constexpr uint32_t kFirstBucketBits = 6;  // bit length of the smallest bucketed value (32)
constexpr uint32_t kMaxBucketBits = 63;
constexpr uint8_t kExactSymbol = kDirectSymbols + (kMaxBucketBits - kFirstBucketBits) + 1;
static_assert(kExactSymbol < rans::kMaxSymbols);

// The class of a symbol for context modelling: 0 (unchanged), 1 (±1 step), 2 (larger or
// verbatim). The context of a symbol is class(previous) * 3 + class(the one before).
inline uint32_t ClassOf(uint8_t symbol) { return symbol == 0 ? 0 : symbol <= 2 ? 1 : 2; }

// The symbol of a quantized value z (z < 32 itself, else its bit-length bucket).
inline uint8_t SymbolOf(uint64_t z, uint32_t* extra_bits) {
  if (z < kDirectSymbols) {
    *extra_bits = 0;
    return static_cast<uint8_t>(z);
  }
  const uint32_t bits = static_cast<uint32_t>(std::bit_width(z));
  *extra_bits = bits - 1;
  return static_cast<uint8_t>(kDirectSymbols + bits - kFirstBucketBits);
}

}  // namespace

namespace lossy {

double DeterministicExp2(double y) {
  if (!(y > -1100)) return 0.0;
  if (!(y < 1100)) return std::numeric_limits<double>::infinity();
  const double i = std::floor(y);
  const double u = (y - i) * 0.69314718055994530942;  // in [0, ln 2)
  // e^u = sum u^k / k!, k <= 18 (truncation error < 2e-19 for u < ln 2), by Horner's rule.
  double sum = 1.0 / 6402373705728000.0;  // 1/18!
  double factorial = 6402373705728000.0;
  for (int k = 17; k >= 0; --k) {
    factorial /= static_cast<double>(k + 1);  // k! exactly (all are exact in double up to 18!)
    sum = sum * u + 1.0 / factorial;
  }
  return std::ldexp(sum, static_cast<int>(i));
}

double DeterministicCos(double x) {
  // Reduce to t in [0, pi/4] with cos or sin by symmetry, then Taylor polynomials (degree 20 and
  // 21, error < 1e-19 there) evaluated by Horner's rule in a fixed order.
  const double pi = 3.14159265358979323846;
  double sign = 1;
  if (x > pi / 2) {
    x = pi - x;
    sign = -1;
  }
  static constexpr double kCos[] = {1.0,
                                    -1.0 / 2,
                                    1.0 / 24,
                                    -1.0 / 720,
                                    1.0 / 40320,
                                    -1.0 / 3628800,
                                    1.0 / 479001600,
                                    -1.0 / 87178291200.0,
                                    1.0 / 20922789888000.0,
                                    -1.0 / 6402373705728000.0,
                                    1.0 / 2432902008176640000.0};
  static constexpr double kSin[] = {1.0,
                                    -1.0 / 6,
                                    1.0 / 120,
                                    -1.0 / 5040,
                                    1.0 / 362880,
                                    -1.0 / 39916800,
                                    1.0 / 6227020800.0,
                                    -1.0 / 1307674368000.0,
                                    1.0 / 355687428096000.0,
                                    -1.0 / 121645100408832000.0,
                                    1.0 / 51090942171709440000.0};
  auto horner = [](const double* c, double t2) {
    double sum = c[10];
    for (int k = 9; k >= 0; --k) sum = sum * t2 + c[k];
    return sum;
  };
  if (x <= pi / 4) return sign * horner(kCos, x * x);
  const double t = pi / 2 - x;
  return sign * (t * horner(kSin, t * t));
}

}  // namespace lossy

namespace {

// |x - r| <= bound, decided exactly: the double subtraction may round, so a difference that
// rounds to exactly `bound` only passes if the subtraction was exact.
inline bool WithinBound(double x, double r, double bound) {
  const double d = x - r;
  const double a = std::abs(d);
  if (a < bound) return true;
  if (a > bound) return false;
  const double rb = d - x;  // TwoSum(x, -r): the rounding error of d is zero iff exact
  const double err = (x - (d - rb)) + (-r - rb);
  return err == 0;
}

// eps * |x| rounded down, so that a check against it never passes an element the exact bound
// would not: fl(eps|x|) exceeds the product by at most a factor 1 + 2^-53, and the factor
// 1 - 2^-51 (rounded) takes it below; subnormal products step down one unit instead.
inline double PointwiseBound(double eps, double x) {
  const double b = eps * std::abs(x);
  return b > 0x1p-1000 ? b * (1 - 0x1p-51) : std::nextafter(b, 0.0);
}

// Raw bits, least significant first, packed from the low bit of each byte up.
class BitWriter {
 public:
  void Put(uint64_t value, uint32_t bits) {
    if (bits > 32) {  // keeps fill_ + bits within the 64-bit accumulator
      Put(value & 0xffffffffu, 32);
      Put(value >> 32, bits - 32);
      return;
    }
    acc_ |= (value & ((uint64_t{1} << bits) - 1)) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      out_.push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  std::string Finish() {
    if (fill_) out_.push_back(static_cast<char>(acc_));
    fill_ = 0;
    acc_ = 0;
    return std::move(out_);
  }

 private:
  std::string out_;
  uint64_t acc_ = 0;  // fill_ (< 8 between calls) pending bits
  uint32_t fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // Reads `bits` (<= 64) bits; false when the stream is exhausted.
  bool Get(uint32_t bits, uint64_t* value) {
    if (bits > size_ * 8 - pos_) return false;
    uint64_t v = 0;
    uint32_t got = 0;
    while (got < bits) {  // a byte (or what is left of one) at a time
      const uint32_t shift = static_cast<uint32_t>(pos_ & 7);
      const uint32_t take = std::min(8 - shift, bits - got);
      const uint64_t piece = (data_[pos_ >> 3] >> shift) & ((1u << take) - 1);
      v |= piece << got;
      got += take;
      pos_ += take;
    }
    *value = v;
    return true;
  }
  // True when at most the padding bits of the last byte are left.
  bool AtEnd() const { return size_ * 8 - pos_ < 8; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// ceil(bits) as an int in [lo, hi]: a bit count derived from a ratio that may be huge, infinite
// (an overflowing norm, a denormal bound) or NaN, which a plain cast would make undefined.
int BitsClamped(double bits, int lo, int hi) {
  const double up = std::ceil(bits);
  if (!(up > lo)) return lo;
  if (up >= hi) return hi;
  return static_cast<int>(up);
}

// The largest bound a chunk is coded with. Quantizer steps are multiples of the bound (2 * bound
// for uniform), and an infinite step would make even the "unchanged" symbol 0 * step = NaN. A
// smaller bound only tightens the guarantee; only chunks whose range overflows a double (F64
// values near ±1e308 under a relative bound) or absolute bounds near DBL_MAX meet the cap.
constexpr double kMaxCodedBound = std::numeric_limits<double>::max() / 16;

// The bound a chunk is coded with: absolute, or (pointwise) the relative factor itself.
double ResolveBound(const ErrorBound& bound, double lo, double hi) {
  if (bound.kind == ErrorBound::Kind::kPointwise) return bound.value;
  if (bound.kind == ErrorBound::Kind::kAbsolute) return std::min(bound.value, kMaxCodedBound);
  if (!(hi >= lo)) return 0;  // no finite values: every element is stored verbatim anyway
  return std::min(bound.value * (hi - lo), kMaxCodedBound);
}

void PutF64(ByteWriter& w, double v) { w.PutU64(std::bit_cast<uint64_t>(v)); }
Status GetF64(ByteReader& r, double* v) {
  uint64_t bits = 0;
  CKPT_RETURN_IF_ERROR(r.GetU64(&bits));
  *v = std::bit_cast<double>(bits);
  return Status::Ok();
}

// One pass over the chunk's finite deltas: what the quantizers' parameters are made of.
struct DeltaStats {
  double max_abs = 0;
  double sum_squares = 0;
  // Exponent buckets (by floor(log2|d|) - e0, then sign): smallest and largest |d|.
  std::vector<double> bucket_min, bucket_max;
  int e0 = 0;
};

// The symbols of a chunk (or a sample of it) under one quantizer.
struct Quantized {
  std::vector<uint8_t> symbols;
  std::vector<uint8_t> history;  // each element's history state before this version (deltas)
  std::vector<uint8_t> explicit_history;  // exact lattice targets: each element's own state
  BitWriter extra;
  std::string exact;
  uint32_t exact_count = 0;
  uint64_t extra_bits = 0;
};

// How a chunk uses element history (see HistoryOf): not at all, as a keyframe (every
// reconstruction gets kKeyframeHistory), or as a delta (states read from the reference, symbols
// coded in their context, reconstructions get the next state).
enum class HistoryUse { kNone, kKeyframe, kDelta };

// The smallest and largest finite element (+inf and -inf when there is none). Branch-free, in
// the dtype's own precision where it is a C++ type (exact: min and max do not round).
template <DType D>
void FiniteRange(const uint8_t* in, size_t n, double* lo, double* hi) {
  using E = Element<D>;
  if constexpr (D == DType::kF32 || D == DType::kF64) {
    using T = std::conditional_t<D == DType::kF32, float, double>;
    constexpr T kInf = std::numeric_limits<T>::infinity();
    T low = kInf, high = -kInf;
    size_t i = 0;
#if defined(__SSE2__)
    if constexpr (D == DType::kF32) {
      // Eight elements a step in two pairs of accumulators (GCC keeps the scalar loop scalar:
      // min and max of floats are not associative for it).
      const __m128 zero = _mm_setzero_ps(), inf = _mm_set1_ps(kInf), minus_inf = _mm_set1_ps(-kInf);
      __m128 low0 = inf, low1 = inf, high0 = minus_inf, high1 = minus_inf;
      for (; i + 8 <= n; i += 8) {
        const __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(in + i * 4));
        const __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(in + i * 4 + 16));
        const __m128 finite_a = _mm_cmpeq_ps(_mm_sub_ps(a, a), zero);
        const __m128 finite_b = _mm_cmpeq_ps(_mm_sub_ps(b, b), zero);
        const __m128 kept_a = _mm_and_ps(finite_a, a), kept_b = _mm_and_ps(finite_b, b);
        low0 = _mm_min_ps(low0, _mm_or_ps(kept_a, _mm_andnot_ps(finite_a, inf)));
        low1 = _mm_min_ps(low1, _mm_or_ps(kept_b, _mm_andnot_ps(finite_b, inf)));
        high0 = _mm_max_ps(high0, _mm_or_ps(kept_a, _mm_andnot_ps(finite_a, minus_inf)));
        high1 = _mm_max_ps(high1, _mm_or_ps(kept_b, _mm_andnot_ps(finite_b, minus_inf)));
      }
      alignas(16) float lows[4], highs[4];
      _mm_store_ps(lows, _mm_min_ps(low0, low1));
      _mm_store_ps(highs, _mm_max_ps(high0, high1));
      for (int k = 0; k < 4; ++k) {
        low = std::min(low, lows[k]);
        high = std::max(high, highs[k]);
      }
    }
#endif
    for (; i < n; ++i) {
      T x;
      std::memcpy(&x, in + i * sizeof(T), sizeof(T));
      const bool finite = x - x == 0;  // false for NaN and ±Inf
      low = std::min(low, finite ? x : kInf);
      high = std::max(high, finite ? x : -kInf);
    }
    *lo = low;
    *hi = high;
  } else {
    double low = std::numeric_limits<double>::infinity(), high = -low;
    for (size_t i = 0; i < n; ++i) {
      const double x = E::Load(in + i * E::kSize);
      const bool finite = x - x == 0;
      low = std::min(low, finite ? x : std::numeric_limits<double>::infinity());
      high = std::max(high, finite ? x : -std::numeric_limits<double>::infinity());
    }
    *lo = low;
    *hi = high;
  }
}

// Whether reconstruction r of the finite element x is acceptable: within `bound`, not a zero of
// the wrong sign (-0.0 is kept as -0.0), not negative in a chunk without negative values
// (variances, counts, Adam's exp_avg_sq).
inline bool Acceptable(double x, double r, double bound, bool non_negative) {
  return WithinBound(x, r, bound) && (x != 0 || r != 0 || std::signbit(r) == std::signbit(x)) &&
         !(non_negative && std::signbit(r));
}

// Records element i: the symbol of z (and its extra bits) if `accepted`, else the element
// verbatim, also as its reconstruction.
template <size_t kElementSize>
inline void EmitElement(bool accepted, uint64_t z, const uint8_t* xp, uint8_t* rp, size_t i,
                        Quantized* out) {
  uint8_t symbol = kExactSymbol;
  if (accepted) {
    uint32_t bits;
    symbol = SymbolOf(z, &bits);
    if (bits) {
      out->extra.Put(z, bits);
      out->extra_bits += bits;
    }
  } else {
    std::memcpy(rp, xp, kElementSize);
    out->exact.append(reinterpret_cast<const char*>(xp), kElementSize);
    ++out->exact_count;
  }
  out->symbols[i] = symbol;
}

// Quantizes element i: its symbol (and extra bits, or the verbatim element), its history
// state before this version (deltas with history) and its reconstruction in `recon`.
template <DType D, typename Q, bool kHistory>
inline void QuantizeElement(const Q& quantizer, const uint8_t* in, const uint8_t* ref, size_t i,
                            double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                            Quantized* out) {
  using E = Element<D>;
  const uint8_t* xp = in + i * E::kSize;
  uint8_t* rp = recon + i * E::kSize;
  const double x = E::Load(xp);
  const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
  bool accepted = false;
  uint64_t z = 0;  // symbol 0 is "unchanged" for every quantizer
  bool proposed;
  double value;         // the move V(z) (additive quantizers), for the history state
  double restored = 0;  // what the decoder computes before rounding to the dtype
  constexpr bool kLogQuantizer = std::is_same_v<Q, LogQuantizer>;
  // An element identical to its reference (NaN, ±Inf and masks included) is "unchanged" if the
  // decoder's p + 0 reproduces its bits (checked below).
  const bool identical = ref && std::memcmp(xp, ref + i * E::kSize, E::kSize) == 0;
  if (identical && !std::isfinite(x)) {
    proposed = true;
    value = 0.0;
  } else if constexpr (kLogQuantizer) {
    proposed = std::isfinite(p) && quantizer.Propose(x, p, &z);
    value = 0.0;
    if (proposed) restored = quantizer.Reconstruct(z, p);
  } else if constexpr (std::is_same_v<Q, UniformQuantizer>) {
    // The lattice quantizer inline, without the integer round trip: q * step in double is
    // exactly what the decoder computes from the symbol (|q| <= 2^50 is exact in double).
    // One comparison also rejects NaN and ±Inf in x or p (t is then NaN or infinite; with
    // bound 0, inverse_step is 0 and t is 0 exactly when x - p is finite).
    const double t = (x - p) * quantizer.inverse_step;
    proposed = std::abs(t) <= lossy::kMaxQuantized;
    // + 0.0 turns a -0.0 into +0.0, as the decoder's integer q would be.
    const double q = proposed ? lossy::RoundToInteger(t) + 0.0 : 0.0;
    value = q * quantizer.step;
    z = lossy::ZigZag(static_cast<int64_t>(q));
  } else {
    proposed = std::isfinite(x) && std::isfinite(p) && (x == p || quantizer.Propose(x - p, &z));
    value = proposed ? quantizer.Value(z) : 0.0;
  }
  if constexpr (kHistory) {
    if (history == HistoryUse::kDelta) {
      out->history[i] = static_cast<uint8_t>(HistoryOf<D>(ref + i * E::kSize));
    }
  }
  if (proposed) {
    if constexpr (kLogQuantizer) {
      E::Store(identical ? p : restored, rp);
    } else {
      E::Store(p + value, rp);
    }
    if constexpr (kHistory) {
      SetHistory<D>(rp, history == HistoryUse::kDelta ? NextHistory(out->history[i], value)
                                                      : kKeyframeHistory);
    }
    const double r = E::Load(rp);
    // A zero of the wrong sign is within any bound, but -0.0 is kept as -0.0; and a chunk with
    // no negative values (variances, counts, Adam's exp_avg_sq) never restores a negative one.
    // Non-finite elements only ever restore bit-exactly. A pointwise bound is eps * |x|, rounded
    // down so that the check never passes an element the exact bound would not.
    const double element_bound = kLogQuantizer ? PointwiseBound(bound, x) : bound;
    accepted = std::isfinite(x) ? Acceptable(x, r, element_bound, non_negative)
                                : std::memcmp(rp, xp, E::kSize) == 0;
  }
  EmitElement<E::kSize>(accepted, z, xp, rp, i, out);
}

// The log quantizer's loop. The usual element (finite, non-zero, different from its reference,
// with a valid symbol whose reconstruction meets the bound) is coded here, with the arithmetic
// of LogQuantizer::Propose and Reconstruct; any other goes through QuantizeElement, which
// computes the same values and handles every special case.
template <DType D>
void QuantizeLogElements(const LogQuantizer& log, const uint8_t* in, const uint8_t* ref, size_t n,
                         double eps, bool non_negative, uint8_t* recon, Quantized* out) {
  using E = Element<D>;
  const bool ratio_mode = log.mode == LogQuantizer::Mode::kRatio;
  constexpr double kMaxIndex = static_cast<double>(LogQuantizer::kMaxIndex);
  for (size_t i = 0; i < n; ++i) {
    const double x = E::Load(in + i * E::kSize);
    const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
    // Ratio mode codes x / p; absolute mode x itself. Either must be finite and non-zero.
    const double a = ratio_mode ? x / p : x;
    const double t = std::log2(std::abs(a)) * log.inverse_step;
    const bool usual =
        x != p && x != 0 && p - p == 0 && std::abs(t) < kMaxIndex && (!ratio_mode || p != 0);
    if (!usual || !(log.step > 0)) [[unlikely]] {
      QuantizeElement<D, LogQuantizer, false>(log, in, ref, i, eps, non_negative, HistoryUse::kNone,
                                              recon, out);
      continue;
    }
    const int64_t index = static_cast<int64_t>(lossy::RoundToInteger(t));
    uint64_t z;
    double magnitude;
    if (ratio_mode) {
      z = 2 * lossy::ZigZag(index) + (a < 0 ? 1 : 0);
      magnitude = p * log.Power(index);
    } else {
      z = 1 + 2 * lossy::ZigZag(index - log.k0) + (x < 0 ? 1 : 0);
      magnitude = log.Power(index);
    }
    const double restored = a < 0 ? -magnitude : magnitude;
    uint8_t* rp = recon + i * E::kSize;
    E::Store(restored, rp);
    const double r = E::Load(rp);
    if (!log.Valid(z) || !Acceptable(x, r, PointwiseBound(eps, x), non_negative)) [[unlikely]] {
      QuantizeElement<D, LogQuantizer, false>(log, in, ref, i, eps, non_negative, HistoryUse::kNone,
                                              recon, out);
      continue;
    }
    EmitElement<E::kSize>(true, z, in + i * E::kSize, rp, i, out);
  }
}

// Quantizes n elements: symbols, verbatim elements, and the reconstruction into `recon`.
template <DType D, typename Q, bool kHistory>
void QuantizeElementsImpl(const Q& quantizer, const uint8_t* in, const uint8_t* ref, size_t n,
                          double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                          Quantized* out) {
  using E = Element<D>;
  out->symbols.resize(n);
  if constexpr (kHistory) out->history.resize(history == HistoryUse::kDelta ? n : 0);
  if constexpr (std::is_same_v<Q, LogQuantizer> && !kHistory) {
    QuantizeLogElements<D>(quantizer, in, ref, n, bound, non_negative, recon, out);
  } else if constexpr (!std::is_same_v<Q, UniformQuantizer>) {
    for (size_t i = 0; i < n; ++i) {
      QuantizeElement<D, Q, kHistory>(quantizer, in, ref, i, bound, non_negative, history, recon,
                                      out);
    }
  } else {
    // The common case without branches that depend on the data: an element whose lattice
    // value is a direct symbol and lands strictly inside the bound (and is not a zero, nor
    // negative in a non-negative chunk) is done here; any other goes through QuantizeElement,
    // which computes the same values and handles every special case.
    const bool delta_history = kHistory && history == HistoryUse::kDelta;
    size_t i = 0;
#if defined(__SSE2__)
    if constexpr (D == DType::kF32 && kHistory) {
      if (delta_history) {
        // Four at a time while all four take the fast path; a group that does not is redone
        // below, element by element.
        for (; i + 4 <= n; i += 4) {
          if (!QuantizeFourF32(in + 4 * i, ref + 4 * i, quantizer.step, quantizer.inverse_step,
                               bound, non_negative, recon + 4 * i, &out->symbols[i],
                               &out->history[i])) {
            for (size_t k = i; k < i + 4; ++k) {
              QuantizeElement<D, Q, kHistory>(quantizer, in, ref, k, bound, non_negative, history,
                                              recon, out);
            }
          }
        }
      }
    }
#endif
    for (; i < n; ++i) {
      const double x = E::Load(in + i * E::kSize);
      const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
      const double t = (x - p) * quantizer.inverse_step;
      const double q = lossy::RoundToInteger(t) + 0.0;
      const double value = q * quantizer.step;
      uint8_t* rp = recon + i * E::kSize;
      double r;
      if constexpr (kCanCarryHistory<D>) {
        // F32/F64: round, write the history state and take r from registers.
        using T = std::conditional_t<D == DType::kF32, float, double>;
        auto bits = std::bit_cast<ElementBits<D>>(static_cast<T>(p + value));
        if constexpr (kHistory) {
          uint32_t state = kKeyframeHistory;
          if (delta_history) {
            const uint32_t before = HistoryOf<D>(ref + i * E::kSize);
            out->history[i] = static_cast<uint8_t>(before);
            state = NextHistory(before, value);
          }
          bits = WithHistory(bits, state);
        }
        std::memcpy(rp, &bits, sizeof(bits));
        r = std::bit_cast<T>(bits);
      } else {
        E::Store(p + value, rp);
        r = E::Load(rp);
      }
      // |t| < 15.5: |q| <= 15, a direct symbol.
      const bool fast = (std::abs(t) < kDirectSymbols / 2 - 0.5) & (std::abs(x - r) < bound) &
                        (x != 0) & !(non_negative & std::signbit(r));
      if (fast) [[likely]] {
        out->symbols[i] = static_cast<uint8_t>(lossy::ZigZag(static_cast<int64_t>(q)));
      } else {
        QuantizeElement<D, Q, kHistory>(quantizer, in, ref, i, bound, non_negative, history, recon,
                                        out);
      }
    }
  }
}

template <DType D, typename Q>
void QuantizeElements(const Q& quantizer, const uint8_t* in, const uint8_t* ref, size_t n,
                      double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                      Quantized* out) {
  if constexpr (kCanCarryHistory<D>) {
    if (history != HistoryUse::kNone) {
      return QuantizeElementsImpl<D, Q, true>(quantizer, in, ref, n, bound, non_negative, history,
                                              recon, out);
    }
  }
  QuantizeElementsImpl<D, Q, false>(quantizer, in, ref, n, bound, non_negative, HistoryUse::kNone,
                                    recon, out);
}

// Lattice mode (kFlagLattice, uniform quantizer only). An element's reconstruction is
// T((kp + q) * step): kp the reference's lattice index (LatticeIndex; 0 in keyframes), q the
// coded move unzigzag(z). A reference without an index (not finite, or beyond the lattice)
// restores bit-identically under z = 0 and counts as kp = 0 otherwise. The encoder takes
// q = round(x / step) - kp, so the lattice point T(round(x / step) * step) depends on x alone,
// not on the chain. With element history (kFlagHistory: F32/F64 chunks where it fits, as in
// additive payloads) the lattice point then carries a history state in its lowest mantissa
// bits: NextHistory(the reference's state, q) in deltas, kKeyframeHistory in keyframes. Those
// bits are far below half the pitch, so they never change a kp. kExactTarget
// (EncodeExactOnLattice) accepts an element only when its reconstruction has exactly x's bits;
// with history, x's own state is the one written (the payload then codes every element's state
// explicitly, kFlagExplicitHistory). Otherwise the usual bound, sign and non-negativity checks
// apply. Elements that fail are stored verbatim.
template <DType D, bool kExactTarget>
void QuantizeLatticeElement(const UniformQuantizer& u, const uint8_t* in, const uint8_t* ref,
                            size_t i, double bound, bool non_negative, HistoryUse history,
                            uint8_t* recon, Quantized* out) {
  using E = Element<D>;
  const uint8_t* xp = in + i * E::kSize;
  uint8_t* rp = recon + i * E::kSize;
  const double x = E::Load(xp);
  const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
  uint32_t before = kKeyframeHistory;
  if constexpr (kCanCarryHistory<D>) {
    if (history == HistoryUse::kDelta) {
      before = LatticeHistoryOf<D>(ref + i * E::kSize);
      out->history[i] = static_cast<uint8_t>(before);
    }
  }
  double kp = 0;
  const bool indexed = lossy::LatticeIndex(p, u.inverse_step, &kp);
  if (!indexed && ref && std::memcmp(xp, ref + i * E::kSize, E::kSize) == 0) {
    std::memcpy(rp, xp, E::kSize);  // z = 0 restores a reference without an index as it is
    return EmitElement<E::kSize>(true, 0, xp, rp, i, out);
  }
  bool accepted = false;
  uint64_t z = 0;
  const double t = x * u.inverse_step;
  if (std::abs(t) <= lossy::kMaxQuantized) {
    const double q = lossy::RoundToInteger(t) + 0.0 - kp;
    if (std::abs(q) <= lossy::kMaxQuantized && (indexed || q != 0)) {
      E::Store((kp + q) * u.step, rp);
      if constexpr (kCanCarryHistory<D>) {
        if (history != HistoryUse::kNone) {
          SetHistory<D>(rp, kExactTarget                       ? HistoryOf<D>(xp)
                            : history == HistoryUse::kKeyframe ? kKeyframeHistory
                                                               : NextHistory(before, q));
        }
      }
      if constexpr (kExactTarget) {
        accepted = std::memcmp(rp, xp, E::kSize) == 0;
      } else {
        accepted = Acceptable(x, E::Load(rp), bound, non_negative);
      }
      z = lossy::ZigZag(static_cast<int64_t>(q));
    }
  }
  EmitElement<E::kSize>(accepted, z, xp, rp, i, out);
}

// Quantizes n elements in lattice mode. As in QuantizeElementsImpl, the common case (a direct
// symbol, strictly inside the bound, not a zero, not negative in a non-negative chunk; with
// kExactTarget: the exact bits) is done without data-dependent branches, and anything else
// goes through QuantizeLatticeElement, which computes the same values.
template <DType D, bool kExactTarget>
void QuantizeLatticeElements(const UniformQuantizer& u, const uint8_t* in, const uint8_t* ref,
                             size_t n, double bound, bool non_negative, HistoryUse history,
                             uint8_t* recon, Quantized* out) {
  using E = Element<D>;
  out->symbols.resize(n);
  out->history.resize(history == HistoryUse::kDelta ? n : 0);
  if constexpr (kExactTarget && kCanCarryHistory<D>) {
    if (history != HistoryUse::kNone) {
      out->explicit_history.resize(n);
      for (size_t i = 0; i < n; ++i) {
        out->explicit_history[i] = static_cast<uint8_t>(HistoryOf<D>(in + i * E::kSize));
      }
    }
  }
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (D == DType::kF32) {
    for (; i + 4 <= n; i += 4) {
      bool fast;
      if (history == HistoryUse::kNone) {
        fast = lossy::QuantizeFourLatticeF32<kExactTarget>(
            in + 4 * i, ref ? ref + 4 * i : nullptr, u.step, u.inverse_step, bound, non_negative,
            recon + 4 * i, &out->symbols[i]);
      } else if constexpr (!kExactTarget) {
        fast = lossy::QuantizeFourLatticeF32<false, true>(
            in + 4 * i, ref ? ref + 4 * i : nullptr, u.step, u.inverse_step, bound, non_negative,
            recon + 4 * i, &out->symbols[i], ref ? &out->history[i] : nullptr);
      } else {
        break;  // exact targets with history: element by element below
      }
      if (!fast) {
        for (size_t k = i; k < i + 4; ++k) {
          QuantizeLatticeElement<D, kExactTarget>(u, in, ref, k, bound, non_negative, history,
                                                  recon, out);
        }
      }
    }
  }
#endif
  if (history != HistoryUse::kNone) {
    for (; i < n; ++i) {
      QuantizeLatticeElement<D, kExactTarget>(u, in, ref, i, bound, non_negative, history, recon,
                                              out);
    }
    return;
  }
  for (; i < n; ++i) {
    const uint8_t* xp = in + i * E::kSize;
    uint8_t* rp = recon + i * E::kSize;
    const double x = E::Load(xp);
    const double pt = (ref ? E::Load(ref + i * E::kSize) : 0.0) * u.inverse_step;
    const double t = x * u.inverse_step;
    const double kp = lossy::RoundToInteger(pt) + 0.0;
    const double q = lossy::RoundToInteger(t) + 0.0 - kp;
    E::Store((kp + q) * u.step, rp);
    const double r = E::Load(rp);
    bool fast = (std::abs(pt) <= lossy::kMaxQuantized) & (std::abs(t) <= lossy::kMaxQuantized) &
                (std::abs(q) < kDirectSymbols / 2 - 0.5);
    if constexpr (kExactTarget) {
      fast &= std::memcmp(rp, xp, E::kSize) == 0;
    } else {
      fast &= (std::abs(x - r) < bound) & (x != 0) & !(non_negative & std::signbit(r));
    }
    if (fast) [[likely]] {
      out->symbols[i] = static_cast<uint8_t>(lossy::ZigZag(static_cast<int64_t>(q)));
    } else {
      QuantizeLatticeElement<D, kExactTarget>(u, in, ref, i, bound, non_negative, history, recon,
                                              out);
    }
  }
}

// Low-rank lattice (kFlagLowRank; deltas of F32/F64 matrices with element history). An
// element's reconstruction is T((b + 64 q) * fine) with fine = step / 64: b = kp + shift(i), kp
// the reference's index on the fine lattice (LatticeIndex), shift(i) the element's low-rank
// shift (low_rank.h), q the coded move. A reference without an index restores bit-identically
// under z = 0 and counts as b = 0 otherwise. The encoder takes q = round((x / fine - b) / 64),
// the nearest point of the shifted lattice, so the error is at most half a move, and the
// history state follows q as on the lattice. Elements that fail the bound go verbatim.
template <DType D>
inline void QuantizeLowRankElement(double step, int32_t shift, const uint8_t* in,
                                   const uint8_t* ref, size_t i, double bound, bool non_negative,
                                   uint8_t* recon, Quantized* out) {
  using E = Element<D>;
  const double fine = step / kLowRankFine;
  const double inverse_fine = 1.0 / fine;
  const uint8_t* xp = in + i * E::kSize;
  uint8_t* rp = recon + i * E::kSize;
  const double x = E::Load(xp);
  const double p = E::Load(ref + i * E::kSize);
  const uint32_t before = LatticeHistoryOf<D>(ref + i * E::kSize);
  out->history[i] = static_cast<uint8_t>(before);
  double kp = 0;
  const bool indexed = lossy::LatticeIndex(p, inverse_fine, &kp);
  if (!indexed && std::memcmp(xp, ref + i * E::kSize, E::kSize) == 0) {
    std::memcpy(rp, xp, E::kSize);
    return EmitElement<E::kSize>(true, 0, xp, rp, i, out);
  }
  const double base = indexed ? kp + shift : 0.0;
  bool accepted = false;
  uint64_t z = 0;
  const double t = x * inverse_fine;
  if (std::abs(t) <= lossy::kMaxQuantized) {
    const double q = lossy::RoundToInteger((t - base) / kLowRankFine) + 0.0;
    if (std::abs(q) <= lossy::kMaxQuantized / kLowRankFine && (indexed || q != 0)) {
      E::Store((base + kLowRankFine * q) * fine, rp);
      SetHistory<D>(rp, NextHistory(before, q));
      accepted = Acceptable(x, E::Load(rp), bound, non_negative);
      z = lossy::ZigZag(static_cast<int64_t>(q));
    }
  }
  EmitElement<E::kSize>(accepted, z, xp, rp, i, out);
}

#ifdef CKPT_LOSSY_AVX2
// QuantizeLowRankRange's F32 elements [begin, end) eight at a time with AVX2, where the CPU has
// it; groups that do not all take the fast path go four at a time or one by one as there.
// Returns the first element it did not quantize.
__attribute__((target("avx2"))) size_t QuantizeLowRankRangeAvx2(
    double step, const int32_t* shift, const uint8_t* in, const uint8_t* ref, size_t begin,
    size_t end, double bound, bool non_negative, uint8_t* recon, Quantized* out) {
  const double fine = step / kLowRankFine;
  const double inverse_fine = 1.0 / fine;
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (lossy::QuantizeEightLowRankF32(in + 4 * i, ref + 4 * i, shift + (i - begin), fine,
                                       inverse_fine, bound, non_negative, recon + 4 * i,
                                       &out->symbols[i], &out->history[i])) {
      continue;
    }
    for (size_t four = i; four < i + 8; four += 4) {
      if (!lossy::QuantizeFourLowRankF32(in + 4 * four, ref + 4 * four, shift + (four - begin),
                                         fine, inverse_fine, bound, non_negative, recon + 4 * four,
                                         &out->symbols[four], &out->history[four])) {
        for (size_t k = four; k < four + 4; ++k) {
          QuantizeLowRankElement<DType::kF32>(step, shift[k - begin], in, ref, k, bound,
                                              non_negative, recon, out);
        }
      }
    }
  }
  return i;
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !lossy::PortableLowRankKernelsForTesting();
}
#endif

// Elements [begin, end) of a chunk on the low-rank lattice, in order; shift[k] is element
// begin + k's shift, and out's symbols and history hold at least `end` elements.
template <DType D>
void QuantizeLowRankRange(double step, const int32_t* shift, const uint8_t* in, const uint8_t* ref,
                          size_t begin, size_t end, double bound, bool non_negative, uint8_t* recon,
                          Quantized* out) {
  size_t i = begin;
#ifdef CKPT_LOSSY_AVX2
  if constexpr (D == DType::kF32) {
    if (CpuHasAvx2()) {
      i = QuantizeLowRankRangeAvx2(step, shift, in, ref, begin, end, bound, non_negative, recon,
                                   out);
    }
  }
#endif
#if defined(__SSE2__)
  if constexpr (D == DType::kF32) {
    const double fine = step / kLowRankFine;
    const double inverse_fine = 1.0 / fine;
    for (; i + 4 <= end; i += 4) {
      if (!lossy::QuantizeFourLowRankF32(in + 4 * i, ref + 4 * i, shift + (i - begin), fine,
                                         inverse_fine, bound, non_negative, recon + 4 * i,
                                         &out->symbols[i], &out->history[i])) {
        for (size_t k = i; k < i + 4; ++k) {
          QuantizeLowRankElement<D>(step, shift[k - begin], in, ref, k, bound, non_negative, recon,
                                    out);
        }
      }
    }
  }
#endif
  for (; i < end; ++i) {
    QuantizeLowRankElement<D>(step, shift[i - begin], in, ref, i, bound, non_negative, recon, out);
  }
}

// The n elements of a chunk on the low-rank lattice, shift[i] element i's shift.
template <DType D>
void QuantizeLowRankElements(double step, const int32_t* shift, const uint8_t* in,
                             const uint8_t* ref, size_t n, double bound, bool non_negative,
                             uint8_t* recon, Quantized* out) {
  out->symbols.resize(n);
  out->history.resize(n);
  QuantizeLowRankRange<D>(step, shift, in, ref, 0, n, bound, non_negative, recon, out);
}

// The low-rank shift of a chunk's elements for a decoder that visits them in increasing order:
// one row computed at a time, so the whole shift is never in memory.
class ShiftCursor {
 public:
  explicit ShiftCursor(const lossy::LowRankShift& shift)
      : rows_(shift, shift.rank), cols_(shift.cols), values_(shift.cols) {}

  // Element i's shift (i < rows * cols, not in a row before one already reached).
  int32_t At(size_t i) {
    Reach(i);
    return values_[i - begin_];
  }

  // The shifts of elements [i, i + count) when they lie in one row, else null.
  const int32_t* Span(size_t i, size_t count) {
    Reach(i);
    return i + count <= end_ ? &values_[i - begin_] : nullptr;
  }

 private:
  void Reach(size_t i) {
    if (i < end_) return;
    const size_t row = i / cols_;
    rows_.Row(static_cast<uint32_t>(row), values_.data());
    begin_ = row * cols_;
    end_ = begin_ + cols_;
  }

  const lossy::LowRankShiftRows rows_;
  const size_t cols_;
  std::vector<int32_t> values_;
  size_t begin_ = 0, end_ = 0;  // the elements of the row in values_
};

#ifdef CKPT_LOSSY_AVX2
// The decoder's vector path for F32 low-rank deltas with AVX2, eight elements at a time from
// *done while they have direct symbols and lie in one row; other groups go four at a time
// (DecodeFourLowRankF32) or to `general` (elements [begin, end), in order) as without AVX2.
// Advances *done past what it decoded.
template <typename General>
__attribute__((target("avx2"))) Status DecodeLowRankF32Avx2(const uint8_t* sym, size_t n,
                                                            double fine, double inverse_fine,
                                                            ShiftCursor& shift, const uint8_t* ref,
                                                            uint8_t* out, size_t* done,
                                                            General&& general) {
  size_t i = *done;
  for (; i + 8 <= n; i += 8) {
    uint64_t eight;
    std::memcpy(&eight, sym + i, 8);
    const int32_t* shift_of_eight = shift.Span(i, 8);
    if (!(eight & 0xe0e0e0e0e0e0e0e0ull) && shift_of_eight != nullptr &&
        lossy::DecodeEightLowRankF32(eight, fine, inverse_fine, shift_of_eight, ref + 4 * i,
                                     out + 4 * i)) {
      continue;
    }
    for (size_t four = i; four < i + 8; four += 4) {
      uint32_t symbols;
      std::memcpy(&symbols, sym + four, 4);
      const int32_t* shift_of_four = shift.Span(four, 4);
      if ((symbols & 0xe0e0e0e0u) || shift_of_four == nullptr ||
          !lossy::DecodeFourLowRankF32(symbols, fine, inverse_fine, shift_of_four, ref + 4 * four,
                                       out + 4 * four)) {
        CKPT_RETURN_IF_ERROR(general(four, four + 4));
      }
    }
  }
  *done = i;
  return Status::Ok();
}
#endif

// How a lattice delta of a matrix with history is coded: on the plain lattice, or on the fine
// lattice shifted by `shift`.
struct LowRankChoice {
  bool use = false;
  lossy::LowRankShift shift;
};

// Fits a shift of the largest candidate rank, then compares the plain lattice with the shifted
// one at each candidate rank by estimated size: the moves' entropy in their history contexts on
// every (rows / kLowRankSampleRows)-th row, scaled up, plus the factors.
template <DType D>
LowRankChoice ChooseLowRankShift(const UniformQuantizer& u, const uint8_t* in, const uint8_t* ref,
                                 uint32_t rows, uint32_t cols, double bound, bool non_negative) {
  using E = Element<D>;
  const size_t n = size_t{rows} * cols;
  // The delta in steps, as the fit takes it: what is not finite as 0 (an element that turns
  // into or out of ±Inf is no motion to model, and would be all the fit saw), and within ±2^20
  // steps (a shift never moves an element further: its factors are at most 63), which keeps the
  // fit's float products far from overflow.
  // Every element is written below: no zero-filling of a buffer as large as the chunk.
  const std::unique_ptr<float[]> delta = std::make_unique_for_overwrite<float[]>(n);
  const double inverse_step = u.inverse_step;
  constexpr double kMaxSteps = 0x1p20;
  size_t i = 0;
#if defined(__SSE2__)
  if constexpr (D == DType::kF32) {  // the same arithmetic, four at a time
    const __m128d inverse = _mm_set1_pd(inverse_step), high = _mm_set1_pd(kMaxSteps),
                  low = _mm_set1_pd(-kMaxSteps);
    const __m128d magnitude = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffff));
    const __m128d infinity = _mm_set1_pd(std::numeric_limits<double>::infinity());
    auto steps = [&](__m128d x, __m128d p) {
      const __m128d d = _mm_mul_pd(_mm_sub_pd(x, p), inverse);
      const __m128d finite = _mm_cmplt_pd(_mm_and_pd(d, magnitude), infinity);  // not NaN, ±Inf
      return _mm_cvtpd_ps(_mm_and_pd(finite, _mm_min_pd(_mm_max_pd(d, low), high)));
    };
    for (; i + 4 <= n; i += 4) {
      const __m128 x = _mm_loadu_ps(reinterpret_cast<const float*>(in) + i);
      const __m128 p = _mm_loadu_ps(reinterpret_cast<const float*>(ref) + i);
      const __m128 d_low = steps(_mm_cvtps_pd(x), _mm_cvtps_pd(p));
      const __m128 d_high =
          steps(_mm_cvtps_pd(_mm_movehl_ps(x, x)), _mm_cvtps_pd(_mm_movehl_ps(p, p)));
      _mm_storeu_ps(delta.get() + i, _mm_movelh_ps(d_low, d_high));
    }
  }
#endif
  for (; i < n; ++i) {
    const double d = (E::Load(in + i * E::kSize) - E::Load(ref + i * E::kSize)) * inverse_step;
    delta[i] = std::isfinite(d) ? static_cast<float>(std::clamp(d, -kMaxSteps, kMaxSteps)) : 0.0f;
  }
  LowRankChoice choice;
  choice.shift = lossy::FitLowRankShift(std::span<const float>(delta.get(), n), rows, cols,
                                        kLowRankMaxRank, u.step, u.step / kLowRankFine);
  const lossy::LowRankShift& fitted = choice.shift;
  const uint32_t stride = std::max<uint32_t>(1, rows / kLowRankSampleRows);
  const uint32_t sampled = (rows + stride - 1) / stride;
  const double scale_up = static_cast<double>(rows) / sampled;
  std::vector<uint8_t> recon(size_t{cols} * E::kSize);
  std::vector<int32_t> sampled_shift(size_t{sampled} * cols);
  // rank < 0: the plain lattice.
  auto estimate = [&](int rank) {
    rans::Histogram histogram(kHistoryContexts);
    double side_bits = 0;
    if (rank >= 0) {
      fitted.ApplyRows(static_cast<uint32_t>(rank), 0, stride, sampled, sampled_shift.data());
    }
    for (uint32_t r = 0; r < rows; r += stride) {
      const size_t first = size_t{r} * cols;
      Quantized q;
      if (rank < 0) {
        QuantizeLatticeElements<D, false>(u, in + first * E::kSize, ref + first * E::kSize, cols,
                                          bound, non_negative, HistoryUse::kDelta, recon.data(),
                                          &q);
      } else {
        QuantizeLowRankElements<D>(u.step, &sampled_shift[size_t{r / stride} * cols],
                                   in + first * E::kSize, ref + first * E::kSize, cols, bound,
                                   non_negative, recon.data(), &q);
      }
      histogram.AddAll(q.symbols.data(), q.history.data(), cols);
      side_bits += static_cast<double>(q.extra_bits) + 8.0 * q.exact.size();
    }
    return (histogram.EntropyBits() + side_bits) * scale_up +
           (rank >= 0 ? fitted.EstimatedBits(static_cast<uint32_t>(rank)) : 0);
  };
  int best_rank = -1;
  double best_bits = estimate(-1);
  for (int rank = 8; rank <= static_cast<int>(fitted.rank); rank += 8) {
    const double bits = estimate(rank);
    if (bits < best_bits) best_rank = rank, best_bits = bits;
  }
  choice.use = best_rank >= 0;
  choice.shift = fitted.Truncated(static_cast<uint32_t>(std::max(best_rank, 0)));
  return choice;
}

// The context of element i's explicit history state (kFlagExplicitHistory): the state the
// element would get without it — NextHistory of the reference's state `before` and the move of
// a direct symbol; kKeyframeHistory in keyframes; 0 for any other symbol.
inline uint8_t ExplicitHistoryContext(uint8_t symbol, uint32_t before, bool delta) {
  if (symbol >= kDirectSymbols) return 0;
  if (!delta) return kKeyframeHistory;
  return static_cast<uint8_t>(
      NextHistory(before, static_cast<double>(lossy::UnZigZag(uint64_t{symbol}))));
}

// Estimated coded bits of `q` (order-0 entropy of the symbols plus raw side data).
double EstimatedBits(const Quantized& q, size_t element_size) {
  rans::Histogram h(1);
  for (uint8_t s : q.symbols) h.Add(0, s);
  return h.EntropyBits() + static_cast<double>(q.extra_bits) +
         8.0 * static_cast<double>(q.exact_count * element_size);
}

// Everything that distinguishes the quantizers, as the encoder and decoder use them.
struct QuantizerSet {
  Quantizer kind = Quantizer::kUniform;
  UniformQuantizer uniform{0};
  ExponentQuantizer exponent;
  FloatQuantizer floating;
  CosineQuantizer cosine;
  LogQuantizer log;

  void WriteParams(ByteWriter& w) const {
    switch (kind) {
      case Quantizer::kLog:
        PutF64(w, log.step);
        w.PutU8(static_cast<uint8_t>(log.mode));
        w.PutU32(static_cast<uint32_t>(log.k0));
        break;
      case Quantizer::kUniform:
        PutF64(w, uniform.step);
        break;
      case Quantizer::kExponent: {
        w.PutU32(static_cast<uint32_t>(exponent.e0));
        w.PutU16(static_cast<uint16_t>(exponent.values.size()));
        for (size_t z = 1; z < exponent.values.size(); ++z) PutF64(w, exponent.values[z]);
        break;
      }
      case Quantizer::kFloat:
        PutF64(w, floating.scale);
        w.PutU8(static_cast<uint8_t>(floating.exponent_bits));
        w.PutU8(static_cast<uint8_t>(floating.mantissa_bits));
        break;
      case Quantizer::kCosine:
        PutF64(w, cosine.norm);
        w.PutU8(static_cast<uint8_t>(cosine.level_bits));
        break;
      case Quantizer::kAuto:
        break;
    }
  }

  Status ReadParams(ByteReader& r) {
    switch (kind) {
      case Quantizer::kLog: {
        double step = 0;
        uint8_t mode = 0;
        uint32_t k0 = 0;
        CKPT_RETURN_IF_ERROR(GetF64(r, &step));
        CKPT_RETURN_IF_ERROR(r.GetU8(&mode));
        CKPT_RETURN_IF_ERROR(r.GetU32(&k0));
        if (!(step > 0) || !(step < 64) ||
            (mode != static_cast<uint8_t>(LogQuantizer::Mode::kRatio) &&
             mode != static_cast<uint8_t>(LogQuantizer::Mode::kAbsolute))) {
          return Status::DataLoss("lossy payload: bad log quantizer parameters");
        }
        log.SetStep(step);
        log.mode = static_cast<LogQuantizer::Mode>(mode);
        log.k0 = static_cast<int32_t>(k0);
        log.ResetCache();
        return Status::Ok();
      }
      case Quantizer::kUniform: {
        double step = 0;
        CKPT_RETURN_IF_ERROR(GetF64(r, &step));
        uniform = UniformQuantizer(step);
        return Status::Ok();
      }
      case Quantizer::kExponent: {
        uint32_t e0 = 0;
        uint16_t count = 0;
        CKPT_RETURN_IF_ERROR(r.GetU32(&e0));
        CKPT_RETURN_IF_ERROR(r.GetU16(&count));
        if (count == 0 || count > 2 * ExponentQuantizer::kMaxBuckets + 1) {
          return Status::DataLoss("lossy payload: bad exponent table size");
        }
        exponent.e0 = static_cast<int32_t>(e0);
        exponent.values.assign(count, 0.0);
        for (size_t z = 1; z < count; ++z) CKPT_RETURN_IF_ERROR(GetF64(r, &exponent.values[z]));
        return Status::Ok();
      }
      case Quantizer::kFloat: {
        uint8_t e = 0, m = 0;
        CKPT_RETURN_IF_ERROR(GetF64(r, &floating.scale));
        CKPT_RETURN_IF_ERROR(r.GetU8(&e));
        CKPT_RETURN_IF_ERROR(r.GetU8(&m));
        if (e < 1 || e > 8 || e + m > FloatQuantizer::kMaxBits) {
          return Status::DataLoss("lossy payload: bad float format");
        }
        floating.exponent_bits = e;
        floating.mantissa_bits = m;
        floating.BuildTable();
        return Status::Ok();
      }
      case Quantizer::kCosine: {
        uint8_t bits = 0;
        CKPT_RETURN_IF_ERROR(GetF64(r, &cosine.norm));
        CKPT_RETURN_IF_ERROR(r.GetU8(&bits));
        if (bits < 1 || bits > CosineQuantizer::kMaxLevelBits) {
          return Status::DataLoss("lossy payload: bad cosine level count");
        }
        cosine.level_bits = bits;
        cosine.BuildTable();
        return Status::Ok();
      }
      case Quantizer::kAuto:
        break;
    }
    return Status::DataLoss("lossy payload: unknown quantizer");
  }

  size_t ParamBytes() const {
    ByteWriter w;
    WriteParams(w);
    return w.data().size();
  }

  template <DType D>
  void Quantize(const uint8_t* in, const uint8_t* ref, size_t n, double bound, bool non_negative,
                HistoryUse history, uint8_t* recon, Quantized* out) const {
    switch (kind) {
      case Quantizer::kExponent:
        return QuantizeElements<D>(exponent, in, ref, n, bound, non_negative, history, recon, out);
      case Quantizer::kFloat:
        return QuantizeElements<D>(floating, in, ref, n, bound, non_negative, history, recon, out);
      case Quantizer::kCosine:
        return QuantizeElements<D>(cosine, in, ref, n, bound, non_negative, history, recon, out);
      case Quantizer::kLog:
        return QuantizeElements<D>(log, in, ref, n, bound, non_negative, history, recon, out);
      default:
        return QuantizeElements<D>(uniform, in, ref, n, bound, non_negative, history, recon, out);
    }
  }
};

// Sets up every quantizer's parameters for a chunk with the given delta statistics.
// Without `build_tables` (auto's estimate on a sample) float and cosine values are computed on
// demand instead of tabulated.
void Configure(const DeltaStats& stats, double bound, const LossyCodecOptions& options,
               Quantizer kind, bool build_tables, QuantizerSet* set) {
  set->kind = kind;
  switch (kind) {
    case Quantizer::kUniform:
    case Quantizer::kAuto:
      set->uniform = UniformQuantizer(2 * bound);
      break;
    case Quantizer::kExponent: {
      set->exponent.e0 = stats.e0;
      size_t used = 0;
      for (size_t k = 0; k < stats.bucket_max.size(); ++k) {
        if (stats.bucket_max[k] > 0) used = k + 1;
      }
      used += used % 2;  // whole (positive, negative) pairs
      set->exponent.values.assign(1 + used, 0.0);
      for (size_t k = 0; k < used; ++k) {
        const double rep =
            stats.bucket_max[k] > 0 ? (stats.bucket_min[k] + stats.bucket_max[k]) / 2 : 0.0;
        set->exponent.values[1 + k] = k % 2 ? -rep : rep;
      }
      break;
    }
    case Quantizer::kFloat: {
      FloatQuantizer& f = set->floating;
      f.scale = stats.max_abs;
      f.exponent_bits = options.float_exponent_bits ? options.float_exponent_bits : 4;
      int m = options.float_mantissa_bits;
      if (m == 0 && bound > 0 && f.scale > 0) {
        // The fewest mantissa bits whose spacing in [scale/2, scale] is at most 2 * bound.
        m = BitsClamped(std::log2(f.scale / (4 * bound)), 0, FloatQuantizer::kMaxBits);
      }
      f.mantissa_bits = std::clamp(m, 0, FloatQuantizer::kMaxBits - f.exponent_bits);
      if (build_tables) f.BuildTable();
      break;
    }
    case Quantizer::kCosine: {
      CosineQuantizer& c = set->cosine;
      c.norm = std::sqrt(stats.sum_squares);
      int bits = 1;
      if (bound > 0 && c.norm > 0) {
        // Level spacing is largest at the middle: norm * pi / 2^s <= 2 * bound.
        bits = BitsClamped(std::log2(c.norm * 3.14159265358979323846 / (2 * bound)), 1,
                           CosineQuantizer::kMaxLevelBits);
      }
      c.level_bits = std::clamp(bits, 1, CosineQuantizer::kMaxLevelBits);
      if (build_tables) c.BuildTable();
      break;
    }
    case Quantizer::kLog:
      // `bound` is the pointwise factor eps: rounding on this lattice is within ±log2(1 + eps),
      // i.e. r / x in [1/(1 + eps), 1 + eps], inside [1 - eps, 1 + eps]. Mode and k0 are set
      // by the encoder (ChooseLogMode).
      set->log.SetStep(2 * std::log2(1 + bound));
      break;
  }
}

template <DType D>
DeltaStats CollectStats(const uint8_t* in, const uint8_t* ref, size_t n, double bound) {
  using E = Element<D>;
  DeltaStats stats;
  if (bound > 0) {
    int exponent = 0;
    std::frexp(bound, &exponent);
    stats.e0 = exponent - 1;  // 2^e0 <= bound
  } else {
    stats.e0 = -1100;
  }
  stats.bucket_min.assign(2 * ExponentQuantizer::kMaxBuckets, 0.0);
  stats.bucket_max.assign(2 * ExponentQuantizer::kMaxBuckets, 0.0);
  const double threshold = std::ldexp(1.0, stats.e0);
  for (size_t i = 0; i < n; ++i) {
    const double d = E::Load(in + i * E::kSize) - (ref ? E::Load(ref + i * E::kSize) : 0.0);
    if (!std::isfinite(d)) continue;
    const double a = std::abs(d);
    stats.max_abs = std::max(stats.max_abs, a);
    stats.sum_squares += d * d;
    if (a < threshold) continue;
    // floor(log2 a) from the exponent field (a >= 2^e0 > 0; subnormals land below bucket 0).
    const int k = static_cast<int>((std::bit_cast<uint64_t>(a) >> 52) & 0x7ff) - 1023 - stats.e0;
    if (k < 0 || k >= ExponentQuantizer::kMaxBuckets) continue;
    const size_t slot = 2 * static_cast<size_t>(k) + (d < 0 ? 1 : 0);
    if (stats.bucket_max[slot] == 0) {
      stats.bucket_min[slot] = stats.bucket_max[slot] = a;
    } else {
      stats.bucket_min[slot] = std::min(stats.bucket_min[slot], a);
      stats.bucket_max[slot] = std::max(stats.bucket_max[slot], a);
    }
  }
  return stats;
}

struct Header {
  Quantizer quantizer = Quantizer::kUniform;
  DType dtype = DType::kF32;
  uint8_t context_model = kContextModelPrevious2;
  bool delta = false;
  bool history = false;
  bool four_states = false;
  bool lattice = false;
  bool explicit_history = false;
  bool low_rank = false;
  double bound = 0;
  uint64_t elements = 0;
  uint32_t exact = 0;
  uint32_t extra_bytes = 0;
  lossy::LowRankShift shift;  // low_rank: the shift's factors (read after the header)
};

class LossyQuantizedCodec final : public TensorCodec {
 public:
  explicit LossyQuantizedCodec(const LossyCodecOptions& options) : options_(options) {}

  CodecId id() const override { return CodecId::kLossyQuantized; }

  Result<EncodedChunk> Encode(DType dtype, std::span<const uint8_t> current,
                              std::optional<std::span<const uint8_t>> reference) const override {
    if (reference && reference->size() != current.size()) {
      return Status::InvalidArgument("lossy codec: reference length differs from chunk length");
    }
    if (!(options_.bound.value >= 0) || !std::isfinite(options_.bound.value)) {
      return Status::InvalidArgument("lossy codec: the error bound must be finite and >= 0");
    }
    return EncodeDispatch(dtype, current, reference, nullptr);
  }

  // EncodeExactOnLattice: `target` coded on the lattice of `original` (a payload this codec
  // wrote), every element bit-exact.
  Result<EncodedChunk> EncodeExact(DType dtype, std::span<const uint8_t> original,
                                   std::span<const uint8_t> target,
                                   std::optional<std::span<const uint8_t>> reference) const {
    if (reference && reference->size() != target.size()) {
      return Status::InvalidArgument("lossy codec: reference length differs from chunk length");
    }
    ByteReader r(original, "lossy payload");
    Header h;
    CKPT_RETURN_IF_ERROR(ReadHeader(r, &h));
    QuantizerSet set;
    set.kind = h.quantizer;
    CKPT_RETURN_IF_ERROR(set.ReadParams(r));
    if (h.quantizer != Quantizer::kUniform) {
      return Status::FailedPrecondition("lossy payload: quantizer " +
                                        std::string(QuantizerName(h.quantizer)) +
                                        " has no lattice to re-encode on");
    }
    if (h.dtype != dtype) return Status::DataLoss("lossy payload: dtype differs from manifest");
    if (!(set.uniform.step > 0) || !std::isfinite(set.uniform.inverse_step)) {
      return Status::FailedPrecondition("lossy payload: lattice step out of range");
    }
    // A low-rank payload's reconstructions lie on its fine lattice: so does the re-encoding.
    const double step = h.low_rank ? set.uniform.step / kLowRankFine : set.uniform.step;
    const ExactTarget exact{step, h.bound, h.history};
    return EncodeDispatch(dtype, target, reference, &exact);
  }

 private:
  // The lattice and bound an exact re-encoding keeps (EncodeExact).
  struct ExactTarget {
    double step;
    double bound;
    bool history;  // the original carries element history: so does the target
  };

  Result<EncodedChunk> EncodeDispatch(DType dtype, std::span<const uint8_t> current,
                                      std::optional<std::span<const uint8_t>> reference,
                                      const ExactTarget* exact) const {
    switch (dtype) {
      case DType::kF32:
        return EncodeTyped<DType::kF32>(current, reference, exact);
      case DType::kF64:
        return EncodeTyped<DType::kF64>(current, reference, exact);
      case DType::kF16:
        return EncodeTyped<DType::kF16>(current, reference, exact);
      case DType::kBF16:
        return EncodeTyped<DType::kBF16>(current, reference, exact);
      default:
        return Status::InvalidArgument("lossy codec: dtype " + std::string(DTypeName(dtype)) +
                                       " is not quantized (stored losslessly)");
    }
  }

 public:
  Status Decode(DType dtype, std::span<const uint8_t> payload,
                std::optional<std::span<const uint8_t>> reference,
                std::span<uint8_t> out) const override {
    switch (dtype) {
      case DType::kF32:
        return DecodeTyped<DType::kF32>(payload, reference, out);
      case DType::kF64:
        return DecodeTyped<DType::kF64>(payload, reference, out);
      case DType::kF16:
        return DecodeTyped<DType::kF16>(payload, reference, out);
      case DType::kBF16:
        return DecodeTyped<DType::kBF16>(payload, reference, out);
      default:
        return Status::DataLoss("lossy payload for non-float dtype " +
                                std::string(DTypeName(dtype)));
    }
  }

 private:
  // auto: quantizes an evenly spread sample of the chunk with every quantizer (parameters from
  // the sample too) and picks the one with the smallest estimated size (symbol entropy + side
  // data + parameters).
  template <DType D>
  Quantizer ChooseQuantizer(const uint8_t* in, const uint8_t* ref, size_t n, double bound,
                            bool non_negative) const {
    using E = Element<D>;
    const size_t stride = std::max<size_t>(1, n / kAutoSampleElements);
    const size_t m = (n + stride - 1) / stride;
    std::vector<uint8_t> sample_in(m * E::kSize), sample_ref(ref ? m * E::kSize : 0),
        scratch(m * E::kSize);
    for (size_t i = 0; i < m; ++i) {
      std::memcpy(sample_in.data() + i * E::kSize, in + i * stride * E::kSize, E::kSize);
      if (ref) std::memcpy(sample_ref.data() + i * E::kSize, ref + i * stride * E::kSize, E::kSize);
    }
    const uint8_t* sref = ref ? sample_ref.data() : nullptr;
    const DeltaStats stats = CollectStats<D>(sample_in.data(), sref, m, bound);
    Quantizer best = Quantizer::kUniform;
    double best_bits = 0;
    for (Quantizer kind :
         {Quantizer::kUniform, Quantizer::kExponent, Quantizer::kFloat, Quantizer::kCosine}) {
      QuantizerSet set;
      Configure(stats, bound, options_, kind, /*build_tables=*/false, &set);
      Quantized q;
      set.Quantize<D>(sample_in.data(), sref, m, bound, non_negative, HistoryUse::kNone,
                      scratch.data(), &q);
      const double bits =
          EstimatedBits(q, E::kSize) * static_cast<double>(n) / static_cast<double>(m) +
          8.0 * static_cast<double>(set.ParamBytes());
      if (kind == Quantizer::kUniform || bits < best_bits) {
        best = kind;
        best_bits = bits;
      }
    }
    return best;
  }

  // log: absolute mode (k0 = the sample's mean log-index) or, for deltas, ratio mode, whichever
  // codes an evenly spread sample of the chunk smaller.
  template <DType D>
  static void ChooseLogMode(const uint8_t* in, const uint8_t* ref, size_t n, double eps,
                            bool non_negative, QuantizerSet* set) {
    using E = Element<D>;
    LogQuantizer& log = set->log;
    const size_t stride = std::max<size_t>(1, n / kAutoSampleElements);
    const size_t m = (n + stride - 1) / stride;
    std::vector<uint8_t> sample_in(m * E::kSize), sample_ref(ref ? m * E::kSize : 0),
        scratch(m * E::kSize);
    double sum = 0;
    size_t count = 0;
    for (size_t i = 0; i < m; ++i) {
      std::memcpy(sample_in.data() + i * E::kSize, in + i * stride * E::kSize, E::kSize);
      if (ref) std::memcpy(sample_ref.data() + i * E::kSize, ref + i * stride * E::kSize, E::kSize);
      const double x = E::Load(in + i * stride * E::kSize);
      if (x != 0 && std::isfinite(x)) {
        sum += std::log2(std::abs(x)) / log.step;
        ++count;
      }
    }
    const double mean = count ? sum / static_cast<double>(count) : 0.0;
    // Indices beyond ±kMaxIndex are never coded, so a centre beyond them only pushes symbols
    // out of range.
    constexpr double kMaxCentre = static_cast<double>(LogQuantizer::kMaxIndex);
    log.k0 = static_cast<int32_t>(std::clamp(mean, -kMaxCentre, kMaxCentre));
    log.mode = LogQuantizer::Mode::kAbsolute;
    log.ResetCache();
    if (!ref) return;
    Quantized absolute, ratio;
    set->template Quantize<D>(sample_in.data(), sample_ref.data(), m, eps, non_negative,
                              HistoryUse::kNone, scratch.data(), &absolute);
    log.mode = LogQuantizer::Mode::kRatio;
    log.ResetCache();
    set->template Quantize<D>(sample_in.data(), sample_ref.data(), m, eps, non_negative,
                              HistoryUse::kNone, scratch.data(), &ratio);
    if (EstimatedBits(absolute, E::kSize) < EstimatedBits(ratio, E::kSize)) {
      log.mode = LogQuantizer::Mode::kAbsolute;
      log.ResetCache();
    }
  }

  template <DType D>
  Result<EncodedChunk> EncodeTyped(std::span<const uint8_t> current,
                                   std::optional<std::span<const uint8_t>> reference,
                                   const ExactTarget* exact) const {
    using E = Element<D>;
    if (current.size() % E::kSize != 0) {
      return Status::InvalidArgument("lossy codec: chunk is not whole elements");
    }
    const size_t n = current.size() / E::kSize;
    const uint8_t* in = current.data();
    // A delta is a payload coded against a reference, even an empty one (whose data() may be
    // null): `ref` is non-null exactly for deltas.
    static constexpr uint8_t kEmptyReference = 0;
    const uint8_t* ref = !reference           ? nullptr
                         : reference->empty() ? &kEmptyReference
                                              : reference->data();

    // The range of the finite values: for relative bounds, and to know whether the chunk is
    // non-negative (then no element may restore negative).
    double lo, hi;
    FiniteRange<D>(in, n, &lo, &hi);
    const double bound = exact ? exact->bound : ResolveBound(options_.bound, lo, hi);
    const bool non_negative = n > 0 && lo >= 0;

    const bool pointwise = !exact && options_.bound.kind == ErrorBound::Kind::kPointwise;
    Quantizer kind = exact ? Quantizer::kUniform : options_.quantizer;
    if (pointwise) {
      kind = Quantizer::kLog;
    } else if (kind == Quantizer::kLog) {
      return Status::InvalidArgument("lossy codec: the log quantizer needs a pointwise bound");
    } else if (kind == Quantizer::kAuto) {
      kind = ChooseQuantizer<D>(in, ref, n, bound, non_negative);
    }
    DeltaStats stats;
    if (kind != Quantizer::kUniform && kind != Quantizer::kLog) {
      stats = CollectStats<D>(in, ref, n, bound);
    }
    QuantizerSet set;
    Configure(stats, bound, options_, kind, /*build_tables=*/true, &set);
    if (kind == Quantizer::kLog) ChooseLogMode<D>(in, ref, n, bound, non_negative, &set);
    if (exact) set.uniform = UniformQuantizer(exact->step);
    const bool lattice = exact || (options_.lattice && kind == Quantizer::kUniform);

    const bool contexts = n >= kMinElementsForContexts;
    // Element history where it fits; an exact re-encoding carries it exactly when the payload
    // it re-encodes did (its reconstructions have history bits to reproduce).
    const bool carries_history =
        kCanCarryHistory<D> &&
        (exact ? exact->history
               : options_.history && contexts && !pointwise &&
                     HistoryFits<D>(std::max(std::abs(lo), std::abs(hi)) + bound, bound));
    HistoryUse history = HistoryUse::kNone;
    if (carries_history) history = ref ? HistoryUse::kDelta : HistoryUse::kKeyframe;
    const bool explicit_history = exact && carries_history;
    // A low-rank shift where the chunk is a matrix and one pays (lattice deltas with history).
    LowRankChoice choice;
    const uint32_t cols = options_.matrix_columns;
    if (!exact && lattice && history == HistoryUse::kDelta && cols >= kMinLowRankSide &&
        n % cols == 0 && n / cols >= kMinLowRankSide &&
        n / cols <= std::numeric_limits<uint32_t>::max()) {
      choice = ChooseLowRankShift<D>(set.uniform, in, ref, static_cast<uint32_t>(n / cols), cols,
                                     bound, non_negative);
    }
    const bool low_rank = choice.use;
    const lossy::LowRankShift& shift = choice.shift;
    EncodedChunk result;
    result.reconstruction_is_input = false;
    result.reconstruction.resize(current.size());
    Quantized q;
    if (low_rank) {  // row by row, each row's shift computed as it is needed
      q.symbols.resize(n);
      q.history.resize(n);
      const lossy::LowRankShiftRows shift_rows(shift, shift.rank);
      std::vector<int32_t> row_shift(cols);
      for (size_t row = 0; row < n / cols; ++row) {
        shift_rows.Row(static_cast<uint32_t>(row), row_shift.data());
        QuantizeLowRankRange<D>(set.uniform.step, row_shift.data(), in, ref, row * cols,
                                (row + 1) * cols, bound, non_negative, result.reconstruction.data(),
                                &q);
      }
    } else if (exact) {
      QuantizeLatticeElements<D, true>(set.uniform, in, ref, n, bound, non_negative, history,
                                       result.reconstruction.data(), &q);
    } else if (lattice) {
      QuantizeLatticeElements<D, false>(set.uniform, in, ref, n, bound, non_negative, history,
                                        result.reconstruction.data(), &q);
    } else {
      set.Quantize<D>(in, ref, n, bound, non_negative, history, result.reconstruction.data(), &q);
    }
    if (q.exact_count > std::numeric_limits<uint32_t>::max() / E::kSize) {
      return Status::InvalidArgument("lossy codec: chunk too large");
    }

    // Deltas with history code each symbol in the context of its element's state. Lattice
    // deltas without it code order-0: the two previous symbols gain under 0.3% on training
    // runs while serializing the decoder. (Keyframes of smooth tensors gain more, and are rare.)
    const uint8_t context_model = !contexts                       ? kContextModelNone
                                  : history == HistoryUse::kDelta ? kContextModelHistory
                                  : lattice && ref                ? kContextModelNone
                                                                  : kContextModelPrevious2;
    rans::Histogram histogram(ContextCount(context_model));
    std::vector<uint8_t> raster_context(context_model == kContextModelPrevious2 ? n : 0);
    if (context_model == kContextModelHistory) {
      histogram.AddAll(q.symbols.data(), q.history.data(), n);
    } else if (context_model == kContextModelPrevious2) {
      uint32_t c1 = 0, c2 = 0;  // classes of the previous two symbols
      for (size_t i = 0; i < n; ++i) {
        const uint8_t symbol = q.symbols[i];
        const uint32_t context = c1 * 3 + c2;
        raster_context[i] = static_cast<uint8_t>(context);
        histogram.Add(context, symbol);
        c2 = c1;
        c1 = ClassOf(symbol);
      }
    } else {
      histogram.AddAll(q.symbols.data(), nullptr, n);
    }
    std::string extra_bytes = q.extra.Finish();
    // Exact re-encodings with history: every element's state, in the context of the state it
    // would get otherwise (mostly the same), as a stream of its own.
    std::string explicit_stream;
    double explicit_bits = 0;
    if (explicit_history) {
      rans::Histogram states(kHistoryContexts);
      std::vector<uint8_t> state_context(n);
      for (size_t i = 0; i < n; ++i) {
        state_context[i] = ExplicitHistoryContext(q.symbols[i], ref ? q.history[i] : 0, ref);
        // An element that carries no state (a zero, not finite, verbatim) decodes the same with
        // any: it gets the one its context predicts, which costs next to nothing.
        if (q.symbols[i] == kExactSymbol || !lossy::CarriesHistory<D>(in + i * E::kSize)) {
          q.explicit_history[i] = state_context[i];
        }
        states.Add(state_context[i], q.explicit_history[i]);
      }
      explicit_bits = states.EntropyBits();
      const std::vector<rans::EncodeTable> state_tables =
          rans::WriteTables(states, &explicit_stream);
      rans::Encoder state_encoder(n, 1);
      state_encoder.PutAll(q.explicit_history.data(), state_context.data(), state_tables.data(), n);
      state_encoder.Finish(&explicit_stream);
    }
    ByteWriter w;
    w.PutU8(low_rank                       ? kPayloadVersionLowRank
            : !lattice                     ? kPayloadVersion
            : history != HistoryUse::kNone ? kPayloadVersionLatticeHistory
                                           : kPayloadVersionLattice);
    w.PutU8(static_cast<uint8_t>(kind));
    w.PutU8(static_cast<uint8_t>(D));
    w.PutU8(context_model);
    w.PutU8((ref ? kFlagDelta : 0) | (history != HistoryUse::kNone ? kFlagHistory : 0) |
            (contexts ? kFlagFourStates : 0) | (lattice ? kFlagLattice : 0) |
            (explicit_history ? kFlagExplicitHistory : 0) | (low_rank ? kFlagLowRank : 0));
    PutF64(w, bound);
    w.PutU64(n);
    w.PutU32(q.exact_count);
    w.PutU32(static_cast<uint32_t>(extra_bytes.size()));
    set.WriteParams(w);
    std::string shift_bytes;
    if (low_rank) {
      shift.Write(&shift_bytes);
      w.PutU32(shift.rows);
      w.PutU32(shift.cols);
      w.PutLengthPrefixed(shift_bytes);
    }
    w.PutBytes(q.exact);
    w.PutBytes(extra_bytes);
    if (explicit_history) {
      if (explicit_stream.size() > std::numeric_limits<uint32_t>::max()) {
        return Status::InvalidArgument("lossy codec: chunk too large");
      }
      w.PutU32(static_cast<uint32_t>(explicit_stream.size()));
      w.PutBytes(explicit_stream);
    }
    std::string payload = w.Release();
    const std::vector<rans::EncodeTable> tables = rans::WriteTables(histogram, &payload);
    rans::Encoder encoder(n, contexts ? rans::kMaxWays : 1);  // small chunks: fewer state bytes
    const std::vector<uint8_t>& context_of =
        context_model == kContextModelHistory ? q.history : raster_context;
    encoder.PutAll(q.symbols.data(),
                   context_model != kContextModelNone ? context_of.data() : nullptr, tables.data(),
                   n);
    encoder.Finish(&payload);

    if ((payload.size() >= current.size() || q.exact_count * 8 > n) && !current.empty()) {
      // Quantizing did not pay (e.g. a bound below the dtype's resolution, or data the
      // quantizers cannot follow), or many elements went verbatim (masks of -inf, tensors
      // mostly NaN): store the chunk bit-exactly instead if that is smaller, which also keeps
      // it within any bound. Its reconstruction is then the input itself.
      static const std::unique_ptr<TensorCodec> lossless = NewLosslessCodec();
      auto bit_exact = lossless->Encode(D, current, reference);
      if (bit_exact.ok() && bit_exact->payload.size() < payload.size()) return bit_exact;
    }
    result.payload = std::move(payload);
    result.codec_id = CodecId::kLossyQuantized;
    result.info.quantizer = static_cast<uint8_t>(kind);
    result.info.bound = bound;
    result.info.elements = n;
    result.info.exact_elements = q.exact_count;
    const double side_bits =
        static_cast<double>(q.extra_bits) + 8.0 * (q.exact.size() + shift_bytes.size());
    result.info.model_entropy_bits = histogram.EntropyBits() + side_bits + explicit_bits;
    rans::Histogram order0(1);  // the same symbols without contexts
    for (const auto& counts : histogram.counts) {
      for (uint32_t k = 0; k < rans::kMaxSymbols; ++k) order0.counts[0][k] += counts[k];
    }
    result.info.order0_entropy_bits = order0.EntropyBits() + side_bits + explicit_bits;
    return result;
  }

  static Status ReadHeader(ByteReader& r, Header* h) {
    uint8_t version = 0, quantizer = 0, dtype = 0, flags = 0;
    CKPT_RETURN_IF_ERROR(r.GetU8(&version));
    if (version != kPayloadVersion && version != kPayloadVersionLattice &&
        version != kPayloadVersionLatticeHistory && version != kPayloadVersionLowRank) {
      return Status::DataLoss("lossy payload version " + std::to_string(version) +
                              " is not supported (written by a newer ckptd?)");
    }
    CKPT_RETURN_IF_ERROR(r.GetU8(&quantizer));
    CKPT_RETURN_IF_ERROR(r.GetU8(&dtype));
    CKPT_RETURN_IF_ERROR(r.GetU8(&h->context_model));
    CKPT_RETURN_IF_ERROR(r.GetU8(&flags));
    CKPT_RETURN_IF_ERROR(GetF64(r, &h->bound));
    CKPT_RETURN_IF_ERROR(r.GetU64(&h->elements));
    CKPT_RETURN_IF_ERROR(r.GetU32(&h->exact));
    CKPT_RETURN_IF_ERROR(r.GetU32(&h->extra_bytes));
    if (quantizer < static_cast<uint8_t>(Quantizer::kUniform) ||
        quantizer > static_cast<uint8_t>(Quantizer::kLog)) {
      return Status::DataLoss("lossy payload: unknown quantizer " + std::to_string(quantizer));
    }
    if (h->context_model != kContextModelPrevious2 && h->context_model != kContextModelNone &&
        h->context_model != kContextModelHistory) {
      return Status::DataLoss("lossy payload: unknown context model " +
                              std::to_string(h->context_model));
    }
    auto d = DTypeFromTag(dtype);
    if (!d) return Status::DataLoss("lossy payload: unknown dtype tag");
    h->quantizer = static_cast<Quantizer>(quantizer);
    h->dtype = *d;
    h->delta = flags & kFlagDelta;
    h->history = flags & kFlagHistory;
    h->four_states = flags & kFlagFourStates;
    h->lattice = flags & kFlagLattice;
    h->explicit_history = flags & kFlagExplicitHistory;
    h->low_rank = flags & kFlagLowRank;
    if (flags & ~(kFlagDelta | kFlagHistory | kFlagFourStates | kFlagLattice |
                  kFlagExplicitHistory | kFlagLowRank)) {
      return Status::DataLoss("lossy payload: unknown flags " + std::to_string(flags));
    }
    if (version == kPayloadVersionLowRank) {
      if (!h->low_rank || !h->lattice || !h->delta || h->explicit_history) {
        return Status::DataLoss("lossy payload: flags do not match payload version");
      }
    } else if (h->low_rank || h->lattice != (version != kPayloadVersion) ||
               (h->lattice && h->history) != (version == kPayloadVersionLatticeHistory) ||
               (h->explicit_history && version != kPayloadVersionLatticeHistory)) {
      return Status::DataLoss("lossy payload: flags do not match payload version");
    }
    if (h->lattice && h->quantizer != Quantizer::kUniform) {
      return Status::DataLoss("lossy payload: lattice flag on a non-lattice quantizer");
    }
    if (h->history && *d != DType::kF32 && *d != DType::kF64) {
      return Status::DataLoss("lossy payload: element history on a dtype that cannot carry it");
    }
    if (h->context_model == kContextModelHistory && !(h->history && h->delta)) {
      return Status::DataLoss("lossy payload: history contexts without a history delta");
    }
    return Status::Ok();
  }

  template <DType D>
  Status DecodeTyped(std::span<const uint8_t> payload,
                     std::optional<std::span<const uint8_t>> reference,
                     std::span<uint8_t> out) const {
    ByteReader r(payload, "lossy payload");
    Header h;
    CKPT_RETURN_IF_ERROR(ReadHeader(r, &h));
    QuantizerSet set;
    set.kind = h.quantizer;
    CKPT_RETURN_IF_ERROR(set.ReadParams(r));
    if (h.low_rank) CKPT_RETURN_IF_ERROR(ReadShift<D>(r, out.size(), &h));
    switch (h.quantizer) {
      case Quantizer::kExponent:
        return DecodeElements<D>(set.exponent, h, r, reference, out);
      case Quantizer::kFloat:
        return DecodeElements<D>(set.floating, h, r, reference, out);
      case Quantizer::kCosine:
        return DecodeElements<D>(set.cosine, h, r, reference, out);
      case Quantizer::kLog:
        return DecodeElements<D>(set.log, h, r, reference, out);
      default:
        return DecodeElements<D>(set.uniform, h, r, reference, out);
    }
  }

  // The low-rank shift of a kFlagLowRank payload (rows, columns, the factors) into h->shift.
  // Its rows are computed as the elements are decoded (ShiftCursor).
  template <DType D>
  static Status ReadShift(ByteReader& r, size_t out_bytes, Header* h) {
    uint32_t rows = 0, cols = 0;
    std::string bytes;
    CKPT_RETURN_IF_ERROR(r.GetU32(&rows));
    CKPT_RETURN_IF_ERROR(r.GetU32(&cols));
    CKPT_RETURN_IF_ERROR(r.GetLengthPrefixed(&bytes));
    if (h->elements != out_bytes / Element<D>::kSize || uint64_t{rows} * cols != h->elements) {
      return Status::DataLoss("lossy payload: low-rank matrix shape differs from chunk length");
    }
    const auto* in = reinterpret_cast<const uint8_t*>(bytes.data());
    const uint8_t* end = in + bytes.size();
    CKPT_RETURN_IF_ERROR(lossy::LowRankShift::Read(in, end, rows, cols, &h->shift));
    if (in != end) return Status::DataLoss("lossy payload: trailing bytes after low-rank shift");
    return Status::Ok();
  }

  template <DType D, typename Q>
  static Status DecodeElements(const Q& quantizer, const Header& h, ByteReader& r,
                               std::optional<std::span<const uint8_t>> reference,
                               std::span<uint8_t> out) {
    using E = Element<D>;
    if (h.dtype != D) return Status::DataLoss("lossy payload: dtype differs from manifest");
    if (h.elements != out.size() / E::kSize || out.size() % E::kSize != 0) {
      return Status::DataLoss("lossy payload: element count differs from chunk length");
    }
    if (h.delta != reference.has_value()) {
      return Status::DataLoss(h.delta ? "lossy payload: delta decoded without reference"
                                      : "lossy payload: keyframe decoded as a delta");
    }
    if (reference && reference->size() != out.size()) {
      return Status::DataLoss("lossy payload: reference length differs from chunk length");
    }
    if (h.exact > h.elements) return Status::DataLoss("lossy payload: exact count out of range");
    std::span<const uint8_t> exact, extra, explicit_states, rest;
    CKPT_RETURN_IF_ERROR(r.GetSpan(uint64_t{h.exact} * E::kSize, &exact));
    CKPT_RETURN_IF_ERROR(r.GetSpan(h.extra_bytes, &extra));
    if (h.explicit_history) {
      uint32_t explicit_bytes = 0;
      CKPT_RETURN_IF_ERROR(r.GetU32(&explicit_bytes));
      CKPT_RETURN_IF_ERROR(r.GetSpan(explicit_bytes, &explicit_states));
    }
    CKPT_RETURN_IF_ERROR(r.GetSpan(r.remaining(), &rest));
    const uint8_t* in = rest.data();
    const uint8_t* end = in + rest.size();
    rans::DecodeTables tables;
    CKPT_RETURN_IF_ERROR(tables.Read(in, end, ContextCount(h.context_model)));
    rans::Decoder decoder;
    CKPT_RETURN_IF_ERROR(decoder.Init(in, end, h.four_states ? rans::kMaxWays : 1));
    if (in != end) return Status::DataLoss("lossy payload: trailing bytes");

    const uint8_t* ref = reference ? reference->data() : nullptr;
    uint8_t* o = out.data();
    const uint8_t* next_exact = exact.data();
    const uint8_t* exact_end = exact.data() + exact.size();
    BitReader bits(extra.data(), extra.size());
    // The values of the direct symbols, looked up instead of computed (the common case).
    double direct[kDirectSymbols] = {};
    if constexpr (!std::is_same_v<Q, LogQuantizer>) {  // log reconstructs from z and p
      for (uint32_t k = 0; k < kDirectSymbols; ++k) {
        direct[k] =
            quantizer.Valid(k) ? quantizer.Value(k) : std::numeric_limits<double>::quiet_NaN();
      }
      // Symbol 0 is "unchanged" for every quantizer. Where its formula gives NaN (0 * step for
      // the infinite step that payloads written before 2026-11-30 could carry) the encoder
      // reconstructed p + 0, so that unchanged NaN elements kept their bits: so does the decoder.
      // (Elsewhere the formula's value stays: the float quantizer's V(0) is -0.0.)
      if (std::isnan(direct[0])) direct[0] = 0.0;
    }
    if constexpr (std::is_same_v<Q, UniformQuantizer>) {
      if (h.lattice) {
        if constexpr (kCanCarryHistory<D>) {
          if (h.history && h.delta) {
            return DecodeLoop<D, Q, HistoryUse::kDelta, true>(quantizer, h, direct, decoder, tables,
                                                              bits, next_exact, exact_end, ref, o,
                                                              explicit_states);
          }
          if (h.history) {
            return DecodeLoop<D, Q, HistoryUse::kKeyframe, true>(
                quantizer, h, direct, decoder, tables, bits, next_exact, exact_end, ref, o,
                explicit_states);
          }
        }
        return DecodeLoop<D, Q, HistoryUse::kNone, true>(quantizer, h, direct, decoder, tables,
                                                         bits, next_exact, exact_end, ref, o, {});
      }
    }
    if constexpr (kCanCarryHistory<D>) {
      if (h.history && h.delta) {
        return DecodeLoop<D, Q, HistoryUse::kDelta>(quantizer, h, direct, decoder, tables, bits,
                                                    next_exact, exact_end, ref, o, {});
      }
      if (h.history) {
        return DecodeLoop<D, Q, HistoryUse::kKeyframe>(quantizer, h, direct, decoder, tables, bits,
                                                       next_exact, exact_end, ref, o, {});
      }
    }
    return DecodeLoop<D, Q, HistoryUse::kNone>(quantizer, h, direct, decoder, tables, bits,
                                               next_exact, exact_end, ref, o, {});
  }

  // Decodes the explicit history states of n elements (kFlagExplicitHistory) into `states`,
  // in the contexts the encoder used (ExplicitHistoryContext, from the decoded symbols).
  template <DType D, HistoryUse kHistory>
  static Status DecodeExplicitHistory(std::span<const uint8_t> stream, const uint8_t* sym,
                                      const uint8_t* ref, size_t n, uint8_t* states) {
    const uint8_t* in = stream.data();
    const uint8_t* end = in + stream.size();
    rans::DecodeTables tables;
    CKPT_RETURN_IF_ERROR(tables.Read(in, end, kHistoryContexts));
    rans::Decoder decoder;
    CKPT_RETURN_IF_ERROR(decoder.Init(in, end, 1));
    if (in != end) return Status::DataLoss("lossy payload: trailing bytes after history states");
    for (size_t i = 0; i < n; ++i) {
      const uint32_t before = kHistory == HistoryUse::kDelta
                                  ? LatticeHistoryOf<D>(ref + i * Element<D>::kSize)
                                  : kKeyframeHistory;
      const uint8_t context =
          ExplicitHistoryContext(sym[i], before, kHistory == HistoryUse::kDelta);
      states[i] = decoder.Get<0>(tables.context(context));
      if (states[i] > kHistoryMask) {
        return Status::DataLoss("lossy payload: history state out of range");
      }
    }
    return decoder.Check().WithContext("lossy payload history states");
  }

  // The symbol loop of DecodeElements, for one way of using element history.
  // Decodes the symbols (first pass: only the rANS states are serial, and with four interleaved
  // states four chains run side by side), then the elements (second pass). The decoder is taken
  // by value so that its states stay in registers.
  // `explicit_states`: the stream of every element's history state (kFlagExplicitHistory).
  template <DType D, typename Q, HistoryUse kHistory, bool kLattice = false>
  static Status DecodeLoop(const Q& quantizer, const Header& h, const double* direct,
                           rans::Decoder decoder, const rans::DecodeTables& tables, BitReader& bits,
                           const uint8_t* next_exact, const uint8_t* exact_end, const uint8_t* ref,
                           uint8_t* o, std::span<const uint8_t> explicit_states) {
    using E = Element<D>;
    const size_t n = h.elements;
    std::unique_ptr<uint8_t[]> symbols(new uint8_t[n]);
    uint8_t* sym = symbols.get();
    auto decode_symbols = [&](auto context_of) {
      size_t i = 0;
      if (h.four_states) {
        for (; i + 3 < n; i += 4) {
          sym[i] = decoder.Get<0>(context_of(i));
          sym[i + 1] = decoder.Get<1>(context_of(i + 1));
          sym[i + 2] = decoder.Get<2>(context_of(i + 2));
          sym[i + 3] = decoder.Get<3>(context_of(i + 3));
        }
        if (i < n) sym[i] = decoder.Get<0>(context_of(i)), ++i;
        if (i < n) sym[i] = decoder.Get<1>(context_of(i)), ++i;
        if (i < n) sym[i] = decoder.Get<2>(context_of(i)), ++i;
      }
      for (; i < n; ++i) sym[i] = decoder.Get<0>(context_of(i));  // one way
    };
    if constexpr (kHistory == HistoryUse::kDelta) {
      if constexpr (kLattice) {
        decode_symbols(
            [&](size_t i) { return tables.context(LatticeHistoryOf<D>(ref + i * E::kSize)); });
      } else {
        decode_symbols([&](size_t i) { return tables.context(HistoryOf<D>(ref + i * E::kSize)); });
      }
    } else {
      if (h.context_model == kContextModelPrevious2) {
        decode_symbols([&](size_t i) {
          const uint32_t c1 = i > 0 ? ClassOf(sym[i - 1]) : 0;
          const uint32_t c2 = i > 1 ? ClassOf(sym[i - 2]) : 0;
          return tables.context(c1 * 3 + c2);
        });
      } else {
        decode_symbols([&](size_t) { return tables.context(0); });
      }
    }
    CKPT_RETURN_IF_ERROR(decoder.Check().WithContext("lossy payload"));
    std::unique_ptr<uint8_t[]> states;
    (void)explicit_states;  // read only by lattice payloads with history
    if constexpr (kLattice && kHistory != HistoryUse::kNone) {
      if (h.explicit_history) {
        states.reset(new uint8_t[n]);
        const Status decoded =
            DecodeExplicitHistory<D, kHistory>(explicit_states, sym, ref, n, states.get());
        if (!decoded.ok()) return decoded;
      }
    }

    // The lattice indices of references: on the fine lattice in low-rank payloads.
    double lattice_step = 0, lattice_inverse = 0;
    if constexpr (kLattice) {
      lattice_step = h.low_rank ? quantizer.step / kLowRankFine : quantizer.step;
      lattice_inverse = h.low_rank ? 1.0 / lattice_step : quantizer.inverse_step;
    }
    std::optional<ShiftCursor> shift;
    if (h.low_rank) shift.emplace(h.shift);
    // Elements [begin, end), any symbol and quantizer; called in increasing order of elements.
    auto decode_elements = [&](size_t begin, size_t end) -> Status {
      for (size_t i = begin; i < end; ++i) {
        const uint8_t symbol = sym[i];
        uint8_t* op = o + i * E::kSize;
        uint64_t z = symbol;
        double value = 0;
        if (symbol < kDirectSymbols) {
          if (!quantizer.Valid(symbol))
            return Status::DataLoss("lossy payload: symbol out of table");
          value = direct[symbol];
        } else if (symbol == kExactSymbol) {
          if (next_exact == exact_end)
            return Status::DataLoss("lossy payload: exact list too short");
          std::memcpy(op, next_exact, E::kSize);
          next_exact += E::kSize;
          continue;
        } else if (symbol < kExactSymbol) {
          const uint32_t width = symbol - kDirectSymbols + kFirstBucketBits;
          uint64_t low = 0;
          if (!bits.Get(width - 1, &low))
            return Status::DataLoss("lossy payload: extra bits short");
          z = (uint64_t{1} << (width - 1)) | low;
          if (!quantizer.Valid(z)) return Status::DataLoss("lossy payload: symbol out of table");
          if constexpr (!std::is_same_v<Q, LogQuantizer>) value = quantizer.Value(z);
        } else {
          return Status::DataLoss("lossy payload: symbol out of range");
        }
        const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
        if constexpr (kLattice) {
          // QuantizeLatticeElement's rule: T((kp + q) * step), or the reference itself under
          // z = 0 when it has no lattice index (kp = 0 otherwise). Low-rank payloads:
          // QuantizeLowRankElement's T((kp + shift + 64 q) * fine), kp on the fine lattice.
          double kp = 0;
          const double q = static_cast<double>(lossy::UnZigZag(z));
          // Without a reference (a keyframe) kp is 0. A corrupt header's step can leave even
          // p = 0 without an index, so "no reference" is tested, not inferred.
          const bool indexed = ref != nullptr && lossy::LatticeIndex(p, lattice_inverse, &kp);
          if (ref == nullptr || indexed || z != 0) {
            if (h.low_rank) {
              const double base = indexed ? kp + shift->At(i) : 0.0;
              E::Store((base + kLowRankFine * q) * lattice_step, op);
            } else {
              E::Store((kp + q) * quantizer.step, op);
            }
            if constexpr (kHistory != HistoryUse::kNone) {
              SetHistory<D>(op, states ? states[i]
                                : kHistory == HistoryUse::kKeyframe
                                    ? kKeyframeHistory
                                    : NextHistory(LatticeHistoryOf<D>(ref + i * E::kSize), q));
            }
          } else {
            std::memcpy(op, ref + i * E::kSize, E::kSize);
          }
        } else if constexpr (std::is_same_v<Q, LogQuantizer>) {
          E::Store(quantizer.Reconstruct(z, p), op);  // never with history
        } else if constexpr (kHistory == HistoryUse::kNone) {
          E::Store(p + value, op);
        } else {
          using T = std::conditional_t<D == DType::kF32, float, double>;
          auto out_bits = std::bit_cast<ElementBits<D>>(static_cast<T>(p + value));
          const uint32_t state = kHistory == HistoryUse::kDelta
                                     ? NextHistory(HistoryOf<D>(ref + i * E::kSize), value)
                                     : kKeyframeHistory;
          out_bits = WithHistory(out_bits, state);
          std::memcpy(op, &out_bits, sizeof(out_bits));
        }
      }
      return Status::Ok();
    };
    size_t done = 0;
#if defined(__SSE2__)
    if constexpr (D == DType::kF32 && kLattice) {
      if (h.low_rank && kHistory == HistoryUse::kDelta) {
#ifdef CKPT_LOSSY_AVX2
        if (CpuHasAvx2()) {
          CKPT_RETURN_IF_ERROR(DecodeLowRankF32Avx2(sym, n, lattice_step, lattice_inverse, *shift,
                                                    ref, o, &done, decode_elements));
        }
#endif
        for (; done + 4 <= n; done += 4) {
          uint32_t four;
          std::memcpy(&four, sym + done, 4);
          const int32_t* shift_of_four = shift->Span(done, 4);  // null across a row's end
          if ((four & 0xe0e0e0e0u) || shift_of_four == nullptr ||
              !lossy::DecodeFourLowRankF32(four, lattice_step, lattice_inverse, shift_of_four,
                                           ref + 4 * done, o + 4 * done)) {
            CKPT_RETURN_IF_ERROR(decode_elements(done, done + 4));
          }
        }
      }
      for (; done + 4 <= n && !states && !h.low_rank; done += 4) {
        uint32_t four;
        std::memcpy(&four, sym + done, 4);
        if ((four & 0xe0e0e0e0u) || !lossy::DecodeFourLatticeF32<kHistory != HistoryUse::kNone>(
                                        four, quantizer.step, quantizer.inverse_step,
                                        ref ? ref + 4 * done : nullptr, o + 4 * done)) {
          CKPT_RETURN_IF_ERROR(decode_elements(done, done + 4));
        }
      }
    }
    if constexpr (D == DType::kF32 && std::is_same_v<Q, UniformQuantizer> && !kLattice &&
                  kHistory == HistoryUse::kDelta) {
      // Groups of four direct symbols (nearly all) take the vector path; a group with a large or
      // verbatim symbol takes the general one.
      for (; done + 4 <= n; done += 4) {
        uint32_t four;
        std::memcpy(&four, sym + done, 4);
        if (four & 0xe0e0e0e0u) {  // a symbol >= 32
          CKPT_RETURN_IF_ERROR(decode_elements(done, done + 4));
        } else {
          DecodeFourDirectF32(four, quantizer.step, ref + 4 * done, o + 4 * done);
        }
      }
    }
#endif
    CKPT_RETURN_IF_ERROR(decode_elements(done, n));
    if (next_exact != exact_end || !bits.AtEnd()) {
      return Status::DataLoss("lossy payload: side streams not fully consumed");
    }
    return Status::Ok();
  }

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
                                          std::optional<std::span<const uint8_t>> reference) {
  static const LossyQuantizedCodec codec{LossyCodecOptions{}};
  return codec.EncodeExact(dtype, original, target, reference);
}

}  // namespace ckpt
