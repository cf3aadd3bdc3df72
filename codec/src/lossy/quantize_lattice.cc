// The lattice's element loops (quantize.h): r = T((kp + q) * step), and on the low-rank lattice
// r = T((kp + shift + 64 q) * fine).
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "lossy/element.h"
#include "lossy/history.h"
#include "lossy/kernels_avx2.h"
#include "lossy/kernels_sse2.h"
#include "lossy/quantize.h"

namespace ckpt::lossy {
namespace {

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
  const bool indexed = LatticeIndex(p, u.inverse_step, &kp);
  if (!indexed && ref && std::memcmp(xp, ref + i * E::kSize, E::kSize) == 0) {
    std::memcpy(rp, xp, E::kSize);  // z = 0 restores a reference without an index as it is
    return EmitElement<E::kSize>(true, 0, xp, rp, i, out);
  }
  bool accepted = false;
  uint64_t z = 0;
  const double t = x * u.inverse_step;
  if (std::abs(t) <= kMaxQuantized) {
    const double q = RoundToInteger(t) + 0.0 - kp;
    if (std::abs(q) <= kMaxQuantized && (indexed || q != 0)) {
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
      z = ZigZag(static_cast<int64_t>(q));
    }
  }
  EmitElement<E::kSize>(accepted, z, xp, rp, i, out);
}

}  // namespace

// Quantizes n elements in lattice mode. As in QuantizeElementsImpl, the common case (a direct
// symbol, strictly inside the bound, not a zero, not negative in a non-negative chunk; with
// kExactTarget: the exact bits) is done without data-dependent branches, and anything else
// goes through QuantizeLatticeElement, which computes the same values.
template <DType D, bool kExactTarget>
void QuantizeLattice(const UniformQuantizer& u, const uint8_t* in, const uint8_t* ref, size_t n,
                     double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                     Quantized* out) {
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
        fast = QuantizeFourLatticeF32<kExactTarget>(in + 4 * i, ref ? ref + 4 * i : nullptr, u.step,
                                                    u.inverse_step, bound, non_negative,
                                                    recon + 4 * i, &out->symbols[i]);
      } else if constexpr (!kExactTarget) {
        fast = QuantizeFourLatticeF32<false, true>(
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
    const double kp = RoundToInteger(pt) + 0.0;
    const double q = RoundToInteger(t) + 0.0 - kp;
    E::Store((kp + q) * u.step, rp);
    const double r = E::Load(rp);
    bool fast = (std::abs(pt) <= kMaxQuantized) & (std::abs(t) <= kMaxQuantized) &
                (std::abs(q) < kDirectSymbols / 2 - 0.5);
    if constexpr (kExactTarget) {
      fast &= std::memcmp(rp, xp, E::kSize) == 0;
    } else {
      fast &= (std::abs(x - r) < bound) & (x != 0) & !(non_negative & std::signbit(r));
    }
    if (fast) [[likely]] {
      out->symbols[i] = static_cast<uint8_t>(ZigZag(static_cast<int64_t>(q)));
    } else {
      QuantizeLatticeElement<D, kExactTarget>(u, in, ref, i, bound, non_negative, history, recon,
                                              out);
    }
  }
}

namespace {

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
  const bool indexed = LatticeIndex(p, inverse_fine, &kp);
  if (!indexed && std::memcmp(xp, ref + i * E::kSize, E::kSize) == 0) {
    std::memcpy(rp, xp, E::kSize);
    return EmitElement<E::kSize>(true, 0, xp, rp, i, out);
  }
  const double base = indexed ? kp + shift : 0.0;
  bool accepted = false;
  uint64_t z = 0;
  const double t = x * inverse_fine;
  if (std::abs(t) <= kMaxQuantized) {
    const double q = RoundToInteger((t - base) / kLowRankFine) + 0.0;
    if (std::abs(q) <= kMaxQuantized / kLowRankFine && (indexed || q != 0)) {
      E::Store((base + kLowRankFine * q) * fine, rp);
      SetHistory<D>(rp, NextHistory(before, q));
      accepted = Acceptable(x, E::Load(rp), bound, non_negative);
      z = ZigZag(static_cast<int64_t>(q));
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
    if (QuantizeEightLowRankF32(in + 4 * i, ref + 4 * i, shift + (i - begin), fine, inverse_fine,
                                bound, non_negative, recon + 4 * i, &out->symbols[i],
                                &out->history[i])) {
      continue;
    }
    for (size_t four = i; four < i + 8; four += 4) {
      if (!QuantizeFourLowRankF32(in + 4 * four, ref + 4 * four, shift + (four - begin), fine,
                                  inverse_fine, bound, non_negative, recon + 4 * four,
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

#endif

}  // namespace

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
      if (!QuantizeFourLowRankF32(in + 4 * i, ref + 4 * i, shift + (i - begin), fine, inverse_fine,
                                  bound, non_negative, recon + 4 * i, &out->symbols[i],
                                  &out->history[i])) {
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

template <DType D>
void QuantizeLowRank(double step, const int32_t* shift, const uint8_t* in, const uint8_t* ref,
                     size_t n, double bound, bool non_negative, uint8_t* recon, Quantized* out) {
  out->symbols.resize(n);
  out->history.resize(n);
  QuantizeLowRankRange<D>(step, shift, in, ref, 0, n, bound, non_negative, recon, out);
}

// The low-rank shift of a chunk's elements for a decoder that visits them in increasing order:

#define CKPT_INSTANTIATE(D)                                                                        \
  template void QuantizeLattice<D, false>(const UniformQuantizer&, const uint8_t*, const uint8_t*, \
                                          size_t, double, bool, HistoryUse, uint8_t*, Quantized*); \
  template void QuantizeLattice<D, true>(const UniformQuantizer&, const uint8_t*, const uint8_t*,  \
                                         size_t, double, bool, HistoryUse, uint8_t*, Quantized*);  \
  template void QuantizeLowRankRange<D>(double, const int32_t*, const uint8_t*, const uint8_t*,    \
                                        size_t, size_t, double, bool, uint8_t*, Quantized*);       \
  template void QuantizeLowRank<D>(double, const int32_t*, const uint8_t*, const uint8_t*, size_t, \
                                   double, bool, uint8_t*, Quantized*);
CKPT_LOSSY_DTYPES(CKPT_INSTANTIATE)
#undef CKPT_INSTANTIATE

}  // namespace ckpt::lossy
