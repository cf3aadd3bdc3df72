// The lossy encoder: plans a chunk (plan.h), quantizes its elements (quantize.h), codes the
// symbols with rANS in the plan's contexts, and lays out the payload (format.h). A chunk whose
// payload would not be smaller than its bytes, or that many elements had to go verbatim, is
// handed to the lossless codec instead when that is smaller (EncodedChunk::codec_id says so).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/binary.h"
#include "entropy/rans.h"
#include "lossy/chunk_codec.h"
#include "lossy/element.h"
#include "lossy/format.h"
#include "lossy/plan.h"
#include "lossy/quantize.h"

namespace ckpt::lossy {
namespace {

// Quantizes the n elements as the plan says, the reconstruction into `recon`.
template <DType D>
void QuantizeChunk(const ChunkPlan& plan, const ExactTarget* exact, const uint8_t* in,
                   const uint8_t* ref, size_t n, uint8_t* recon, Quantized* q) {
  const QuantizerSet& set = plan.quantizers;
  if (plan.low_rank) {  // row by row, each row's shift computed as it is needed
    const size_t cols = plan.shift.cols;
    q->symbols.resize(n);
    q->history.resize(n);
    const LowRankShiftRows shift_rows(plan.shift, plan.shift.rank);
    std::vector<int32_t> row_shift(cols);
    for (size_t row = 0; row < n / cols; ++row) {
      shift_rows.Row(static_cast<uint32_t>(row), row_shift.data());
      QuantizeLowRankRange<D>(set.uniform.step, row_shift.data(), in, ref, row * cols,
                              (row + 1) * cols, plan.bound, plan.non_negative, recon, q);
    }
  } else if (exact) {
    QuantizeLattice<D, true>(set.uniform, in, ref, n, plan.bound, plan.non_negative, plan.history,
                             recon, q);
  } else if (plan.lattice) {
    QuantizeLattice<D, false>(set.uniform, in, ref, n, plan.bound, plan.non_negative, plan.history,
                              recon, q);
  } else {
    QuantizeAdditive<D>(set, in, ref, n, plan.bound, plan.non_negative, plan.history, recon, q);
  }
}

// The symbols' counts in their contexts, and each symbol's context where the context model
// does not come from a stream the encoder already has (kContextModelPrevious2).
struct SymbolContexts {
  uint8_t context_model = kContextModelNone;  // the plan's, or order-0 where that codes as well
  rans::Histogram histogram;
  std::vector<uint8_t> raster;  // kContextModelPrevious2: each symbol's context
  // Each symbol's context for the rANS encoder (null: one context).
  const uint8_t* of(const Quantized& q) const {
    if (context_model == kContextModelHistory) return q.history.data();
    if (context_model == kContextModelPrevious2) return raster.data();
    return nullptr;
  }
};

// The coded size of a histogram's symbols and tables, in bytes (the entropy; rANS stays within
// a fraction of a percent of it).
double CodedBytes(const rans::Histogram& histogram) {
  std::string tables;
  rans::WriteTables(histogram, &tables);
  return histogram.EntropyBits() / 8 + static_cast<double>(tables.size());
}

// The two previous symbols' contexts must save at least this share of the order-0 coding to be
// used: they serialize the decoder on its nine tables, which no longer fit the L1 cache, so a
// chunk of high entropy (a keyframe) decodes at well under half the order-0 speed
// (docs/decisions.md, "Order-0 keyframes").
constexpr double kMinPrevious2Saving = 1.0 / 32;

SymbolContexts CountSymbols(const ChunkPlan& plan, const Quantized& q, size_t n) {
  SymbolContexts out{plan.context_model, rans::Histogram(ContextCount(plan.context_model)), {}};
  if (plan.context_model == kContextModelHistory) {
    out.histogram.AddAll(q.symbols.data(), q.history.data(), n);
  } else if (plan.context_model == kContextModelPrevious2) {
    out.raster.resize(n);
    rans::Histogram order0(1);
    uint32_t c1 = 0, c2 = 0;  // classes of the previous two symbols
    for (size_t i = 0; i < n; ++i) {
      const uint8_t symbol = q.symbols[i];
      const uint32_t context = c1 * 3 + c2;
      out.raster[i] = static_cast<uint8_t>(context);
      out.histogram.Add(context, symbol);
      ++order0.counts[0][symbol];
      c2 = c1;
      c1 = ClassOf(symbol);
    }
    if (CodedBytes(out.histogram) > (1 - kMinPrevious2Saving) * CodedBytes(order0)) {
      out.context_model = kContextModelNone;
      out.histogram = std::move(order0);
      out.raster.clear();
    }
  } else {
    out.histogram.AddAll(q.symbols.data(), nullptr, n);
  }
  return out;
}

// Exact re-encodings with history: every element's state, in the context of the state it would
// get otherwise (mostly the same), as a stream of its own. Returns the states' entropy in bits.
template <DType D>
double EncodeExplicitHistory(const uint8_t* in, const uint8_t* ref, size_t n, Quantized* q,
                             std::string* stream) {
  using E = Element<D>;
  rans::Histogram states(kHistoryContexts);
  std::vector<uint8_t> state_context(n);
  for (size_t i = 0; i < n; ++i) {
    state_context[i] = ExplicitHistoryContext(q->symbols[i], ref ? q->history[i] : 0, ref);
    // An element that carries no state (a zero, not finite, verbatim) decodes the same with
    // any: it gets the one its context predicts, which costs next to nothing.
    if (q->symbols[i] == kExactSymbol || !CarriesHistory<D>(in + i * E::kSize)) {
      q->explicit_history[i] = state_context[i];
    }
    states.Add(state_context[i], q->explicit_history[i]);
  }
  const std::vector<rans::EncodeTable> tables = rans::WriteTables(states, stream);
  rans::Encoder encoder(n, 1);
  encoder.PutAll(q->explicit_history.data(), state_context.data(), tables.data(), n);
  encoder.Finish(stream);
  return states.EntropyBits();
}

// The payload of a quantized chunk (format.h); *shift_bytes: the low-rank factors' length.
template <DType D>
Result<std::string> LayOutPayload(const ChunkPlan& plan, bool delta, size_t n, Quantized* q,
                                  const SymbolContexts& contexts,
                                  const std::string& explicit_stream, size_t* shift_bytes) {
  std::string extra_bytes = q->extra.Finish();
  PayloadHeader header;
  header.quantizer = plan.quantizers.kind;
  header.dtype = D;
  header.context_model = contexts.context_model;
  header.delta = delta;
  header.history = plan.history != HistoryUse::kNone;
  header.four_states = plan.contexts;
  header.lattice = plan.lattice;
  header.explicit_history = plan.explicit_history;
  header.low_rank = plan.low_rank;
  header.log_offset = plan.quantizers.kind == Quantizer::kLog &&
                      plan.quantizers.log.mode == LogQuantizer::Mode::kRatio &&
                      plan.quantizers.log.offset != 0;
  header.bound = plan.bound;
  header.elements = n;
  header.exact = q->exact_count;
  header.extra_bytes = static_cast<uint32_t>(extra_bytes.size());
  ByteWriter w;
  header.EncodeTo(&w);
  plan.quantizers.EncodeParamsTo(&w);
  *shift_bytes = plan.low_rank ? EncodeLowRankShiftTo(plan.shift, &w) : 0;
  CKPT_RETURN_IF_ERROR(EncodeSectionsTo(header, q->exact, extra_bytes, explicit_stream, &w));
  std::string payload = w.Release();
  const std::vector<rans::EncodeTable> tables = rans::WriteTables(contexts.histogram, &payload);
  rans::Encoder encoder(n, plan.contexts ? rans::kMaxWays : 1);  // small chunks: fewer states
  encoder.PutAll(q->symbols.data(), contexts.of(*q), tables.data(), n);
  encoder.Finish(&payload);
  return payload;
}

template <DType D>
Result<EncodedChunk> EncodeTyped(const LossyCodecOptions& options, std::span<const uint8_t> current,
                                 std::optional<std::span<const uint8_t>> reference,
                                 const ExactTarget* exact) {
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
  CKPT_ASSIGN_OR_RETURN(ChunkPlan plan, PlanChunk<D>(options, in, ref, n, exact));
  EncodedChunk result;
  result.reconstruction_is_input = false;
  result.reconstruction.resize(current.size());
  Quantized q;
  QuantizeChunk<D>(plan, exact, in, ref, n, result.reconstruction.data(), &q);
  if (q.exact_count > std::numeric_limits<uint32_t>::max() / E::kSize) {
    return Status::InvalidArgument("lossy codec: chunk too large");
  }
  const SymbolContexts contexts = CountSymbols(plan, q, n);
  std::string explicit_stream;
  const double explicit_bits =
      plan.explicit_history ? EncodeExplicitHistory<D>(in, ref, n, &q, &explicit_stream) : 0;
  size_t shift_bytes = 0;
  CKPT_ASSIGN_OR_RETURN(std::string payload, LayOutPayload<D>(plan, ref != nullptr, n, &q, contexts,
                                                              explicit_stream, &shift_bytes));
  if ((payload.size() >= current.size() || q.exact_count * 8 > n) && !current.empty()) {
    // Quantizing did not pay (e.g. a bound below the dtype's resolution, or data the
    // quantizers cannot follow), or many elements went verbatim (masks of -inf, tensors mostly
    // NaN): store the chunk bit-exactly instead if that is smaller, which also keeps it within
    // any bound. Its reconstruction is then the input itself.
    static const std::unique_ptr<TensorCodec> lossless = NewLosslessCodec();
    auto bit_exact = lossless->Encode(D, current, reference);
    if (bit_exact.ok() && bit_exact->payload.size() < payload.size()) return bit_exact;
  }
  result.payload = std::move(payload);
  result.codec_id = CodecId::kLossyQuantized;
  result.info.quantizer = static_cast<uint8_t>(plan.quantizers.kind);
  result.info.bound = plan.bound;
  result.info.elements = n;
  result.info.exact_elements = q.exact_count;
  const double side_bits =
      static_cast<double>(q.extra_bits) + 8.0 * static_cast<double>(q.exact.size() + shift_bytes);
  result.info.model_entropy_bits = contexts.histogram.EntropyBits() + side_bits + explicit_bits;
  return result;
}

Result<EncodedChunk> EncodeDispatch(const LossyCodecOptions& options, DType dtype,
                                    std::span<const uint8_t> current,
                                    std::optional<std::span<const uint8_t>> reference,
                                    const ExactTarget* exact) {
  auto encoded = VisitFloatDType(
      dtype, [&]<DType D>() { return EncodeTyped<D>(options, current, reference, exact); });
  if (!encoded) {
    return Status::InvalidArgument("lossy codec: dtype " + std::string(DTypeName(dtype)) +
                                   " is not quantized (stored losslessly)");
  }
  return std::move(*encoded);
}

}  // namespace

Result<EncodedChunk> EncodeChunk(const LossyCodecOptions& options, DType dtype,
                                 std::span<const uint8_t> current,
                                 std::optional<std::span<const uint8_t>> reference) {
  if (reference && reference->size() != current.size()) {
    return Status::InvalidArgument("lossy codec: reference length differs from chunk length");
  }
  if (!(options.bound.value >= 0) || !std::isfinite(options.bound.value)) {
    return Status::InvalidArgument("lossy codec: the error bound must be finite and >= 0");
  }
  return EncodeDispatch(options, dtype, current, reference, nullptr);
}

Result<EncodedChunk> EncodeChunkExactly(DType dtype, std::span<const uint8_t> original,
                                        std::span<const uint8_t> target,
                                        std::optional<std::span<const uint8_t>> reference) {
  if (reference && reference->size() != target.size()) {
    return Status::InvalidArgument("lossy codec: reference length differs from chunk length");
  }
  ByteReader r(original, "lossy payload");
  PayloadPrologue prologue;
  CKPT_RETURN_IF_ERROR(prologue.DecodeFrom(&r));
  const PayloadHeader& header = prologue.header;
  const QuantizerSet& set = prologue.quantizers;
  if (header.quantizer != Quantizer::kUniform) {
    return Status::FailedPrecondition("lossy payload: quantizer " +
                                      std::string(QuantizerName(header.quantizer)) +
                                      " has no lattice to re-encode on");
  }
  if (header.dtype != dtype) return Status::DataLoss("lossy payload: dtype differs from manifest");
  if (!(set.uniform.step > 0) || !std::isfinite(set.uniform.inverse_step)) {
    return Status::FailedPrecondition("lossy payload: lattice step out of range");
  }
  // A low-rank payload's reconstructions lie on its fine lattice: so does the re-encoding.
  ExactTarget exact;
  exact.step = header.low_rank ? set.uniform.step / kLowRankFine : set.uniform.step;
  exact.bound = header.bound;
  exact.history = header.history;
  return EncodeDispatch(LossyCodecOptions{}, dtype, target, reference, &exact);
}

}  // namespace ckpt::lossy
