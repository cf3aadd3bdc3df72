// Error-bounded lossy codec: uniform quantization of the closed-loop delta, symbols coded with a
// context-modelled rANS coder.
//
// Per element i (x = input, p = reference element, 0 for keyframes):
//   q = round((x - p) / step), step = 2 * bound
//   r = T(p + q * step)            (computed in double, rounded once to the dtype T)
//   if x is NaN/Inf, or p is not finite, or |x - r| > bound: the element is stored verbatim.
// The decoder runs the same Reconstruct(), so r is bit-identical on both sides.
//
// Symbols: z = zigzag(q); z < 32 is its own symbol; larger z are coded as the symbol of their
// bit length plus the bits below the leading one (raw, in a separate bit stream); one symbol
// marks a verbatim element. The context of a symbol is the class (zero, ±1, larger) of the two
// symbols before it, which captures how busy the neighbourhood (the row of a weight matrix) is.
//
// Payload layout (little-endian), see docs/format.md:
//   u8  payload_version (1)      u8 quantizer (1 = uniform)   u8 dtype tag
//   u8  context_model (1)        u8 flags (bit 0: delta)
//   f64 bound  f64 step  u64 element_count  u32 exact_count  u32 extra_bytes
//   exact_count × element (the verbatim elements, in order)
//   extra_bytes of raw extra bits (LSB first)
//   rANS tables and stream (rans.h)
#include "ckpt/codec/lossy_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "ckpt/codec/binary.h"
#include "rans.h"

namespace ckpt {
namespace {

constexpr uint8_t kPayloadVersion = 1;
constexpr uint8_t kContextModelPrevious2 = 1;
constexpr uint8_t kFlagDelta = 1;
constexpr uint32_t kContexts = 9;

constexpr uint32_t kDirectSymbols = 32;   // zigzag values below this are their own symbol
constexpr uint32_t kFirstBucketBits = 6;  // bit length of the smallest bucketed value (32)
constexpr uint32_t kMaxBucketBits = 63;
constexpr uint8_t kExactSymbol = kDirectSymbols + (kMaxBucketBits - kFirstBucketBits) + 1;
static_assert(kExactSymbol < rans::kMaxSymbols);
// |q| beyond this is stored verbatim (keeps zigzag within kMaxBucketBits bits and the rounding
// below exact).
constexpr double kMaxQuantized = 0x1p50;

// Round half to even without a libm call: exact for |v| < 2^51.
inline double RoundToInteger(double v) {
  constexpr double kMagic = 0x1.8p52;
  return v >= 0 ? (v + kMagic) - kMagic : -((-v + kMagic) - kMagic);
}

uint32_t ClassOf(uint8_t symbol) { return symbol == 0 ? 0 : symbol <= 2 ? 1 : 2; }
uint32_t ContextOf(uint8_t previous, uint8_t before_previous) {
  return ClassOf(previous) * 3 + ClassOf(before_previous);
}

uint64_t ZigZag(int64_t q) {
  return (static_cast<uint64_t>(q) << 1) ^ static_cast<uint64_t>(q >> 63);
}
int64_t UnZigZag(uint64_t z) { return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1); }

// Element access for each supported dtype: load to double, store from double (one rounding).
template <DType D>
struct Element;

template <>
struct Element<DType::kF32> {
  static constexpr size_t kSize = 4;
  static double Load(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  static void Store(double v, uint8_t* p) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
  }
};

template <>
struct Element<DType::kF64> {
  static constexpr size_t kSize = 8;
  static double Load(const uint8_t* p) {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  static void Store(double v, uint8_t* p) { std::memcpy(p, &v, 8); }
};

template <>
struct Element<DType::kF16> {
  static constexpr size_t kSize = 2;
  static double Load(const uint8_t* p) {
    _Float16 h;
    std::memcpy(&h, p, 2);
    return static_cast<double>(h);
  }
  static void Store(double v, uint8_t* p) {
    const _Float16 h = static_cast<_Float16>(v);
    std::memcpy(p, &h, 2);
  }
};

template <>
struct Element<DType::kBF16> {
  static constexpr size_t kSize = 2;
  static double Load(const uint8_t* p) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return std::bit_cast<float>(uint32_t{b} << 16);
  }
  // double -> float -> bfloat16, round to nearest even at each step (NaN never reaches here:
  // non-finite elements are stored verbatim).
  static void Store(double v, uint8_t* p) {
    uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
    bits += 0x7fff + ((bits >> 16) & 1);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(p, &b, 2);
  }
};

// The reconstruction shared by encoder and decoder.
template <DType D>
inline void Reconstruct(double reference, int64_t q, double step, uint8_t* out) {
  Element<D>::Store(reference + static_cast<double>(q) * step, out);
}

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

class BitWriter {
 public:
  void Put(uint64_t value, uint32_t bits) {
    for (uint32_t i = 0; i < bits; ++i) {
      acc_ |= ((value >> i) & 1) << fill_;
      if (++fill_ == 8) {
        out_.push_back(static_cast<char>(acc_));
        acc_ = 0;
        fill_ = 0;
      }
    }
  }
  std::string Finish() {
    if (fill_) out_.push_back(static_cast<char>(acc_));
    fill_ = 0;
    return std::move(out_);
  }

 private:
  std::string out_;
  uint64_t acc_ = 0;
  uint32_t fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // Returns false when the stream is exhausted.
  bool Get(uint32_t bits, uint64_t* value) {
    if (bits > size_ * 8 - pos_) return false;
    uint64_t v = 0;
    for (uint32_t i = 0; i < bits; ++i, ++pos_) {
      v |= uint64_t{(data_[pos_ >> 3] >> (pos_ & 7)) & 1u} << i;
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

double ResolveBound(const ErrorBound& bound, double lo, double hi) {
  if (bound.kind == ErrorBound::Kind::kAbsolute) return bound.value;
  if (!(hi >= lo)) return 0;  // no finite values: every element is stored verbatim anyway
  return bound.value * (hi - lo);
}

struct Header {
  Quantizer quantizer = Quantizer::kUniform;
  DType dtype = DType::kF32;
  bool delta = false;
  double bound = 0;
  double step = 0;
  uint64_t elements = 0;
  uint32_t exact = 0;
  uint32_t extra_bytes = 0;
};

void PutF64(ByteWriter& w, double v) { w.PutU64(std::bit_cast<uint64_t>(v)); }

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
    switch (dtype) {
      case DType::kF32:
        return EncodeTyped<DType::kF32>(current, reference);
      case DType::kF64:
        return EncodeTyped<DType::kF64>(current, reference);
      case DType::kF16:
        return EncodeTyped<DType::kF16>(current, reference);
      case DType::kBF16:
        return EncodeTyped<DType::kBF16>(current, reference);
      default:
        return Status::InvalidArgument("lossy codec: dtype " + std::string(DTypeName(dtype)) +
                                       " is not quantized (stored losslessly)");
    }
  }

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
  template <DType D>
  Result<EncodedChunk> EncodeTyped(std::span<const uint8_t> current,
                                   std::optional<std::span<const uint8_t>> reference) const {
    using E = Element<D>;
    if (current.size() % E::kSize != 0) {
      return Status::InvalidArgument("lossy codec: chunk is not whole elements");
    }
    const size_t n = current.size() / E::kSize;
    const uint8_t* in = current.data();
    const uint8_t* ref = reference ? reference->data() : nullptr;

    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    if (options_.bound.kind == ErrorBound::Kind::kRelative) {
      for (size_t i = 0; i < n; ++i) {
        const double x = E::Load(in + i * E::kSize);
        if (std::isfinite(x)) {
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
      }
    }
    const double bound = ResolveBound(options_.bound, lo, hi);
    // One lattice of pitch 2*bound for keyframes and deltas: while the bound stays the same,
    // every reconstruction is the lattice point nearest to its input ("quantize, then take
    // differences"), so the error is plain rounding error, unbiased. (A dead zone with finer
    // corrections codes ~4% smaller but lets elements lag behind their trajectory; measured:
    // twice the loss change on a training run, docs/benchmarks.md.)
    const double step = 2 * bound;
    const double inverse_step = step > 0 ? 1.0 / step : 0.0;

    EncodedChunk result;
    result.reconstruction_is_input = false;
    result.reconstruction.resize(current.size());
    uint8_t* recon = result.reconstruction.data();
    std::vector<uint8_t> symbols(n);
    std::string exact;
    BitWriter extra;
    rans::Histogram histogram(kContexts);
    uint32_t exact_count = 0;
    uint64_t extra_bits = 0;
    uint8_t p1 = 0, p2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* xp = in + i * E::kSize;
      const double x = E::Load(xp);
      const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
      uint8_t symbol = kExactSymbol;
      if (std::isfinite(x) && std::isfinite(p)) {
        // Only the encoder computes q (the decoder just applies it), so multiplying by the
        // reciprocal is safe: any q is checked against the bound below.
        const double t = (x - p) * inverse_step;
        if (std::abs(t) <= kMaxQuantized) {
          const double qd = RoundToInteger(t);
          const int64_t q = static_cast<int64_t>(qd);
          uint8_t* rp = recon + i * E::kSize;
          Reconstruct<D>(p, q, step, rp);
          const double r = E::Load(rp);
          // A zero of the wrong sign is within any bound, but -0.0 is kept as -0.0.
          if (WithinBound(x, r, bound) &&
              (x != 0 || r != 0 || std::signbit(r) == std::signbit(x))) {
            const uint64_t z = ZigZag(q);
            if (z < kDirectSymbols) {
              symbol = static_cast<uint8_t>(z);
            } else {
              const uint32_t bits = static_cast<uint32_t>(std::bit_width(z));
              symbol = static_cast<uint8_t>(kDirectSymbols + bits - kFirstBucketBits);
              extra.Put(z, bits - 1);
              extra_bits += bits - 1;
            }
          }
        }
      }
      if (symbol == kExactSymbol) {
        std::memcpy(recon + i * E::kSize, xp, E::kSize);
        exact.append(reinterpret_cast<const char*>(xp), E::kSize);
        ++exact_count;
      }
      symbols[i] = symbol;
      histogram.Add(ContextOf(p1, p2), symbol);
      p2 = p1;
      p1 = symbol;
    }
    if (exact_count > std::numeric_limits<uint32_t>::max() / E::kSize) {
      return Status::InvalidArgument("lossy codec: chunk too large");
    }

    std::string extra_bytes = extra.Finish();
    ByteWriter w;
    w.PutU8(kPayloadVersion);
    w.PutU8(static_cast<uint8_t>(Quantizer::kUniform));
    w.PutU8(static_cast<uint8_t>(D));
    w.PutU8(kContextModelPrevious2);
    w.PutU8(ref ? kFlagDelta : 0);
    PutF64(w, bound);
    PutF64(w, step);
    w.PutU64(n);
    w.PutU32(exact_count);
    w.PutU32(static_cast<uint32_t>(extra_bytes.size()));
    w.PutBytes(exact);
    w.PutBytes(extra_bytes);
    std::string payload = w.Release();
    const std::vector<rans::EncodeTable> tables = rans::WriteTables(histogram, &payload);
    rans::Encoder encoder(n);
    for (size_t i = n; i-- > 0;) {
      const uint8_t q1 = i >= 1 ? symbols[i - 1] : 0;
      const uint8_t q2 = i >= 2 ? symbols[i - 2] : 0;
      encoder.Put(tables[ContextOf(q1, q2)], symbols[i]);
    }
    encoder.Finish(&payload);

    result.payload = std::move(payload);
    result.info.quantizer = static_cast<uint8_t>(Quantizer::kUniform);
    result.info.bound = bound;
    result.info.elements = n;
    result.info.exact_elements = exact_count;
    const double side_bits = static_cast<double>(extra_bits) + 8.0 * exact.size();
    result.info.model_entropy_bits = histogram.EntropyBits() + side_bits;
    rans::Histogram order0(1);  // the same symbols without contexts
    for (const auto& counts : histogram.counts) {
      for (uint32_t k = 0; k < rans::kMaxSymbols; ++k) order0.counts[0][k] += counts[k];
    }
    result.info.order0_entropy_bits = order0.EntropyBits() + side_bits;
    return result;
  }

  static Status ReadHeader(ByteReader& r, Header* h) {
    uint8_t version = 0, quantizer = 0, dtype = 0, model = 0, flags = 0;
    uint64_t bound = 0, step = 0;
    CKPT_RETURN_IF_ERROR(r.GetU8(&version));
    if (version != kPayloadVersion) {
      return Status::DataLoss("lossy payload version " + std::to_string(version) +
                              " is not supported (written by a newer ckptd?)");
    }
    CKPT_RETURN_IF_ERROR(r.GetU8(&quantizer));
    CKPT_RETURN_IF_ERROR(r.GetU8(&dtype));
    CKPT_RETURN_IF_ERROR(r.GetU8(&model));
    CKPT_RETURN_IF_ERROR(r.GetU8(&flags));
    CKPT_RETURN_IF_ERROR(r.GetU64(&bound));
    CKPT_RETURN_IF_ERROR(r.GetU64(&step));
    CKPT_RETURN_IF_ERROR(r.GetU64(&h->elements));
    CKPT_RETURN_IF_ERROR(r.GetU32(&h->exact));
    CKPT_RETURN_IF_ERROR(r.GetU32(&h->extra_bytes));
    if (quantizer != static_cast<uint8_t>(Quantizer::kUniform)) {
      return Status::DataLoss("lossy payload: unknown quantizer " + std::to_string(quantizer));
    }
    if (model != kContextModelPrevious2) {
      return Status::DataLoss("lossy payload: unknown context model " + std::to_string(model));
    }
    auto d = DTypeFromTag(dtype);
    if (!d) return Status::DataLoss("lossy payload: unknown dtype tag");
    h->quantizer = static_cast<Quantizer>(quantizer);
    h->dtype = *d;
    h->delta = flags & kFlagDelta;
    h->bound = std::bit_cast<double>(bound);
    h->step = std::bit_cast<double>(step);
    return Status::Ok();
  }

  template <DType D>
  Status DecodeTyped(std::span<const uint8_t> payload,
                     std::optional<std::span<const uint8_t>> reference,
                     std::span<uint8_t> out) const {
    using E = Element<D>;
    ByteReader r(payload, "lossy payload");
    Header h;
    CKPT_RETURN_IF_ERROR(ReadHeader(r, &h));
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
    std::span<const uint8_t> exact, extra;
    CKPT_RETURN_IF_ERROR(r.GetSpan(uint64_t{h.exact} * E::kSize, &exact));
    CKPT_RETURN_IF_ERROR(r.GetSpan(h.extra_bytes, &extra));
    std::span<const uint8_t> rest;
    CKPT_RETURN_IF_ERROR(r.GetSpan(r.remaining(), &rest));
    const uint8_t* in = rest.data();
    const uint8_t* end = in + rest.size();
    rans::DecodeTables tables;
    CKPT_RETURN_IF_ERROR(tables.Read(in, end, kContexts));
    rans::Decoder decoder;
    CKPT_RETURN_IF_ERROR(decoder.Init(in, end));
    if (in != end) return Status::DataLoss("lossy payload: trailing bytes");

    const size_t n = h.elements;
    const uint8_t* ref = reference ? reference->data() : nullptr;
    uint8_t* o = out.data();
    const uint8_t* next_exact = exact.data();
    const uint8_t* exact_end = exact.data() + exact.size();
    BitReader bits(extra.data(), extra.size());
    const double step = h.step;
    uint8_t p1 = 0, p2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t symbol = decoder.Get(tables.context(ContextOf(p1, p2)));
      p2 = p1;
      p1 = symbol;
      uint8_t* op = o + i * E::kSize;
      uint64_t z;
      if (symbol < kDirectSymbols) {
        z = symbol;
      } else if (symbol == kExactSymbol) {
        if (next_exact == exact_end) return Status::DataLoss("lossy payload: exact list too short");
        std::memcpy(op, next_exact, E::kSize);
        next_exact += E::kSize;
        continue;
      } else if (symbol < kExactSymbol) {
        const uint32_t width = symbol - kDirectSymbols + kFirstBucketBits;
        uint64_t low = 0;
        if (!bits.Get(width - 1, &low)) return Status::DataLoss("lossy payload: extra bits short");
        z = (uint64_t{1} << (width - 1)) | low;
      } else {
        return Status::DataLoss("lossy payload: symbol out of range");
      }
      const double p = ref ? E::Load(ref + i * E::kSize) : 0.0;
      Reconstruct<D>(p, UnZigZag(z), step, op);
    }
    CKPT_RETURN_IF_ERROR(decoder.Check().WithContext("lossy payload"));
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
  }
  return "unknown";
}

std::optional<Quantizer> QuantizerFromName(std::string_view name) {
  for (Quantizer q : {Quantizer::kAuto, Quantizer::kUniform}) {
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

}  // namespace ckpt
