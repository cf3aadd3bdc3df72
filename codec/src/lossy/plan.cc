// The lossy encoder's decisions (plan.h).
#include "lossy/plan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "entropy/rans.h"
#include "lossy/element.h"
#include "lossy/history.h"
#include "lossy/kernels_sse2.h"

namespace ckpt::lossy {
namespace {

// auto and the log quantizer's mode: candidates are compared on about this many elements spread
// over the chunk.
constexpr size_t kAutoSampleElements = 1024;
// Matrices smaller than this on either side are coded flat.
constexpr uint32_t kMinLowRankSide = 16;
// The ranks the encoder compares with the plain lattice (multiples of 8 up to this), and the
// rows it compares them on. An unshifted fine lattice (rank 0) is not a candidate: without a
// shift it only spends the finer lattice's bits.
constexpr uint32_t kLowRankMaxRank = 16;
constexpr uint32_t kLowRankSampleRows = 32;

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

// One pass over the chunk's finite deltas: what the quantizers' parameters are made of.
struct DeltaStats {
  double max_abs = 0;
  double sum_squares = 0;
  // Exponent buckets (by floor(log2|d|) - e0, then sign): smallest and largest |d|.
  std::vector<double> bucket_min, bucket_max;
  int e0 = 0;
};

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
    if constexpr (D == DType::kF32) i = FiniteRangeF32(in, n, &low, &high);
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

// Estimated coded bits of `q` (order-0 entropy of the symbols plus raw side data).
double EstimatedBits(const Quantized& q, size_t element_size) {
  rans::Histogram h(1);
  for (uint8_t s : q.symbols) h.Add(0, s);
  return h.EntropyBits() + static_cast<double>(q.extra_bits) +
         8.0 * static_cast<double>(q.exact_count * element_size);
}

// About kAutoSampleElements elements spread evenly over a chunk (every stride-th), with their
// references, and room for their reconstructions.
template <DType D>
struct Sample {
  Sample(const uint8_t* in, const uint8_t* ref, size_t n)
      : stride(std::max<size_t>(1, n / kAutoSampleElements)),
        size((n + stride - 1) / stride),
        values(size * Element<D>::kSize),
        references(ref ? size * Element<D>::kSize : 0),
        scratch(size * Element<D>::kSize) {
    constexpr size_t kSize = Element<D>::kSize;
    for (size_t i = 0; i < size; ++i) {
      std::memcpy(values.data() + i * kSize, in + i * stride * kSize, kSize);
      if (ref) std::memcpy(references.data() + i * kSize, ref + i * stride * kSize, kSize);
    }
  }
  const uint8_t* reference() const { return references.empty() ? nullptr : references.data(); }

  const size_t stride;
  const size_t size;
  std::vector<uint8_t> values, references, scratch;
};

// auto: quantizes an evenly spread sample of the chunk with every quantizer (parameters from
// the sample too) and picks the one with the smallest estimated size (symbol entropy + side
// data + parameters).
template <DType D>
Quantizer ChooseQuantizer(const LossyCodecOptions& options, const uint8_t* in, const uint8_t* ref,
                          size_t n, double bound, bool non_negative) {
  Sample<D> sample(in, ref, n);
  const DeltaStats stats =
      CollectStats<D>(sample.values.data(), sample.reference(), sample.size, bound);
  Quantizer best = Quantizer::kUniform;
  double best_bits = 0;
  for (Quantizer kind :
       {Quantizer::kUniform, Quantizer::kExponent, Quantizer::kFloat, Quantizer::kCosine}) {
    QuantizerSet set;
    Configure(stats, bound, options, kind, /*build_tables=*/false, &set);
    Quantized q;
    QuantizeAdditive<D>(set, sample.values.data(), sample.reference(), sample.size, bound,
                        non_negative, HistoryUse::kNone, sample.scratch.data(), &q);
    const double bits = EstimatedBits(q, Element<D>::kSize) * static_cast<double>(n) /
                            static_cast<double>(sample.size) +
                        8.0 * static_cast<double>(set.ParamBytes());
    if (kind == Quantizer::kUniform || bits < best_bits) {
      best = kind;
      best_bits = bits;
    }
  }
  return best;
}

// The mean |x| of the finite elements (0 if none). Summed in long double: a sum of F64
// elements near the dtype's maximum overflows a double.
template <DType D>
double MeanAbsolute(const uint8_t* in, size_t n) {
  using E = Element<D>;
  long double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = std::abs(E::Load(in + i * E::kSize));
    const bool finite = a - a == 0;
    sum += finite ? a : 0.0;
    count += finite ? 1 : 0;
  }
  return count ? static_cast<double>(sum / static_cast<long double>(count)) : 0.0;
}

// log: absolute mode (k0 = the sample's mean log-index) or, for deltas, ratio mode, whichever
// codes an evenly spread sample of the chunk smaller.
template <DType D>
void ChooseLogMode(const uint8_t* in, const uint8_t* ref, size_t n, double eps, bool non_negative,
                   QuantizerSet* set) {
  using E = Element<D>;
  LogQuantizer& log = set->log;
  Sample<D> sample(in, ref, n);
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < sample.size; ++i) {
    const double x = E::Load(sample.values.data() + i * E::kSize);
    if (x != 0 && std::isfinite(x) && std::abs(x) > log.zero_floor) {
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
  QuantizeAdditive<D>(*set, sample.values.data(), sample.reference(), sample.size, eps,
                      non_negative, HistoryUse::kNone, sample.scratch.data(), &absolute);
  log.mode = LogQuantizer::Mode::kRatio;
  log.ResetCache();
  QuantizeAdditive<D>(*set, sample.values.data(), sample.reference(), sample.size, eps,
                      non_negative, HistoryUse::kNone, sample.scratch.data(), &ratio);
  // Ratio mode on a lattice shifted to the sample's median ratio, when that codes smaller.
  std::vector<double> indices;
  indices.reserve(sample.size);
  for (size_t i = 0; i < sample.size; ++i) {
    const double x = E::Load(sample.values.data() + i * E::kSize);
    const double p = E::Load(sample.references.data() + i * E::kSize);
    const double t = std::log2(std::abs(x / p)) * log.inverse_step;
    if (x != 0 && p != 0 && std::isfinite(t)) indices.push_back(t);
  }
  Quantized shifted;
  double offset = 0;
  if (!indices.empty()) {
    auto middle = indices.begin() + static_cast<std::ptrdiff_t>(indices.size() / 2);
    std::nth_element(indices.begin(), middle, indices.end());
    offset = *middle - std::nearbyint(*middle);
    if (!(std::abs(offset) <= 0.5)) offset = 0;
  }
  if (offset != 0) {
    log.offset = offset;
    log.ResetCache();
    QuantizeAdditive<D>(*set, sample.values.data(), sample.reference(), sample.size, eps,
                        non_negative, HistoryUse::kNone, sample.scratch.data(), &shifted);
  }
  const double absolute_bits = EstimatedBits(absolute, E::kSize);
  const double ratio_bits = EstimatedBits(ratio, E::kSize);
  const double shifted_bits =
      offset != 0 ? EstimatedBits(shifted, E::kSize) + 64 : std::numeric_limits<double>::infinity();
  if (shifted_bits < ratio_bits && shifted_bits < absolute_bits) return;  // shifted, as set
  log.offset = 0;
  log.mode =
      ratio_bits <= absolute_bits ? LogQuantizer::Mode::kRatio : LogQuantizer::Mode::kAbsolute;
  log.ResetCache();
}

// How a lattice delta of a matrix with history is coded: on the plain lattice, or on the fine
// lattice shifted by `shift`.
struct LowRankChoice {
  bool use = false;
  LowRankShift shift;
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
  if constexpr (D == DType::kF32) {
    i = DeltaInStepsF32(in, ref, n, inverse_step, kMaxSteps, delta.get());
  }
#endif
  for (; i < n; ++i) {
    const double d = (E::Load(in + i * E::kSize) - E::Load(ref + i * E::kSize)) * inverse_step;
    delta[i] = std::isfinite(d) ? static_cast<float>(std::clamp(d, -kMaxSteps, kMaxSteps)) : 0.0f;
  }
  LowRankChoice choice;
  choice.shift = FitLowRankShift(std::span<const float>(delta.get(), n), rows, cols,
                                 kLowRankMaxRank, u.step, u.step / kLowRankFine);
  const LowRankShift& fitted = choice.shift;
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
        QuantizeLattice<D, false>(u, in + first * E::kSize, ref + first * E::kSize, cols, bound,
                                  non_negative, HistoryUse::kDelta, recon.data(), &q);
      } else {
        QuantizeLowRank<D>(u.step, &sampled_shift[size_t{r / stride} * cols], in + first * E::kSize,
                           ref + first * E::kSize, cols, bound, non_negative, recon.data(), &q);
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

}  // namespace

template <DType D>
Result<ChunkPlan> PlanChunk(const LossyCodecOptions& options, const uint8_t* in, const uint8_t* ref,
                            size_t n, const ExactTarget* exact) {
  ChunkPlan plan;
  // The range of the finite values: for relative bounds, and to know whether the chunk is
  // non-negative (then no element may restore negative).
  double lo, hi;
  FiniteRange<D>(in, n, &lo, &hi);
  const double bound = exact ? exact->bound : ResolveBound(options.bound, lo, hi);
  plan.bound = bound;
  plan.non_negative = n > 0 && lo >= 0;

  const bool pointwise = !exact && options.bound.kind == ErrorBound::Kind::kPointwise;
  Quantizer kind = exact ? Quantizer::kUniform : options.quantizer;
  if (pointwise) {
    kind = Quantizer::kLog;
  } else if (kind == Quantizer::kLog) {
    return Status::InvalidArgument("lossy codec: the log quantizer needs a pointwise bound");
  } else if (kind == Quantizer::kAuto) {
    kind = ChooseQuantizer<D>(options, in, ref, n, bound, plan.non_negative);
  }
  DeltaStats stats;
  if (kind != Quantizer::kUniform && kind != Quantizer::kLog) {
    stats = CollectStats<D>(in, ref, n, bound);
  }
  QuantizerSet& set = plan.quantizers;
  Configure(stats, bound, options, kind, /*build_tables=*/true, &set);
  if (kind == Quantizer::kLog) {
    if (!ref && options.zero_below_mean > 0) {
      set.log.zero_floor = options.zero_below_mean * MeanAbsolute<D>(in, n);
    }
    ChooseLogMode<D>(in, ref, n, bound, plan.non_negative, &set);
  }
  if (exact) set.uniform = UniformQuantizer(exact->step);
  plan.lattice = exact || (options.reclaimable && kind == Quantizer::kUniform);

  plan.contexts = n >= kMinElementsForContexts;
  // Element history where it fits; an exact re-encoding carries it exactly when the payload it
  // re-encodes did (its reconstructions have history bits to reproduce).
  const bool carries_history =
      kCanCarryHistory<D> &&
      (exact ? exact->history
             : options.history && plan.contexts && !pointwise &&
                   HistoryFits<D>(std::max(std::abs(lo), std::abs(hi)) + bound, bound));
  if (carries_history) plan.history = ref ? HistoryUse::kDelta : HistoryUse::kKeyframe;
  plan.explicit_history = exact && carries_history;
  // Deltas with history code each symbol in the context of its element's state. Lattice and
  // log deltas without it code order-0: the two previous symbols gain little on training runs
  // while serializing the decoder (docs/decisions.md, "Order-0 keyframes"). Elsewhere the two
  // previous symbols are planned, and the encoder keeps them only where they pay
  // (CountSymbols, encoder.cc).
  plan.context_model = !plan.contexts                                     ? kContextModelNone
                       : plan.history == HistoryUse::kDelta               ? kContextModelHistory
                       : (plan.lattice || kind == Quantizer::kLog) && ref ? kContextModelNone
                                                                          : kContextModelPrevious2;
  // A low-rank shift where the chunk is a matrix and one pays (lattice deltas with history).
  const uint32_t cols = options.low_rank_columns;
  if (!exact && plan.lattice && plan.history == HistoryUse::kDelta && cols >= kMinLowRankSide &&
      n % cols == 0 && n / cols >= kMinLowRankSide &&
      n / cols <= std::numeric_limits<uint32_t>::max()) {
    LowRankChoice choice = ChooseLowRankShift<D>(
        set.uniform, in, ref, static_cast<uint32_t>(n / cols), cols, bound, plan.non_negative);
    plan.low_rank = choice.use;
    plan.shift = std::move(choice.shift);
  }
  return plan;
}

#define CKPT_INSTANTIATE(D)                                                         \
  template Result<ChunkPlan> PlanChunk<D>(const LossyCodecOptions&, const uint8_t*, \
                                          const uint8_t*, size_t, const ExactTarget*);
CKPT_LOSSY_DTYPES(CKPT_INSTANTIATE)
#undef CKPT_INSTANTIATE

}  // namespace ckpt::lossy
