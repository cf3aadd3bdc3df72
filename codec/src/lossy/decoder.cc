// The lossy decoder: reads a payload's layout (format.h), decodes its symbols (one pass: only
// the rANS states are serial, and with four interleaved states four chains run side by side),
// then its elements (a second pass: a keyframe's direct symbols through a table of their
// elements, a delta's groups of direct symbols through the SSE2/AVX2 kernels, everything else
// through ElementDecoder, which computes the same values one by one).
// docs/format.md specifies the arithmetic; the encoder's element loops (quantize.h) compute
// exactly the same reconstructions.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "ckpt/base/binary.h"
#include "entropy/rans.h"
#include "lossy/bit_stream.h"
#include "lossy/chunk_codec.h"
#include "lossy/element.h"
#include "lossy/format.h"
#include "lossy/history.h"
#include "lossy/kernels_avx2.h"
#include "lossy/kernels_sse2.h"
#include "lossy/low_rank.h"
#include "lossy/quantize.h"

namespace ckpt::lossy {
namespace {

class ShiftCursor {
 public:
  explicit ShiftCursor(const LowRankShift& shift)
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

  const LowRankShiftRows rows_;
  const size_t cols_;
  std::vector<int32_t> values_;
  size_t begin_ = 0, end_ = 0;  // the elements of the row in values_
};

// Above this many coded bits per symbol (keyframes) the rANS decoder refills without a branch
// (GetDense): a refill comes every few symbols, and its branch would often be mispredicted.
constexpr double kDenseBitsPerSymbol = 2.0;

// Symbols [*i, n) four at a time with GetDense while bytes remain for them; advances *i. Apart
// from DecodeSymbols' loop (and the decoder passed and returned by value) so that the loop for
// sparse streams is compiled as if this one did not exist.
template <typename ContextOf>
[[gnu::noinline]] rans::Decoder DecodeDenseSymbols(rans::Decoder decoder, ContextOf context_of,
                                                   size_t n, uint8_t* sym, size_t* i) {
  size_t k = *i;
  for (; k + 3 < n && decoder.HasBytes(8); k += 4) {
    sym[k] = decoder.GetDense<0>(context_of(k));
    sym[k + 1] = decoder.GetDense<1>(context_of(k + 1));
    sym[k + 2] = decoder.GetDense<2>(context_of(k + 2));
    sym[k + 3] = decoder.GetDense<3>(context_of(k + 3));
  }
  *i = k;
  return decoder;
}

// Decodes the n symbols of a payload into sym[0 .. n), each in its context. The decoder is taken
// by value so that its states stay in registers.
template <DType D, HistoryUse kHistory, bool kLattice>
Status DecodeSymbols(const PayloadHeader& h, rans::Decoder decoder,
                     const rans::DecodeTables& tables, const uint8_t* ref, uint8_t* sym) {
  using E = Element<D>;
  const size_t n = h.elements;
  const bool dense = decoder.BitsPerSymbol(n) > kDenseBitsPerSymbol;
  auto decode_symbols = [&](auto context_of) {
    size_t i = 0;
    if (h.four_states) {
      if (dense) decoder = DecodeDenseSymbols(decoder, context_of, n, sym, &i);
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
  } else if (h.context_model == kContextModelPrevious2) {
    decode_symbols([&](size_t i) {
      const uint32_t c1 = i > 0 ? ClassOf(sym[i - 1]) : 0;
      const uint32_t c2 = i > 1 ? ClassOf(sym[i - 2]) : 0;
      return tables.context(c1 * 3 + c2);
    });
  } else {
    decode_symbols([&](size_t) { return tables.context(0); });
  }
  return decoder.Check().WithContext("lossy payload");
}

// Decodes the explicit history states of n elements (kFlagExplicitHistory) into `states`, in
// the contexts the encoder used (ExplicitHistoryContext, from the decoded symbols).
template <DType D, HistoryUse kHistory>
Status DecodeExplicitHistory(std::span<const uint8_t> stream, const uint8_t* sym,
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
    const uint8_t context = ExplicitHistoryContext(sym[i], before, kHistory == HistoryUse::kDelta);
    states[i] = decoder.Get<0>(tables.context(context));
    if (states[i] > kHistoryMask) {
      return Status::DataLoss("lossy payload: history state out of range");
    }
  }
  return decoder.Check().WithContext("lossy payload history states");
}

// The second pass for any symbol and quantizer, element by element, in increasing order of
// elements; it also consumes the verbatim elements and the extra bits. Thread-compatible.
template <DType D, typename Q, HistoryUse kHistory, bool kLattice>
class ElementDecoder {
 public:
  using E = Element<D>;

  ElementDecoder(const Q& quantizer, const PayloadHeader& h, const LowRankShift& shift,
                 const PayloadSections& sections, const uint8_t* sym, const uint8_t* states,
                 const uint8_t* ref, uint8_t* out)
      : quantizer_(quantizer),
        low_rank_(h.low_rank),
        sym_(sym),
        states_(states),
        ref_(ref),
        out_(out),
        next_exact_(sections.exact.data()),
        exact_end_(sections.exact.data() + sections.exact.size()),
        bits_(sections.extra.data(), sections.extra.size()) {
    // The values of the direct symbols, looked up instead of computed (the common case).
    if constexpr (!std::is_same_v<Q, LogQuantizer>) {  // log reconstructs from z and p
      for (uint32_t k = 0; k < kDirectSymbols; ++k) {
        direct_[k] =
            quantizer.Valid(k) ? quantizer.Value(k) : std::numeric_limits<double>::quiet_NaN();
      }
      // Symbol 0 is "unchanged" for every quantizer. Where its formula gives NaN (0 * step for
      // an infinite step, which payloads of earlier encoders can carry) the encoder
      // reconstructed p + 0, so that unchanged NaN elements kept their bits: so does the decoder.
      // (Elsewhere the formula's value stays: the float quantizer's V(0) is -0.0.)
      if (std::isnan(direct_[0])) direct_[0] = 0.0;
    }
    // The lattice indices of references: on the fine lattice in low-rank payloads.
    if constexpr (kLattice) {
      lattice_step_ = h.low_rank ? quantizer.step / kLowRankFine : quantizer.step;
      lattice_inverse_ = h.low_rank ? 1.0 / lattice_step_ : quantizer.inverse_step;
    }
    if (h.low_rank) shift_.emplace(shift);
  }

  // Elements [begin, end).
  Status Decode(size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const uint8_t symbol = sym_[i];
      uint8_t* op = out_ + i * E::kSize;
      uint64_t z = symbol;
      double value = 0;
      if (symbol < kDirectSymbols) {
        if (!quantizer_.Valid(symbol))
          return Status::DataLoss("lossy payload: symbol out of table");
        value = direct_[symbol];
      } else if (symbol == kExactSymbol) {
        if (next_exact_ == exact_end_) {
          return Status::DataLoss("lossy payload: exact list too short");
        }
        std::memcpy(op, next_exact_, E::kSize);
        next_exact_ += E::kSize;
        continue;
      } else if (symbol < kExactSymbol) {
        const uint32_t width = symbol - kDirectSymbols + kFirstBucketBits;
        uint64_t low = 0;
        if (!bits_.Get(width - 1, &low)) return Status::DataLoss("lossy payload: extra bits short");
        z = (uint64_t{1} << (width - 1)) | low;
        if (!quantizer_.Valid(z)) return Status::DataLoss("lossy payload: symbol out of table");
        if constexpr (!std::is_same_v<Q, LogQuantizer>) value = quantizer_.Value(z);
      } else {
        return Status::DataLoss("lossy payload: symbol out of range");
      }
      Reconstruct(i, z, value, op);
    }
    return Status::Ok();
  }

  // Elements [begin, end) of a keyframe without explicit history states: an element with a
  // direct symbol is then a function of the symbol alone, so each of those is reconstructed
  // once, by Reconstruct itself, and copied; other symbols take Decode.
  Status DecodeKeyframe(size_t begin, size_t end) {
    uint8_t table[256][E::kSize];
    bool tabled[256] = {};
    bool all_direct_tabled = true;
    for (uint32_t k = 0; k < kDirectSymbols; ++k) {
      tabled[k] = quantizer_.Valid(k);
      all_direct_tabled = all_direct_tabled && tabled[k];
      if (tabled[k]) Reconstruct(0, k, direct_[k], table[k]);
    }
    // Locals: the copies' stores could alias the members.
    const uint8_t* const sym = sym_;
    uint8_t* const out = out_;
    size_t i = begin;
    // Eight direct symbols at a time (nearly all), without a branch per element.
    static_assert((kDirectSymbols & (kDirectSymbols - 1)) == 0);
    static_assert(std::endian::native == std::endian::little);  // symbol i + j is byte j
    constexpr uint64_t kNotDirect = 0x0101010101010101ull * (0xff & ~(kDirectSymbols - 1));
    for (; all_direct_tabled && i + 8 <= end; i += 8) {
      uint64_t eight;
      std::memcpy(&eight, sym + i, 8);
      if (eight & kNotDirect) {
        for (size_t j = i; j < i + 8; ++j)
          CKPT_RETURN_IF_ERROR(DecodeKeyframeElement(table, tabled, j));
        continue;
      }
      for (size_t j = 0; j < 8; ++j) {
        std::memcpy(out + (i + j) * E::kSize, table[(eight >> (8 * j)) & 0xff], E::kSize);
      }
    }
    for (; i < end; ++i) CKPT_RETURN_IF_ERROR(DecodeKeyframeElement(table, tabled, i));
    return Status::Ok();
  }

  // Element i of DecodeKeyframe: copied from its symbol's row of `table`, or decoded.
  Status DecodeKeyframeElement(const uint8_t (&table)[256][E::kSize], const bool (&tabled)[256],
                               size_t i) {
    const uint8_t symbol = sym_[i];
    if (tabled[symbol]) [[likely]] {
      std::memcpy(out_ + i * E::kSize, table[symbol], E::kSize);
      return Status::Ok();
    }
    return Decode(i, i + 1);
  }

  // After the last element: every verbatim element and extra bit was used.
  Status Finish() const {
    if (next_exact_ != exact_end_ || !bits_.AtEnd()) {
      return Status::DataLoss("lossy payload: side streams not fully consumed");
    }
    return Status::Ok();
  }

  ShiftCursor& shift() { return *shift_; }
  double lattice_step() const { return lattice_step_; }
  double lattice_inverse() const { return lattice_inverse_; }

 private:
  // Element i's reconstruction from its quantized value z (value: V(z) for additive quantizers).
  void Reconstruct(size_t i, uint64_t z, double value, uint8_t* op) {
    const double p = ref_ ? E::Load(ref_ + i * E::kSize) : 0.0;
    if constexpr (kLattice) {
      // QuantizeLatticeElement's rule: T((kp + q) * step), or the reference itself under z = 0
      // when it has no lattice index (kp = 0 otherwise). Low-rank payloads:
      // QuantizeLowRankElement's T((kp + shift + 64 q) * fine), kp on the fine lattice.
      double kp = 0;
      const double q = static_cast<double>(UnZigZag(z));
      // Without a reference (a keyframe) kp is 0. A corrupt header's step can leave even p = 0
      // without an index, so "no reference" is tested, not inferred.
      const bool indexed = ref_ != nullptr && LatticeIndex(p, lattice_inverse_, &kp);
      if (ref_ == nullptr || indexed || z != 0) {
        if (low_rank_) {
          const double base = indexed ? kp + shift_->At(i) : 0.0;
          E::Store((base + kLowRankFine * q) * lattice_step_, op);
        } else {
          E::Store((kp + q) * quantizer_.step, op);
        }
        if constexpr (kHistory != HistoryUse::kNone) {
          SetHistory<D>(op, states_ ? states_[i]
                            : kHistory == HistoryUse::kKeyframe
                                ? kKeyframeHistory
                                : NextHistory(LatticeHistoryOf<D>(ref_ + i * E::kSize), q));
        }
      } else {
        std::memcpy(op, ref_ + i * E::kSize, E::kSize);
      }
    } else if constexpr (std::is_same_v<Q, LogQuantizer>) {
      E::Store(quantizer_.Reconstruct(z, p), op);  // never with history
    } else if constexpr (kHistory == HistoryUse::kNone) {
      E::Store(p + value, op);
    } else {
      using T = std::conditional_t<D == DType::kF32, float, double>;
      auto out_bits = std::bit_cast<ElementBits<D>>(static_cast<T>(p + value));
      const uint32_t state = kHistory == HistoryUse::kDelta
                                 ? NextHistory(HistoryOf<D>(ref_ + i * E::kSize), value)
                                 : kKeyframeHistory;
      out_bits = WithHistory(out_bits, state);
      std::memcpy(op, &out_bits, sizeof(out_bits));
    }
  }

  const Q& quantizer_;
  const bool low_rank_;
  const uint8_t* const sym_;
  const uint8_t* const states_;  // explicit history states, or null
  const uint8_t* const ref_;     // null for keyframes
  uint8_t* const out_;
  const uint8_t* next_exact_;
  const uint8_t* const exact_end_;
  BitReader bits_;
  double direct_[kDirectSymbols] = {};
  double lattice_step_ = 0, lattice_inverse_ = 0;
  std::optional<ShiftCursor> shift_;
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
        DecodeEightLowRankF32(eight, fine, inverse_fine, shift_of_eight, ref + 4 * i,
                              out + 4 * i)) {
      continue;
    }
    for (size_t four = i; four < i + 8; four += 4) {
      uint32_t symbols;
      std::memcpy(&symbols, sym + four, 4);
      const int32_t* shift_of_four = shift.Span(four, 4);
      if ((symbols & 0xe0e0e0e0u) || shift_of_four == nullptr ||
          !DecodeFourLowRankF32(symbols, fine, inverse_fine, shift_of_four, ref + 4 * four,
                                out + 4 * four)) {
        CKPT_RETURN_IF_ERROR(general(four, four + 4));
      }
    }
  }
  *done = i;
  return Status::Ok();
}
#endif

#ifdef CKPT_LOSSY_AVX2
// The lattice's deltas without a low-rank shift (F32, with or without element history), eight
// elements with direct symbols at a time; a group that the kernel cannot take goes four by four
// (DecodeFourLatticeF32) or to `general`, as without AVX2. Advances *done past what it decoded.
template <bool kHistory, typename General>
__attribute__((target("avx2"))) Status DecodeLatticeF32Avx2(const uint8_t* sym, size_t n,
                                                            double step, double inverse_step,
                                                            const uint8_t* ref, uint8_t* out,
                                                            size_t* done, General&& general) {
  size_t i = *done;
  for (; i + 8 <= n; i += 8) {
    uint64_t eight;
    std::memcpy(&eight, sym + i, 8);
    if (!(eight & 0xe0e0e0e0e0e0e0e0ull) &&
        DecodeEightLatticeF32<kHistory>(eight, step, inverse_step, ref + 4 * i, out + 4 * i)) {
      continue;
    }
    for (size_t four = i; four < i + 8; four += 4) {
      uint32_t symbols;
      std::memcpy(&symbols, sym + four, 4);
      if ((symbols & 0xe0e0e0e0u) ||
          !DecodeFourLatticeF32<kHistory>(symbols, step, inverse_step, ref + 4 * four,
                                          out + 4 * four)) {
        CKPT_RETURN_IF_ERROR(general(four, four + 4));
      }
    }
  }
  *done = i;
  return Status::Ok();
}
#endif

// The vector paths of the second pass for deltas (F32 only): groups of four (eight) elements
// with direct symbols from *done on, where the payload's coding has a kernel; a group that a
// kernel cannot take goes to `general`. Advances *done past what it decoded.
template <DType D, typename Q, HistoryUse kHistory, bool kLattice>
Status DecodeVectorPaths(const PayloadHeader& h, const Q& quantizer, const uint8_t* sym,
                         bool explicit_states, const uint8_t* ref, uint8_t* o,
                         ElementDecoder<D, Q, kHistory, kLattice>& general, size_t* done) {
  const size_t n = h.elements;
  (void)quantizer, (void)sym, (void)explicit_states, (void)ref, (void)o, (void)general, (void)n;
#if defined(__SSE2__)
  if constexpr (D == DType::kF32 && kLattice) {
    if (h.low_rank && kHistory == HistoryUse::kDelta) {
#ifdef CKPT_LOSSY_AVX2
      if (CpuHasAvx2()) {
        CKPT_RETURN_IF_ERROR(DecodeLowRankF32Avx2(
            sym, n, general.lattice_step(), general.lattice_inverse(), general.shift(), ref, o,
            done, [&](size_t begin, size_t end) { return general.Decode(begin, end); }));
      }
#endif
      for (; *done + 4 <= n; *done += 4) {
        uint32_t four;
        std::memcpy(&four, sym + *done, 4);
        const int32_t* shift_of_four = general.shift().Span(*done, 4);  // null across a row's end
        if ((four & 0xe0e0e0e0u) || shift_of_four == nullptr ||
            !DecodeFourLowRankF32(four, general.lattice_step(), general.lattice_inverse(),
                                  shift_of_four, ref + 4 * *done, o + 4 * *done)) {
          CKPT_RETURN_IF_ERROR(general.Decode(*done, *done + 4));
        }
      }
    }
#ifdef CKPT_LOSSY_AVX2
    if (!explicit_states && !h.low_rank && CpuHasAvx2()) {
      CKPT_RETURN_IF_ERROR(DecodeLatticeF32Avx2<kHistory != HistoryUse::kNone>(
          sym, n, quantizer.step, quantizer.inverse_step, ref, o, done,
          [&](size_t begin, size_t end) { return general.Decode(begin, end); }));
    }
#endif
    for (; *done + 4 <= n && !explicit_states && !h.low_rank; *done += 4) {
      uint32_t four;
      std::memcpy(&four, sym + *done, 4);
      if ((four & 0xe0e0e0e0u) ||
          !DecodeFourLatticeF32<kHistory != HistoryUse::kNone>(
              four, quantizer.step, quantizer.inverse_step, ref + 4 * *done, o + 4 * *done)) {
        CKPT_RETURN_IF_ERROR(general.Decode(*done, *done + 4));
      }
    }
  }
  if constexpr (D == DType::kF32 && std::is_same_v<Q, UniformQuantizer> && !kLattice &&
                kHistory == HistoryUse::kDelta) {
    // Groups of four direct symbols (nearly all) take the vector path; a group with a large or
    // verbatim symbol takes the general one.
    for (; *done + 4 <= n; *done += 4) {
      uint32_t four;
      std::memcpy(&four, sym + *done, 4);
      if (four & 0xe0e0e0e0u) {  // a symbol >= 32
        CKPT_RETURN_IF_ERROR(general.Decode(*done, *done + 4));
      } else {
        DecodeFourDirectF32(four, quantizer.step, ref + 4 * *done, o + 4 * *done);
      }
    }
  }
#endif
  return Status::Ok();
}

// Both passes for one quantizer and one way of using element history and the lattice.
template <DType D, typename Q, HistoryUse kHistory, bool kLattice = false>
Status DecodeLoop(const Q& quantizer, const PayloadHeader& h, const LowRankShift& shift,
                  const PayloadSections& sections, const rans::Decoder& decoder,
                  const rans::DecodeTables& tables, const uint8_t* ref, uint8_t* o) {
  const size_t n = h.elements;
  std::unique_ptr<uint8_t[]> symbols(new uint8_t[n]);
  CKPT_RETURN_IF_ERROR(
      (DecodeSymbols<D, kHistory, kLattice>(h, decoder, tables, ref, symbols.get())));
  std::unique_ptr<uint8_t[]> states;
  if constexpr (kLattice && kHistory != HistoryUse::kNone) {
    if (h.explicit_history) {
      states.reset(new uint8_t[n]);
      CKPT_RETURN_IF_ERROR((DecodeExplicitHistory<D, kHistory>(
          sections.explicit_history, symbols.get(), ref, n, states.get())));
    }
  }
  ElementDecoder<D, Q, kHistory, kLattice> general(quantizer, h, shift, sections, symbols.get(),
                                                   states.get(), ref, o);
  if constexpr (kHistory != HistoryUse::kDelta) {
    if (!h.delta && states == nullptr) {  // (low-rank payloads are deltas: format.cc)
      CKPT_RETURN_IF_ERROR(general.DecodeKeyframe(0, n));
      return general.Finish();
    }
  }
  size_t done = 0;
  CKPT_RETURN_IF_ERROR((DecodeVectorPaths<D, Q, kHistory, kLattice>(
      h, quantizer, symbols.get(), states != nullptr, ref, o, general, &done)));
  CKPT_RETURN_IF_ERROR(general.Decode(done, n));
  return general.Finish();
}

// Reads the symbols' tables and starts the rANS decoder, then runs the loop for the payload's
// use of element history and the lattice.
template <DType D, typename Q>
Status DecodeElements(const Q& quantizer, const PayloadHeader& h, const LowRankShift& shift,
                      const PayloadSections& sections, const uint8_t* ref, uint8_t* o) {
  const uint8_t* in = sections.symbols.data();
  const uint8_t* end = in + sections.symbols.size();
  rans::DecodeTables tables;
  CKPT_RETURN_IF_ERROR(tables.Read(in, end, ContextCount(h.context_model)));
  rans::Decoder decoder;
  CKPT_RETURN_IF_ERROR(decoder.Init(in, end, h.four_states ? rans::kMaxWays : 1));
  if (in != end) return Status::DataLoss("lossy payload: trailing bytes");
  constexpr HistoryUse kNone = HistoryUse::kNone, kKeyframe = HistoryUse::kKeyframe,
                       kDelta = HistoryUse::kDelta;
  if constexpr (std::is_same_v<Q, UniformQuantizer>) {
    if (h.lattice) {
      if constexpr (kCanCarryHistory<D>) {
        if (h.history && h.delta) {
          return DecodeLoop<D, Q, kDelta, true>(quantizer, h, shift, sections, decoder, tables, ref,
                                                o);
        }
        if (h.history) {
          return DecodeLoop<D, Q, kKeyframe, true>(quantizer, h, shift, sections, decoder, tables,
                                                   ref, o);
        }
      }
      return DecodeLoop<D, Q, kNone, true>(quantizer, h, shift, sections, decoder, tables, ref, o);
    }
  }
  if constexpr (kCanCarryHistory<D>) {
    if (h.history && h.delta) {
      return DecodeLoop<D, Q, kDelta>(quantizer, h, shift, sections, decoder, tables, ref, o);
    }
    if (h.history) {
      return DecodeLoop<D, Q, kKeyframe>(quantizer, h, shift, sections, decoder, tables, ref, o);
    }
  }
  return DecodeLoop<D, Q, kNone>(quantizer, h, shift, sections, decoder, tables, ref, o);
}

template <DType D>
Status DecodeTyped(std::span<const uint8_t> payload,
                   std::optional<std::span<const uint8_t>> reference, std::span<uint8_t> out) {
  using E = Element<D>;
  ByteReader r(payload, "lossy payload");
  PayloadPrologue prologue;
  CKPT_RETURN_IF_ERROR(prologue.DecodeFrom(&r));
  const PayloadHeader& h = prologue.header;
  const QuantizerSet& set = prologue.quantizers;
  LowRankShift shift;
  if (h.low_rank) {
    CKPT_RETURN_IF_ERROR(DecodeLowRankShiftFrom(&r, h.elements, out.size() / E::kSize, &shift));
  }
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
  PayloadSections sections;
  CKPT_RETURN_IF_ERROR(DecodeSectionsFrom(&r, h, E::kSize, &sections));
  const uint8_t* ref = reference ? reference->data() : nullptr;
  switch (h.quantizer) {
    case Quantizer::kExponent:
      return DecodeElements<D>(set.exponent, h, shift, sections, ref, out.data());
    case Quantizer::kFloat:
      return DecodeElements<D>(set.floating, h, shift, sections, ref, out.data());
    case Quantizer::kCosine:
      return DecodeElements<D>(set.cosine, h, shift, sections, ref, out.data());
    case Quantizer::kLog:
      return DecodeElements<D>(set.log, h, shift, sections, ref, out.data());
    default:
      return DecodeElements<D>(set.uniform, h, shift, sections, ref, out.data());
  }
}

}  // namespace

Status DecodeChunk(DType dtype, std::span<const uint8_t> payload,
                   std::optional<std::span<const uint8_t>> reference, std::span<uint8_t> out) {
  auto decoded =
      VisitFloatDType(dtype, [&]<DType D>() { return DecodeTyped<D>(payload, reference, out); });
  if (!decoded) {
    return Status::DataLoss("lossy payload for non-float dtype " + std::string(DTypeName(dtype)));
  }
  return *decoded;
}

}  // namespace ckpt::lossy
