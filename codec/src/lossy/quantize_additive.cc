// The additive quantizers' element loops (quantize.h): r = T(p + V(z)), or T(R(z, p)) for log.
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "lossy/element.h"
#include "lossy/history.h"
#include "lossy/kernels_log_avx2.h"
#include "lossy/kernels_sse2.h"
#include "lossy/quantize.h"

namespace ckpt::lossy {
namespace {

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
    proposed = std::abs(t) <= kMaxQuantized;
    // + 0.0 turns a -0.0 into +0.0, as the decoder's integer q would be.
    const double q = proposed ? RoundToInteger(t) + 0.0 : 0.0;
    value = q * quantizer.step;
    z = ZigZag(static_cast<int64_t>(q));
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

// The log quantizer's element i. The usual element (finite, non-zero, different from its
// reference, with a valid symbol whose reconstruction meets the bound) is coded here, with the
// arithmetic of LogQuantizer::Propose and Reconstruct; any other goes through QuantizeElement,
// which computes the same values and handles every special case. `zero_floor` is the drop
// floor (keyframes only, where symbol 0 restores +0): within it, an element's error is at most
// the floor. NaN compares false and stays out; zeros keep their own coding, which restores -0.0
// as -0.0.
template <DType D>
inline void QuantizeLogElement(const LogQuantizer& log, const uint8_t* in, const uint8_t* ref,
                               size_t i, double eps, bool non_negative, double zero_floor,
                               uint8_t* recon, Quantized* out) {
  using E = Element<D>;
  const bool ratio_mode = log.mode == LogQuantizer::Mode::kRatio;
  constexpr double kMaxIndex = static_cast<double>(LogQuantizer::kMaxIndex);
  const double x = E::Load(in + i * E::kSize);
  const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
  if (std::abs(x) <= zero_floor && x != 0) {
    uint8_t* rp = recon + i * E::kSize;
    E::Store(0.0, rp);
    EmitElement<E::kSize>(true, 0, in + i * E::kSize, rp, i, out);
    return;
  }
  // Ratio mode codes x / p; absolute mode x itself. Either must be finite and non-zero.
  const double a = ratio_mode ? x / p : x;
  const double t = std::log2(std::abs(a)) * log.inverse_step - log.offset;
  const bool usual =
      x != p && x != 0 && p - p == 0 && std::abs(t) < kMaxIndex && (!ratio_mode || p != 0);
  if (!usual || !(log.step > 0)) [[unlikely]] {
    QuantizeElement<D, LogQuantizer, false>(log, in, ref, i, eps, non_negative, HistoryUse::kNone,
                                            recon, out);
    return;
  }
  const int64_t index = static_cast<int64_t>(RoundToInteger(t));
  uint64_t z;
  double magnitude;
  if (ratio_mode) {
    z = log.RatioSymbol(index, a < 0);
    magnitude = p * log.Power(index);
  } else {
    z = 1 + 2 * ZigZag(index - log.k0) + (x < 0 ? 1 : 0);
    magnitude = log.Power(index);
  }
  const double restored = a < 0 ? -magnitude : magnitude;
  uint8_t* rp = recon + i * E::kSize;
  E::Store(restored, rp);
  const double r = E::Load(rp);
  if (!log.Valid(z) || !Acceptable(x, r, PointwiseBound(eps, x), non_negative)) [[unlikely]] {
    QuantizeElement<D, LogQuantizer, false>(log, in, ref, i, eps, non_negative, HistoryUse::kNone,
                                            recon, out);
    return;
  }
  EmitElement<E::kSize>(true, z, in + i * E::kSize, rp, i, out);
}

// The log quantizer's loop: Adam's exp_avg_sq deltas (ratio mode, F32) four at a time through
// the AVX2 kernel where the CPU has it, a group it declines element by element; the rest one by
// one. Either way the same symbols and reconstructions.
template <DType D>
void QuantizeLogElements(const LogQuantizer& log, const uint8_t* in, const uint8_t* ref, size_t n,
                         double eps, bool non_negative, uint8_t* recon, Quantized* out) {
  const double zero_floor = ref ? 0.0 : log.zero_floor;
  size_t i = 0;
#ifdef CKPT_LOSSY_AVX2
  if constexpr (D == DType::kF32) {
    if (ref && log.mode == LogQuantizer::Mode::kRatio && log.step > 0 && n >= 4 && CpuHasAvx2()) {
      const RatioKernelConstants constants(log, eps, non_negative);
      for (; i + 4 <= n; i += 4) {
        if (!QuantizeRatioFourF32(in + 4 * i, ref + 4 * i, constants, recon + 4 * i,
                                  &out->symbols[i])) {
          for (size_t k = i; k < i + 4; ++k) {
            QuantizeLogElement<D>(log, in, ref, k, eps, non_negative, zero_floor, recon, out);
          }
        }
      }
    }
  }
#endif
  for (; i < n; ++i) {
    QuantizeLogElement<D>(log, in, ref, i, eps, non_negative, zero_floor, recon, out);
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
      const double q = RoundToInteger(t) + 0.0;
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
        out->symbols[i] = static_cast<uint8_t>(ZigZag(static_cast<int64_t>(q)));
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

}  // namespace

template <DType D>
void QuantizeAdditive(const QuantizerSet& set, const uint8_t* in, const uint8_t* ref, size_t n,
                      double bound, bool non_negative, HistoryUse history, uint8_t* recon,
                      Quantized* out) {
  switch (set.kind) {
    case Quantizer::kExponent:
      return QuantizeElements<D>(set.exponent, in, ref, n, bound, non_negative, history, recon,
                                 out);
    case Quantizer::kFloat:
      return QuantizeElements<D>(set.floating, in, ref, n, bound, non_negative, history, recon,
                                 out);
    case Quantizer::kCosine:
      return QuantizeElements<D>(set.cosine, in, ref, n, bound, non_negative, history, recon, out);
    case Quantizer::kLog:
      return QuantizeElements<D>(set.log, in, ref, n, bound, non_negative, history, recon, out);
    default:
      return QuantizeElements<D>(set.uniform, in, ref, n, bound, non_negative, history, recon, out);
  }
}

#define CKPT_INSTANTIATE(D)                                                                      \
  template void QuantizeAdditive<D>(const QuantizerSet&, const uint8_t*, const uint8_t*, size_t, \
                                    double, bool, HistoryUse, uint8_t*, Quantized*);
CKPT_LOSSY_DTYPES(CKPT_INSTANTIATE)
#undef CKPT_INSTANTIATE

}  // namespace ckpt::lossy
