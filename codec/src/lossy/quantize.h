// The encoder's element loops (internal to the lossy codec): each element's symbol, its extra
// bits or its verbatim bytes, and its reconstruction, computed exactly as the decoder will
// compute it, then checked against the bound (docs/format.md, "Reconstruction").
//
//   quantize_additive.cc  r = T(p + V(z)) for the five quantizers (log: r = T(R(z, p)))
//   quantize_lattice.cc   r = T((kp + q) * step) on the lattice, and its low-rank shift
//
// Each loop takes the common case without data-dependent branches (SSE2/AVX2 kernels where the
// CPU has them) and hands every other element to a per-element function that handles every
// special case with the same arithmetic. Pure functions of their arguments.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/base/dtype.h"
#include "lossy/bit_stream.h"
#include "lossy/format.h"
#include "lossy/symbols.h"

namespace ckpt::lossy {

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

// Quantizes n elements with set.kind's quantizer (not the lattice): symbols, verbatim elements,
// and the reconstruction into `recon` (n elements).
template <DType D>
void QuantizeAdditive(const QuantizerSet& set, const uint8_t* in, const uint8_t* ref, size_t n,
                      double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                      Quantized* out);

// Quantizes n elements on the lattice of `u` (ref null: a keyframe). With kExactTarget an
// element is accepted only when its reconstruction has exactly its bits (EncodeExactOnLattice),
// and with history every element's own state is recorded in out->explicit_history.
template <DType D, bool kExactTarget>
void QuantizeLattice(const UniformQuantizer& u, const uint8_t* in, const uint8_t* ref, size_t n,
                     double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                     Quantized* out);

// Elements [begin, end) of a delta with history on the low-rank lattice of pitch step /
// kLowRankFine, in order; shift[k] is element begin + k's shift, and out->symbols and
// out->history hold at least `end` elements.
template <DType D>
void QuantizeLowRankRange(double step, const int32_t* shift, const uint8_t* in, const uint8_t* ref,
                          size_t begin, size_t end, double bound, bool non_negative, uint8_t* recon,
                          Quantized* out);

// The n elements of a delta with history on the low-rank lattice, shift[i] element i's shift.
template <DType D>
void QuantizeLowRank(double step, const int32_t* shift, const uint8_t* in, const uint8_t* ref,
                     size_t n, double bound, bool non_negative, uint8_t* recon, Quantized* out);

}  // namespace ckpt::lossy
