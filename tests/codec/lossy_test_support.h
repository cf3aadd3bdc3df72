// Helpers of the lossy codec's test files: float values to and from a dtype's bytes, and the
// element-by-element check of the guarantee. Uses the compiler's _Float16 (the codec suites
// build with GCC; clang 14 lacks it on x86-64).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "test_support.h"

namespace ckpt::testing {

inline std::vector<uint8_t> Pack(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = out.data() + i * DTypeSize(dtype);
    const double v = values[i];
    switch (dtype) {
      case DType::kF64:
        std::memcpy(p, &v, 8);
        break;
      case DType::kF32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF16: {
        const _Float16 h = static_cast<_Float16>(v);
        std::memcpy(p, &h, 2);
        break;
      }
      default: {  // BF16: round to nearest even from F32's bits; NaN keeps its top bits
        const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
        const uint16_t b = std::isnan(v)
                               ? static_cast<uint16_t>(bits >> 16)
                               : static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
        std::memcpy(p, &b, 2);
        break;
      }
    }
  }
  return out;
}

inline std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Element `p` of a float dtype's bytes as a double, exactly.
inline double Load(DType dtype, const uint8_t* p) {
  return LoadFloat(dtype, reinterpret_cast<const char*>(p));
}

// Checks the guarantee element by element: within `bound`, non-finite values bit-exact.
// Returns the largest error seen.
inline double ExpectWithinBound(DType dtype, const std::vector<uint8_t>& pushed,
                                const std::vector<uint8_t>& restored, double bound,
                                const std::string& where) {
  const size_t size = DTypeSize(dtype);
  EXPECT_EQ(pushed.size(), restored.size()) << where;
  double worst = 0;
  for (size_t i = 0; i < pushed.size() / size; ++i) {
    const double x = Load(dtype, pushed.data() + i * size);
    const double r = Load(dtype, restored.data() + i * size);
    if (!std::isfinite(x)) {
      EXPECT_EQ(0, std::memcmp(pushed.data() + i * size, restored.data() + i * size, size))
          << where << " element " << i << " (non-finite) not restored bit-exactly";
      continue;
    }
    const double err = std::abs(x - r);
    worst = std::max(worst, err);
    if (!(err <= bound)) {
      ADD_FAILURE() << where << " element " << i << ": pushed " << x << " restored " << r
                    << " error " << err << " > bound " << bound;
      return worst;
    }
  }
  return worst;
}

// The pointwise guarantee element by element: |x - r| <= eps |x| (so zeros exact and signs
// kept), non-finite values bit-exact.
inline void ExpectWithinPointwise(DType dtype, const std::vector<uint8_t>& pushed,
                                  const std::vector<uint8_t>& restored, double eps,
                                  const std::string& where) {
  const size_t size = DTypeSize(dtype);
  ASSERT_EQ(pushed.size(), restored.size()) << where;
  for (size_t i = 0; i < pushed.size() / size; ++i) {
    const double x = Load(dtype, pushed.data() + i * size);
    const double r = Load(dtype, restored.data() + i * size);
    const bool exact = std::memcmp(pushed.data() + i * size, restored.data() + i * size, size) == 0;
    if (!std::isfinite(x) || x == 0) {
      ASSERT_TRUE(exact) << where << " element " << i << ": " << x << " restored as " << r;
      continue;
    }
    ASSERT_LE(std::abs(x - r), eps * std::abs(x))
        << where << " element " << i << ": pushed " << x << " restored " << r;
  }
}

struct Coded {
  EncodedChunk chunk;
  std::vector<uint8_t> decoded;
};

// Encodes `current` against `reference`, decodes it with the decoding codec, and checks that
// the decoder's output is bit-identical to the encoder's reconstruction.
inline Coded EncodeDecode(const TensorCodec& codec, DType dtype,
                          const std::vector<uint8_t>& current,
                          const std::vector<uint8_t>* reference) {
  std::optional<std::span<const uint8_t>> ref;
  if (reference) ref = std::span<const uint8_t>(*reference);
  auto encoded = codec.Encode(dtype, current, ref);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  Coded out{std::move(encoded).value(), std::vector<uint8_t>(current.size())};
  auto decoder = CodecForDecoding(static_cast<uint16_t>(out.chunk.codec_id));
  EXPECT_TRUE(decoder.ok());
  Status s = (*decoder)->Decode(dtype, AsBytes(out.chunk.payload), ref, out.decoded);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (out.chunk.reconstruction_is_input) {  // stored losslessly: quantizing did not pay
    EXPECT_EQ(out.chunk.codec_id, CodecId::kLosslessBytePlanes);
    out.chunk.reconstruction = current;
  }
  EXPECT_EQ(out.decoded, out.chunk.reconstruction) << "decoder differs from encoder";
  return out;
}

// What a codec under test quantizes with: a quantizer, and whether its reconstructions are
// lattice points (LossyCodecOptions::reclaimable).
struct Coding {
  Coding(Quantizer q, bool on_lattice = false) : quantizer(q), lattice(on_lattice) {}  // NOLINT
  Quantizer quantizer;
  bool lattice;
};

inline void PrintTo(const Coding& coding, std::ostream* os) {
  *os << QuantizerName(coding.quantizer) << (coding.lattice ? " on the lattice" : "");
}

// A codec with an absolute bound, or (for the log quantizer) a pointwise one.
inline std::unique_ptr<TensorCodec> Lossy(Coding coding, double bound) {
  LossyCodecOptions options;
  options.quantizer = coding.quantizer;
  options.reclaimable = coding.lattice;
  options.bound = {coding.quantizer == Quantizer::kLog ? ErrorBound::Kind::kPointwise
                                                       : ErrorBound::Kind::kAbsolute,
                   bound};
  return NewLossyCodec(options);
}

inline std::unique_ptr<TensorCodec> Uniform(double bound) {
  return Lossy(Quantizer::kUniform, bound);
}

inline constexpr DType kLossyDtypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};

// Values every property test plants among its elements: ±0, NaN, ±Inf, and denormals of F32
// and F64.
inline const double kSpecialValues[] = {0.0,
                                        -0.0,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        1e-40,
                                        -3e-39,
                                        1e-310};

// Chunks of this many elements are below the size where the codec models contexts (and, for
// F32/F64, element history); kLargeChunk is above it.
inline constexpr size_t kSmallChunk = 777;
inline constexpr size_t kLargeChunk = 5000;

// The bound `q` guarantees: pointwise-relative for the log quantizer, else absolute.
inline void ExpectWithin(Quantizer q, DType dtype, const std::vector<uint8_t>& pushed,
                         const std::vector<uint8_t>& restored, double bound,
                         const std::string& where) {
  if (q == Quantizer::kLog) {
    ExpectWithinPointwise(dtype, pushed, restored, bound, where);
  } else {
    ExpectWithinBound(dtype, pushed, restored, bound, where);
  }
}

// A chain of `versions` versions: every version is decoded by replaying the chain from the
// keyframe, and every restored element must be within the bound.
inline void RunChain(DType dtype, double bound, size_t versions,
                     const std::function<void(size_t, std::vector<double>&)>& step,
                     Coding coding = Quantizer::kUniform, size_t elements = kSmallChunk) {
  const Quantizer quantizer = coding.quantizer;
  auto codec = Lossy(coding, bound);
  std::vector<double> values(elements);
  step(0, values);
  std::vector<uint8_t> pushed = Pack(dtype, values);
  Coded key = EncodeDecode(*codec, dtype, pushed, nullptr);
  // Each link as stored: the codec that decodes it (a chunk may fall back to lossless) and its
  // payload.
  std::vector<std::pair<CodecId, std::string>> links = {{key.chunk.codec_id, key.chunk.payload}};
  std::vector<uint8_t> reference = key.chunk.reconstruction;
  ExpectWithin(quantizer, dtype, pushed, key.decoded, bound, "version 0");
  for (size_t v = 1; v < versions; ++v) {
    step(v, values);
    pushed = Pack(dtype, values);
    Coded c = EncodeDecode(*codec, dtype, pushed, &reference);
    links.emplace_back(c.chunk.codec_id, c.chunk.payload);
    reference = c.chunk.reconstruction;
    ExpectWithin(quantizer, dtype, pushed, c.decoded, bound, "version " + std::to_string(v));
    // Every 25 versions, restore from the stored chain (keyframe + all deltas), not from the
    // encoder's state. (EncodeDecode checked each link against its reference already.)
    if (v % 25 != 0 && v + 1 != versions) continue;
    std::vector<uint8_t> restored(pushed.size()), next(pushed.size());
    for (size_t k = 0; k < links.size(); ++k) {
      auto link_codec = CodecForDecoding(static_cast<uint16_t>(links[k].first));
      ASSERT_TRUE(link_codec.ok());
      std::optional<std::span<const uint8_t>> ref;
      if (k > 0) ref = std::span<const uint8_t>(restored);
      ASSERT_TRUE((*link_codec)->Decode(dtype, AsBytes(links[k].second), ref, next).ok());
      std::swap(restored, next);
    }
    ASSERT_EQ(restored, reference) << "version " << v;
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace ckpt::testing
