// The quantizers of the lossy codec (internal). Each maps a delta d = x - p (finite) to a symbol
// z, and a symbol back to a delta value. z = 0 always means "no change". The codec computes the
// reconstruction p + Value(z) exactly as the decoder will and stores the element verbatim when
// it misses the bound, so a quantizer only has to be good, never correct:
//
//   uniform   z = zigzag(round(d / step)), step = 2·bound: the lattice quantizer (QD-Compressor,
//             Delta-DNN); unbiased rounding error.
//   exponent  LC-Checkpoint: bucket by sign and binary exponent of d, each bucket represented by
//             the midpoint of its smallest and largest |d|; |d| below 2^e0 <= bound is 0.
//   float     OMC: d / scale (scale = max |d|, the per-variable transformation) rounded to a
//             small float format with E exponent and M mantissa bits; M defaults to the fewest
//             that meet the bound for the largest values.
//   cosine    CosSGD: u = arccos(d / ||d||) / pi on 2^s + 1 levels (finer for large |d|); the
//             decoder evaluates cos with DeterministicCos, so levels are bit-identical anywhere.
//   log       pointwise-relative bounds: a lattice of pitch 2 log2(1 + eps) on log2|x|, either
//             multiplicative against the reference (ratio mode) or absolute; not additive, so
//             it reconstructs through Reconstruct(z, p) rather than p + Value(z).
//
// Parameters are serialized into the payload after the common header (docs/format.md).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lossy/deterministic_math.h"

namespace ckpt::lossy {

inline uint64_t ZigZag(int64_t q) {
  return (static_cast<uint64_t>(q) << 1) ^ static_cast<uint64_t>(q >> 63);
}
inline int64_t UnZigZag(uint64_t z) {
  return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
}

// Round half to even without a libm call or a branch: exact for |v| < 2^51 (v + 1.5 * 2^52 then
// lies in [2^52, 2^53), where doubles are the integers; the magic number is even, so ties keep
// their parity). A result of zero is +0.0.
inline double RoundToInteger(double v) {
  constexpr double kMagic = 0x1.8p52;
  return (v + kMagic) - kMagic;
}

// |q| beyond this is stored verbatim (keeps symbols within 63 bits and the rounding exact).
inline constexpr double kMaxQuantized = 0x1p50;

// The lattice index of a reference value p (lattice mode): round(p / step), computed as
// RoundToInteger(p * inverse_step) + 0.0. False when p is not finite or lies beyond the lattice
// (|p / step| > 2^50); such a reference has no index.
inline bool LatticeIndex(double p, double inverse_step, double* k) {
  const double t = p * inverse_step;
  if (!(std::abs(t) <= kMaxQuantized)) return false;
  *k = RoundToInteger(t) + 0.0;
  return true;
}

struct UniformQuantizer {
  double step = 0;
  double inverse_step = 0;

  explicit UniformQuantizer(double s) : step(s), inverse_step(s > 0 ? 1.0 / s : 0.0) {}
  bool Propose(double d, uint64_t* z) const {
    const double t = d * inverse_step;
    if (!(std::abs(t) <= kMaxQuantized)) return false;
    *z = ZigZag(static_cast<int64_t>(RoundToInteger(t)));
    return true;
  }
  double Value(uint64_t z) const { return static_cast<double>(UnZigZag(z)) * step; }
  bool Valid(uint64_t) const { return true; }
};

// Quantizers whose symbols index a table of delta values.
struct TableQuantizer {
  std::vector<double> values;  // values[z]; values[0] == 0
  double Value(uint64_t z) const { return values[z]; }
  bool Valid(uint64_t z) const { return z < values.size(); }
};

// LC-Checkpoint's exponent buckets. z = 1 + 2k + (d < 0) for bucket k = floor(log2|d|) - e0.
struct ExponentQuantizer : TableQuantizer {
  static constexpr int kMaxBuckets = 64;
  int e0 = 0;

  bool Propose(double d, uint64_t* z) const {
    const double a = std::abs(d);
    if (a < std::ldexp(1.0, e0)) {
      *z = 0;
      return true;
    }
    // floor(log2 a) from the exponent field (a >= 2^e0 > 0 is normal unless e0 < -1022).
    const int k = static_cast<int>((std::bit_cast<uint64_t>(a) >> 52) & 0x7ff) - 1023 - e0;
    if (k < 0 || 1 + 2 * static_cast<uint64_t>(k) + 1 >= values.size()) return false;
    *z = 1 + 2 * static_cast<uint64_t>(k) + (d < 0 ? 1 : 0);
    return true;
  }
};

// OMC's low-bit floats after normalization by `scale`. Index i = (exponent_field << M) | m,
// z = 2i - 1 + (d < 0) for i >= 1.
struct FloatQuantizer : TableQuantizer {
  static constexpr int kMaxBits = 16;  // E + M
  double scale = 0;
  int exponent_bits = 4;
  int mantissa_bits = 0;

  // Magnitude of index i relative to scale (exact: a power of two times a small integer).
  double Magnitude(uint64_t i) const {
    const int bias = (1 << exponent_bits) - 1;
    const uint64_t field = i >> mantissa_bits;
    const uint64_t m = i & ((uint64_t{1} << mantissa_bits) - 1);
    if (field == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mantissa_bits);
    return std::ldexp(static_cast<double>((uint64_t{1} << mantissa_bits) + m),
                      static_cast<int>(field) - bias - mantissa_bits);
  }
  uint64_t IndexCount() const { return uint64_t{1} << (exponent_bits + mantissa_bits); }

  // Without a table (auto's size estimate on a sample), values are computed directly.
  double Value(uint64_t z) const {
    if (!values.empty()) return values[z];
    if (z == 0) return 0.0;
    const double v = scale * Magnitude((z + 1) / 2);
    return z % 2 ? v : -v;
  }
  bool Valid(uint64_t z) const { return z < 2 * IndexCount() - 1; }

  void BuildTable() {
    values.assign(2 * IndexCount() - 1, 0.0);
    for (uint64_t i = 1; i < IndexCount(); ++i) {
      const double v = scale * Magnitude(i);
      values[2 * i - 1] = v;
      values[2 * i] = -v;
    }
  }

  bool Propose(double d, uint64_t* z) const {
    if (!(scale > 0)) return false;
    const double v = std::abs(d) / scale;
    if (!std::isfinite(v)) return false;  // an overflowing delta, or a denormal scale
    const int bias = (1 << exponent_bits) - 1;
    int exponent = 0;
    std::frexp(v, &exponent);
    const int e = exponent - 1;  // v in [2^e, 2^(e+1))
    int64_t i;
    if (v == 0 || e < 1 - bias) {  // subnormal range (or zero)
      i = static_cast<int64_t>(RoundToInteger(std::ldexp(v, bias - 1 + mantissa_bits)));
    } else {
      const double m = RoundToInteger(std::ldexp(v, mantissa_bits - e)) -
                       static_cast<double>(uint64_t{1} << mantissa_bits);
      i = (static_cast<int64_t>(e + bias) << mantissa_bits) + static_cast<int64_t>(m);
    }
    if (i <= 0) {
      *z = 0;
      return true;
    }
    if (static_cast<uint64_t>(i) >= IndexCount()) return false;
    *z = 2 * static_cast<uint64_t>(i) - 1 + (d < 0 ? 1 : 0);
    return true;
  }
};

// CosSGD's cosine levels: level k in [0, 2^s] stands for norm * cos(pi * k / 2^s); the middle
// level is exactly 0. z = zigzag(center - k), so small positive deltas get small symbols.
struct CosineQuantizer : TableQuantizer {
  static constexpr int kMaxLevelBits = 16;
  double norm = 0;
  int level_bits = 1;

  int64_t Center() const { return int64_t{1} << (level_bits - 1); }

  // The value of level k, from the table or (auto's estimate on a sample) computed directly.
  double Level(int64_t k) const {
    if (!values.empty()) return values[ZigZag(Center() - k)];
    if (k == Center()) return 0.0;
    const double pi = 3.14159265358979323846;
    return norm * DeterministicCos(pi * static_cast<double>(k) /
                                   static_cast<double>(int64_t{1} << level_bits));
  }
  double Value(uint64_t z) const {
    if (!values.empty()) return values[z];
    return Level(Center() - UnZigZag(z));
  }
  bool Valid(uint64_t z) const { return z <= (uint64_t{1} << level_bits); }

  void BuildTable() {
    const int64_t last = int64_t{1} << level_bits;
    const double pi = 3.14159265358979323846;
    values.assign(static_cast<size_t>(last + 1), 0.0);
    for (int64_t k = 0; k <= last; ++k) {
      const uint64_t z = ZigZag(Center() - k);
      values[z] =
          k == Center()
              ? 0.0
              : norm * DeterministicCos(pi * static_cast<double>(k) / static_cast<double>(last));
    }
  }

  bool Propose(double d, uint64_t* z) const {
    // A delta that overflowed (x - p of two huge values) has no level; d / norm would be NaN
    // when the norm overflowed too.
    if (!(norm > 0) || !std::isfinite(d)) return false;
    const double pi = 3.14159265358979323846;
    const int64_t last = int64_t{1} << level_bits;
    const double u = std::acos(std::clamp(d / norm, -1.0, 1.0)) / pi;
    const int64_t k0 = static_cast<int64_t>(RoundToInteger(u * static_cast<double>(last)));
    // acos is only a guide (libm may differ by an ulp): take the nearest table level.
    int64_t best = -1;
    double best_error = 0;
    for (int64_t k = std::max<int64_t>(0, k0 - 1); k <= std::min(last, k0 + 1); ++k) {
      const double error = std::abs(d - Level(k));
      if (best < 0 || error < best_error) {
        best = k;
        best_error = error;
      }
    }
    *z = ZigZag(Center() - best);
    return true;
  }
};

// Pointwise-relative bounds: a lattice of pitch `step` (= 2 log2(1 + eps)) on log2|x|.
//   ratio:    r = p * 2^((q + offset) step), negated on a sign change; z = 2 zigzag(q) + flip,
//             plus 1 with an offset (where q = 0 is no longer "unchanged").
//             `offset` (|offset| <= 1/2, payload version 5; 0 before) centres the lattice on
//             the chunk's typical ratio: Adam's exp_avg_sq decays by a known factor between
//             versions and grows by fresh squared gradients, so most ratios sit near one value
//             that is rarely a lattice point.
//   absolute: r = ±2^(k step), k = k0 + unzigzag((z - 1) >> 1), negative if (z - 1) is odd.
// In both, z = 0 is "unchanged": r = p (0 in a keyframe).
struct LogQuantizer {
  enum class Mode : uint8_t { kRatio = 1, kAbsolute = 2 };
  static constexpr int64_t kMaxIndex = int64_t{1} << 24;
  static constexpr int64_t kCacheSize = 4096;
  Mode mode = Mode::kAbsolute;
  double step = 0;
  double inverse_step = 0;  // 1 / step: the encoder's index of a value (SetStep sets both)
  int32_t k0 = 0;
  double offset = 0;  // ratio mode: the lattice's shift, in steps
  // Encoder only (LossyCodecOptions::zero_below_mean), keyframes: finite elements with
  // |x| <= zero_floor are coded as symbol 0, which a keyframe restores as 0. Not stored: the
  // decoder needs nothing new.
  double zero_floor = 0;
  // Powers E(n) already computed, for n in [cache_base, cache_base + kCacheSize) around the
  // mode's centre (NaN: not yet). A cache, so results never depend on it; call ResetCache()
  // after changing mode, step or k0. Not thread-safe (each coding call has its own quantizer).
  mutable std::vector<double> cache;
  int64_t cache_base = 0;

  void SetStep(double s) {
    step = s;
    inverse_step = 1 / s;
  }

  void ResetCache() {
    cache_base = (mode == Mode::kRatio ? 0 : int64_t{k0}) - kCacheSize / 2;
    cache.assign(kCacheSize, std::numeric_limits<double>::quiet_NaN());
  }

  [[gnu::always_inline]] bool Propose(double x, double p, uint64_t* z) const {
    if (x == p) {  // includes ±0 against ±0; the codec's sign check decides
      *z = 0;
      return true;
    }
    if (!(x != 0) || !std::isfinite(x) || !(step > 0)) return false;
    if (mode == Mode::kRatio) {
      if (!(p != 0) || !std::isfinite(p)) return false;
      const double ratio = x / p;
      const double t = std::log2(std::abs(ratio)) * inverse_step - offset;
      if (!(std::abs(t) < static_cast<double>(kMaxIndex))) return false;
      *z = RatioSymbol(static_cast<int64_t>(RoundToInteger(t)), ratio < 0);
      return true;
    }
    const double t = std::log2(std::abs(x)) * inverse_step;
    if (!(std::abs(t) < static_cast<double>(kMaxIndex))) return false;
    const int64_t k = static_cast<int64_t>(RoundToInteger(t)) - k0;
    *z = 1 + 2 * ZigZag(k) + (x < 0 ? 1 : 0);
    // Far from k0 (a chunk spanning more orders of magnitude than a tiny eps can index) the
    // symbol would be one the decoder rejects: the element is stored verbatim instead.
    return Valid(*z);
  }
  // 2^((n + offset) step); offset is 0 in absolute mode (and n + 0.0 is exactly n).
  [[gnu::always_inline]] double Power(int64_t n) const {
    const uint64_t slot = static_cast<uint64_t>(n - cache_base);
    if (slot >= cache.size()) return DeterministicExp2((static_cast<double>(n) + offset) * step);
    double& power = cache[slot];
    if (power != power) power = DeterministicExp2((static_cast<double>(n) + offset) * step);
    return power;
  }
  // Ratio mode's symbol of index q (never 0, "unchanged", when there is an offset).
  [[gnu::always_inline]] uint64_t RatioSymbol(int64_t q, bool flip) const {
    return 2 * ZigZag(q) + (flip ? 1 : 0) + (offset != 0 ? 1 : 0);
  }
  [[gnu::always_inline]] double Reconstruct(uint64_t z, double p) const {
    if (z == 0) return p;
    if (mode == Mode::kRatio) {
      const uint64_t y = offset != 0 ? z - 1 : z;
      const double m = p * Power(UnZigZag(y >> 1));
      return (y & 1) ? -m : m;
    }
    const uint64_t y = z - 1;
    const double m = Power(UnZigZag(y >> 1) + k0);
    return (y & 1) ? -m : m;
  }
  // Symbols any encoder has written: absolute-mode indices |k| <= 2^24 + 10^9 (encoders that
  // clamped the centre k0 to ±10^9 rather than ±kMaxIndex, and did not check their symbols,
  // wrote payloads with indices far beyond ±2^25, which must decode). Larger ones only come from
  // corrupt data.
  bool Valid(uint64_t z) const { return z < (uint64_t{1} << 33); }
};

}  // namespace ckpt::lossy
