// Property tests of the error-bounded lossy codec: the bound holds for every element of every
// version, on random, heavy-tailed and adversarial values, over long closed-loop chains.
#include "ckpt/codec/lossy_codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "lossy/element.h"  // internal: the software binary16 conversions
#include "lossy_test_support.h"
#include "test_support.h"

namespace ckpt {
namespace {

#if defined(__FLT16_MANT_DIG__)
// Builds without a native half type (clang 14, the fuzzing build) convert F16 in software; the
// payloads they read and write must be the same, so both conversions must agree bit for bit.
TEST(SoftwareHalf, MatchesTheNativeConversionsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    _Float16 native;
    std::memcpy(&native, &bits, 2);
    const double expected = static_cast<double>(native), got = lossy::HalfBitsToDouble(bits);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint64_t>(got), std::bit_cast<uint64_t>(expected)) << std::hex << h;
    }
  }
  auto check = [](double v) {
    const _Float16 native = static_cast<_Float16>(v);
    uint16_t expected;
    std::memcpy(&expected, &native, 2);
    ASSERT_EQ(lossy::DoubleToHalfBits(v), expected) << std::hexfloat << v;
  };
  // Every half value, the midpoints between neighbours and the doubles just beside them
  // (ties to even, double rounding), then random doubles over the whole range.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = lossy::HalfBitsToDouble(static_cast<uint16_t>(h));
    const double hi =
        h + 1 == 0x7c00 ? 65536.0 : lossy::HalfBitsToDouble(static_cast<uint16_t>(h + 1));
    const double mid = (lo + hi) / 2;
    for (double v : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9), hi}) {
      check(v);
      check(-v);
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const double v = std::bit_cast<double>(rng());
    if (!std::isnan(v)) check(v);
    check(std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng), -30 + i % 50));
  }
  for (double v :
       {0.0, -0.0, 65504.0, 65519.999, 65520.0, 1e300, -1e-300, 0x1p-25, 0x1p-24, 0x1.8p-25,
        std::numeric_limits<double>::infinity(), std::numeric_limits<double>::denorm_min()}) {
    check(v);
    check(-v);
  }
}
#endif

using namespace testing;  // the lossy codec tests' helpers: lossy_test_support.h

const Coding kAllCodings[] = {Quantizer::kUniform,     {Quantizer::kUniform, true},
                              Quantizer::kExponent,    Quantizer::kFloat,
                              Quantizer::kCosine,      Quantizer::kAuto,
                              {Quantizer::kAuto, true}};

// The guarantee must hold whatever the quantizer: every property below runs for each.
class EveryQuantizer : public ::testing::TestWithParam<Coding> {};

std::string QuantizerParamName(const ::testing::TestParamInfo<Coding>& info) {
  return std::string(QuantizerName(info.param.quantizer)) + (info.param.lattice ? "_lattice" : "");
}

TEST(LossyCodec, AdversarialValuesRestoreExactlyOrWithinBound) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {0.0,      -0.0,   1.0,    -1.0,  inf,   -inf,  nan,
                                      4.9e-324, 1e-45,  -1e-45, 1e-40, 3e38,  -3e38, 1e308,
                                      -1e308,   65504., 1e5,    1e-8,  0.125, 1e-3,  2e-3};
  for (DType dtype : kLossyDtypes) {
    const auto pushed = Pack(dtype, values);
    for (double bound : {1e-3, 0.5, 1e10, 0.0}) {
      auto codec = Uniform(bound);
      const std::string where = std::string(DTypeName(dtype)) + " bound " + std::to_string(bound);
      Coded key = EncodeDecode(*codec, dtype, pushed, nullptr);
      ExpectWithinBound(dtype, pushed, key.decoded, bound, where);
      // A delta against a reference holding non-finite values everywhere.
      std::vector<double> odd(values.size(), nan);
      for (size_t i = 0; i < odd.size(); i += 2) odd[i] = -inf;
      const auto reference = Pack(dtype, odd);
      Coded delta = EncodeDecode(*codec, dtype, pushed, &reference);
      ExpectWithinBound(dtype, pushed, delta.decoded, bound, where + " delta vs non-finite");
    }
  }
}

TEST(LossyCodec, NanPayloadsAndNegativeZeroAreKeptBitExactly) {
  std::vector<uint8_t> bytes(12);
  const uint32_t nan_payload = 0xffc12345u;
  const float negative_zero = -0.0f, denormal = std::numeric_limits<float>::denorm_min();
  std::memcpy(bytes.data(), &nan_payload, 4);
  std::memcpy(bytes.data() + 4, &negative_zero, 4);
  std::memcpy(bytes.data() + 8, &denormal, 4);
  Coded c = EncodeDecode(*Uniform(0.0), DType::kF32, bytes, nullptr);
  EXPECT_EQ(c.decoded, bytes);  // bound 0: bit-exact, -0.0 and the denormal included
  Coded loose = EncodeDecode(*Uniform(1.0), DType::kF32, bytes, nullptr);
  EXPECT_EQ(0, std::memcmp(loose.decoded.data(), &nan_payload, 4));
}

TEST(LossyCodec, EmptyAndScalarChunks) {
  for (DType dtype : kLossyDtypes) {
    Coded empty = EncodeDecode(*Uniform(1e-3), dtype, {}, nullptr);
    EXPECT_TRUE(empty.decoded.empty());
    const auto scalar = Pack(dtype, {42.0});
    Coded s = EncodeDecode(*Uniform(1e-3), dtype, scalar, nullptr);
    ExpectWithinBound(dtype, scalar, s.decoded, 1e-3, "scalar");
    Coded d = EncodeDecode(*Uniform(1e-3), dtype, scalar, &s.decoded);
    ExpectWithinBound(dtype, scalar, d.decoded, 1e-3, "scalar delta");
  }
}

TEST(LossyCodec, RelativeBoundFollowsTheValueRange) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> uniform(-3, 5);  // range 8
  std::vector<double> values(10000);
  for (double& v : values) v = uniform(rng);
  const auto pushed = Pack(DType::kF32, values);
  auto codec = NewLossyCodec({Quantizer::kUniform, {ErrorBound::Kind::kRelative, 1e-3}});
  Coded c = EncodeDecode(*codec, DType::kF32, pushed, nullptr);
  double lo = 1e300, hi = -1e300;
  for (double v : values) {
    lo = std::min(lo, static_cast<double>(static_cast<float>(v)));
    hi = std::max(hi, static_cast<double>(static_cast<float>(v)));
  }
  EXPECT_DOUBLE_EQ(c.chunk.info.bound, 1e-3 * (hi - lo));
  const double worst = ExpectWithinBound(DType::kF32, pushed, c.decoded, 1e-3 * (hi - lo), "rel");
  EXPECT_GT(worst, 0.5e-3 * (hi - lo)) << "the bound should be used, not wasted";
}

TEST(LossyCodec, UnchangedTensorCostsAFewBytes) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(1 << 16);
  for (double& v : values) v = normal(rng);
  auto codec = Uniform(1e-3);
  Coded key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, values), nullptr);
  // The next version equals the reconstruction: every delta symbol is zero.
  Coded same = EncodeDecode(*codec, DType::kF32, key.decoded, &key.decoded);
  EXPECT_LT(same.chunk.payload.size(), 96u);  // of 256 KiB: header, 8 tables, 4 rANS states
  // Changes below the bound cost (almost) nothing either.
  std::vector<double> nudged(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    nudged[i] = Load(DType::kF32, key.decoded.data() + i * 4) + 1e-4 * normal(rng);
  }
  Coded small = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, nudged), &key.decoded);
  EXPECT_LT(small.chunk.payload.size(), 96u) << small.chunk.info.exact_elements << " exact";
}

TEST(LossyCodec, CodedSizeIsWithinTenPercentOfTheModelEntropy) {
  std::mt19937_64 rng(4);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(1 << 20);
  for (double& v : values) v = normal(rng) * 0.05;
  auto codec = Uniform(5e-3);
  Coded key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, values), nullptr);
  for (size_t i = 0; i < values.size(); ++i) values[i] += normal(rng) * 4e-3;
  Coded delta = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, values), &key.decoded);
  for (const Coded* c : {&key, &delta}) {
    const double achieved = 8.0 * c->chunk.payload.size();
    EXPECT_LT(achieved, 1.10 * c->chunk.info.model_entropy_bits + 1024)
        << "achieved " << achieved / values.size() << " bits/element, entropy "
        << c->chunk.info.model_entropy_bits / values.size();
  }
}

TEST(LossyCodecChains, ThreeHundredVersionRandomWalksOfEveryDtype) {
  for (size_t elements : {kSmallChunk, kLargeChunk}) {
    for (DType dtype : kLossyDtypes) {
      std::mt19937_64 rng(5);
      std::normal_distribution<double> normal(0, 1);
      RunChain(
          dtype, 1e-3, 300,
          [&](size_t v, std::vector<double>& x) {
            for (double& e : x) e = v == 0 ? normal(rng) : e + 2e-3 * normal(rng);
          },
          Quantizer::kUniform, elements);
    }
  }
}

TEST(LossyCodecChains, HeavyTailedSteps) {
  std::mt19937_64 rng(6);
  std::cauchy_distribution<double> cauchy(0, 1e-3);
  RunChain(DType::kF32, 1e-4, 300, [&](size_t, std::vector<double>& x) {
    for (double& e : x) e += cauchy(rng);
  });
}

TEST(LossyCodecChains, RangeChangesByOrdersOfMagnitude) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0, 1);
  RunChain(DType::kF32, 1e-3, 300, [&](size_t v, std::vector<double>& x) {
    const double scale = std::pow(10.0, static_cast<double>(v % 12) - 4);  // 1e-4 .. 1e7
    for (double& e : x) e = normal(rng) * scale;
  });
}

TEST(LossyCodecChains, AdversarialValuesAppearAndDisappear) {
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal(0, 1);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             -0.0,
                             1e-40,
                             3e38};
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (size_t elements : {kSmallChunk, kLargeChunk}) {
      RunChain(
          dtype, 1e-2, 300,
          [&](size_t v, std::vector<double>& x) {
            for (size_t i = 0; i < x.size(); ++i) {
              if ((i + v) % 17 == 0) {
                x[i] = specials[(i + v) % 6];
              } else if (!std::isfinite(x[i]) || std::abs(x[i]) > 1e6) {
                x[i] = normal(rng);
              } else {
                x[i] += 0.02 * normal(rng);
              }
            }
          },
          Quantizer::kUniform, elements);
    }
  }
}

// Element history (lossy_codec.cc): in large F32/F64 chunks each reconstruction carries, in its
// three lowest mantissa bits, how the element moved before, and deltas are coded in that
// context. It must keep the bound, keep exact zeros exact, switch itself off when the bound is
// too small for it, and pay off on momentum-like walks.
TEST(LossyCodecChains, ElementHistoryKeepsZerosAndTheBoundAndPaysOff) {
  constexpr size_t kContextModelByte = 3, kFlagsByte = 4;
  constexpr uint8_t kHistoryContexts = 3, kFlagHistory = 2;
  const double bound = 1e-3;
  auto codec = Uniform(bound);
  std::mt19937_64 rng(21);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> x(kLargeChunk), velocity(kLargeChunk, 0.0);
  for (double& e : x) e = 0.05 * normal(rng);
  std::vector<uint8_t> reference;
  size_t with_history = 0, with_scrambled_history = 0;
  for (int v = 0; v < 40; ++v) {
    for (size_t i = 0; i < x.size(); ++i) {
      velocity[i] = 0.9 * velocity[i] + 2e-4 * normal(rng);
      x[i] += velocity[i];
      if (i % 50 == 0) x[i] = 0.0;
      if (i % 500 == 25) x[i] = -0.0;
    }
    const auto pushed = Pack(DType::kF32, x);
    Coded c = EncodeDecode(*codec, DType::kF32, pushed, v ? &reference : nullptr);
    ASSERT_EQ(c.chunk.codec_id, CodecId::kLossyQuantized);
    const std::string& payload = c.chunk.payload;
    EXPECT_TRUE(payload[kFlagsByte] & kFlagHistory) << "version " << v;
    if (v > 0) {
      EXPECT_EQ(payload[kContextModelByte], kHistoryContexts) << "version " << v;
    }
    ExpectWithinBound(DType::kF32, pushed, c.decoded, bound, "version " + std::to_string(v));
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != 0) continue;
      EXPECT_EQ(0, std::memcmp(&pushed[4 * i], &c.decoded[4 * i], 4))
          << "version " << v << ": zero " << i << " not restored bit-exactly";
    }
    if (v >= 10) {
      // The same delta against a reference whose history bits are noise (values within a few
      // units in the last place; zeros left alone): only the contexts differ.
      std::vector<uint8_t> scrambled = reference;
      for (size_t i = 0; i < scrambled.size(); i += 4) {
        uint32_t bits;
        std::memcpy(&bits, &scrambled[i], 4);
        if (bits << 1) scrambled[i] ^= rng() & 7;
      }
      auto noisy = codec->Encode(DType::kF32, pushed, std::span<const uint8_t>(scrambled));
      ASSERT_TRUE(noisy.ok());
      with_history += payload.size();
      with_scrambled_history += noisy->payload.size();
    }
    reference = c.chunk.reconstruction;
  }
  EXPECT_LT(static_cast<double>(with_history), 0.95 * static_cast<double>(with_scrambled_history));

  // Values near 1000 under a bound of 1e-3: 8 units in the last place (6e-5 each) are not small
  // against the bound, so no history.
  std::vector<double> large(kLargeChunk);
  for (double& e : large) e = 1000 + normal(rng);
  Coded key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, large), nullptr);
  for (double& e : large) e += 1e-3 * normal(rng);
  const auto next = Pack(DType::kF32, large);
  Coded delta = EncodeDecode(*codec, DType::kF32, next, &key.chunk.reconstruction);
  ASSERT_EQ(delta.chunk.codec_id, CodecId::kLossyQuantized);
  EXPECT_FALSE(delta.chunk.payload[kFlagsByte] & kFlagHistory);
  EXPECT_NE(delta.chunk.payload[kContextModelByte], kHistoryContexts);
  ExpectWithinBound(DType::kF32, next, delta.decoded, bound, "large values");

  // History on a dtype that cannot carry it is corruption.
  Coded half = EncodeDecode(*codec, DType::kF16, Pack(DType::kF16, x), nullptr);
  ASSERT_EQ(half.chunk.codec_id, CodecId::kLossyQuantized);
  std::string bad = half.chunk.payload;
  bad[kFlagsByte] |= kFlagHistory;
  std::vector<uint8_t> out(half.decoded.size());
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  EXPECT_EQ((*decoder)->Decode(DType::kF16, AsBytes(bad), std::nullopt, out).code(),
            StatusCode::kDataLoss);
}

// Non-finite elements that do not change (attention masks of -inf, NaN placeholders) are
// "unchanged" symbols in a delta, restored bit-exactly, not verbatim copies in every version;
// a chunk that would be mostly verbatim is stored losslessly.
TEST(LossyCodec, UnchangedNonFiniteElementsCostNothing) {
  const double bound = 1e-3;
  auto codec = Uniform(bound);
  std::mt19937_64 rng(22);
  std::normal_distribution<double> normal(0, 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // A 64x128 causal mask (-inf above the diagonal, 0 elsewhere): mostly verbatim if quantized.
  std::vector<double> mask(64 * 128);
  for (size_t r = 0; r < 64; ++r) {
    for (size_t c = 0; c < 128; ++c) mask[r * 128 + c] = c > r ? -inf : 0.0;
  }
  Coded mask_key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, mask), nullptr);
  EXPECT_EQ(mask_key.chunk.codec_id, CodecId::kLosslessBytePlanes);
  EXPECT_LT(mask_key.chunk.payload.size(), 512u);
  Coded mask_delta = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, mask), &mask_key.decoded);
  EXPECT_LT(mask_delta.chunk.payload.size(), 128u);
  EXPECT_EQ(mask_delta.decoded, Pack(DType::kF32, mask));

  // Weights with a few non-finite elements (large chunk: history contexts too).
  std::vector<double> x(kLargeChunk);
  for (double& e : x) e = 0.05 * normal(rng);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = i % 2 ? -inf : inf;
  for (size_t i = 50; i < x.size(); i += 101) x[i] = nan;
  auto pushed = Pack(DType::kF32, x);
  const uint32_t nan_with_payload = 0x7fc01234;  // a quiet NaN with payload bits
  std::memcpy(&pushed[4 * 50], &nan_with_payload, 4);
  Coded key = EncodeDecode(*codec, DType::kF32, pushed, nullptr);
  std::vector<uint8_t> reference = key.chunk.reconstruction;
  for (int v = 1; v < 5; ++v) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isfinite(x[i])) x[i] += 2e-3 * normal(rng);
    }
    auto next = Pack(DType::kF32, x);
    std::memcpy(&next[4 * 50], &nan_with_payload, 4);
    Coded c = EncodeDecode(*codec, DType::kF32, next, &reference);
    ASSERT_EQ(c.chunk.codec_id, CodecId::kLossyQuantized);
    EXPECT_EQ(c.chunk.info.exact_elements, 0u) << "version " << v;
    ExpectWithinBound(DType::kF32, next, c.decoded, bound, "version " + std::to_string(v));
    reference = c.chunk.reconstruction;
  }
}

TEST(LossyCodecChains, OpenLoopDriftsPastTheBoundClosedLoopDoesNot) {
  const double bound = 1e-3;
  auto codec = Uniform(bound);
  std::mt19937_64 rng(9);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(4096);
  for (double& v : values) v = normal(rng);
  std::vector<uint8_t> pushed = Pack(DType::kF32, values);
  Coded key = EncodeDecode(*codec, DType::kF32, pushed, nullptr);
  std::vector<uint8_t> open_restored = key.decoded, closed_restored = key.decoded;
  std::vector<uint8_t> previous_input = pushed;
  double open_worst = 0, closed_worst = 0;
  for (int v = 1; v <= 300; ++v) {
    for (double& x : values) x += 1.3e-3 * normal(rng);
    pushed = Pack(DType::kF32, values);
    // Open loop: delta against the previous input, applied by the decoder to its own state.
    auto open = codec->Encode(DType::kF32, pushed, std::span<const uint8_t>(previous_input));
    ASSERT_TRUE(open.ok());
    std::vector<uint8_t> next(pushed.size());
    ASSERT_TRUE(codec
                    ->Decode(DType::kF32, AsBytes(open->payload),
                             std::span<const uint8_t>(open_restored), next)
                    .ok());
    open_restored = next;
    previous_input = pushed;
    // Closed loop.
    Coded closed = EncodeDecode(*codec, DType::kF32, pushed, &closed_restored);
    closed_restored = closed.decoded;
    for (size_t i = 0; i < values.size(); ++i) {
      const double x = Load(DType::kF32, pushed.data() + i * 4);
      open_worst =
          std::max(open_worst, std::abs(x - Load(DType::kF32, open_restored.data() + i * 4)));
      closed_worst =
          std::max(closed_worst, std::abs(x - Load(DType::kF32, closed_restored.data() + i * 4)));
    }
  }
  EXPECT_LE(closed_worst, bound);
  EXPECT_GT(open_worst, 3 * bound) << "open loop should accumulate error";
}

TEST(LossyCodec, CorruptPayloadsYieldDataLossNeverCrash) {
  std::mt19937_64 rng(10);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(3000);
  for (double& v : values) v = normal(rng);
  auto codec = Uniform(1e-2);
  const auto pushed = Pack(DType::kF32, values);
  Coded key = EncodeDecode(*codec, DType::kF32, pushed, nullptr);
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  std::vector<uint8_t> out(pushed.size());
  // Truncation at every length is always detected.
  for (size_t len = 0; len < key.chunk.payload.size(); len += 7) {
    const std::string cut = key.chunk.payload.substr(0, len);
    EXPECT_EQ((*decoder)->Decode(DType::kF32, AsBytes(cut), std::nullopt, out).code(),
              StatusCode::kDataLoss)
        << "length " << len;
  }
  // Random byte flips: an error or a (wrong) decode, never a crash or an out-of-bounds access
  // (the storage layer checks payload checksums before decoding).
  int detected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bad = key.chunk.payload;
    for (int k = 0; k < 1 + trial % 4; ++k)
      bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    detected += !(*decoder)->Decode(DType::kF32, AsBytes(bad), std::nullopt, out).ok();
  }
  EXPECT_GT(detected, 1000);
  // Wrong dtype, or a keyframe used as a delta.
  EXPECT_FALSE((*decoder)->Decode(DType::kF16, AsBytes(key.chunk.payload), std::nullopt, out).ok());
  EXPECT_FALSE(
      (*decoder)
          ->Decode(DType::kF32, AsBytes(key.chunk.payload), std::span<const uint8_t>(out), out)
          .ok());
}

TEST(LossyCodec, RejectsUnsupportedDtypesAndBadBounds) {
  std::vector<uint8_t> ints(16);
  EXPECT_EQ(Uniform(1e-3)->Encode(DType::kI32, ints, std::nullopt).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Uniform(-1)->Encode(DType::kF32, ints, std::nullopt).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(LossyCodecSupports(DType::kF8E4M3));
  // A bound far below BF16's resolution: quantizing cannot pay, the chunk is stored exactly.
  std::vector<double> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 1.0 + static_cast<double>(i % 97);
  const auto bf16 = Pack(DType::kBF16, values);
  Coded c = EncodeDecode(*Uniform(1e-9), DType::kBF16, bf16, nullptr);
  EXPECT_EQ(c.chunk.codec_id, CodecId::kLosslessBytePlanes);
  EXPECT_EQ(c.decoded, bf16);
  EXPECT_LT(c.chunk.payload.size(), bf16.size());
  EXPECT_TRUE(LossyCodecSupports(DType::kBF16));
}

TEST_P(EveryQuantizer, RandomAndAdversarialValuesOfEveryDtypeStayWithinBound) {
  const Quantizer quantizer = GetParam().quantizer;
  std::mt19937_64 rng(11);
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kLossyDtypes) {
    for (double bound : {1e-1, 1e-2, 1e-4, 1e-6, 0.0}) {
      std::normal_distribution<double> normal(0, 0.5);
      std::vector<double> values(3000);
      for (double& v : values) v = normal(rng);
      for (size_t i = 0; i < values.size(); i += 97) {
        values[i] = std::vector<double>{inf, -inf, std::nan(""), -0.0, 1e-40, 1e30}[i % 6];
      }
      const auto pushed = Pack(dtype, values);
      auto codec = Lossy(GetParam(), bound);
      const std::string where = std::string(QuantizerName(quantizer)) + " " +
                                std::string(DTypeName(dtype)) + " bound " + std::to_string(bound);
      Coded key = EncodeDecode(*codec, dtype, pushed, nullptr);
      ExpectWithinBound(dtype, pushed, key.decoded, bound, where + " keyframe");
      for (double& v : values) v += normal(rng) * 0.01;
      const auto next = Pack(dtype, values);
      Coded delta = EncodeDecode(*codec, dtype, next, &key.decoded);
      ExpectWithinBound(dtype, next, delta.decoded, bound, where + " delta");
    }
  }
}

TEST_P(EveryQuantizer, ChainsOfThreeHundredVersionsStayWithinBound) {
  std::mt19937_64 rng(12);
  std::normal_distribution<double> normal(0, 1);
  std::cauchy_distribution<double> cauchy(0, 1e-3);
  for (size_t elements : {kSmallChunk, kLargeChunk}) {
    RunChain(
        DType::kF32, 1e-3, elements == kSmallChunk ? 300 : 100,
        [&](size_t v, std::vector<double>& x) {
          const double scale = std::pow(10.0, static_cast<double>(v % 7) - 3);
          for (size_t i = 0; i < x.size(); ++i) {
            x[i] = v % 50 == 0 ? normal(rng) * scale
                               : x[i] + (i % 2 ? cauchy(rng) : 2e-3 * normal(rng));
          }
        },
        GetParam(), elements);
  }
}

TEST_P(EveryQuantizer, EmptyScalarAndUnchangedChunks) {
  auto codec = Lossy(GetParam(), 1e-3);
  for (DType dtype : kLossyDtypes) {
    Coded empty = EncodeDecode(*codec, dtype, {}, nullptr);
    EXPECT_TRUE(empty.decoded.empty());
    // An empty chunk's delta against its empty reference is a delta too (found by fuzzing: it
    // was written as a keyframe, which the decoder then refused).
    const std::vector<uint8_t> nothing;
    Coded empty_delta = EncodeDecode(*codec, dtype, {}, &nothing);
    EXPECT_TRUE(empty_delta.decoded.empty());
    const auto scalar = Pack(dtype, {42.0});
    Coded s = EncodeDecode(*codec, dtype, scalar, nullptr);
    ExpectWithinBound(dtype, scalar, s.decoded, 1e-3, "scalar");
  }
  std::mt19937_64 rng(13);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(1 << 14);
  for (double& v : values) v = normal(rng);
  Coded key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, values), nullptr);
  Coded same = EncodeDecode(*codec, DType::kF32, key.decoded, &key.decoded);
  EXPECT_LT(same.chunk.payload.size(), 200u) << "an unchanged chunk costs a few bytes";
}

// Bounds whose quantizer steps would overflow: a relative bound on an F64 chunk whose range
// exceeds a double (found by fuzzing: the step became infinite, the "unchanged" symbol decoded
// to 0 * inf = NaN, and NaN elements with payload bits lost them in the decoder but not in the
// encoder's reconstruction), and an absolute bound of DBL_MAX. Every element stays within the
// bound the chunk is coded with (capped at DBL_MAX / 16), NaN bit patterns survive, and decoder
// and encoder agree (EncodeDecode).
TEST_P(EveryQuantizer, BoundsWithOverflowingSteps) {
  const double max = std::numeric_limits<double>::max();
  std::vector<double> values = {1e308, -1e308, 0.5, -0.0, 3.0, max, -max};
  for (int i = 0; i < 300; ++i) values.push_back(std::ldexp(1.0 + i, i % 2000 - 1000));
  std::vector<uint8_t> chunk = Pack(DType::kF64, values);
  const uint64_t nan_with_payload = 0xffffffffffffff0full;
  std::memcpy(chunk.data() + 2 * 8, &nan_with_payload, 8);
  for (const ErrorBound& bound : {ErrorBound{ErrorBound::Kind::kRelative, 1e-3},
                                  ErrorBound{ErrorBound::Kind::kAbsolute, max}}) {
    LossyCodecOptions options;
    options.quantizer = GetParam().quantizer;
    options.reclaimable = GetParam().lattice;
    options.bound = bound;
    auto codec = NewLossyCodec(options);
    Coded key = EncodeDecode(*codec, DType::kF64, chunk, nullptr);
    Coded same = EncodeDecode(*codec, DType::kF64, chunk, &key.decoded);
    for (const Coded* coded : {&key, &same}) {
      EXPECT_EQ(std::memcmp(coded->decoded.data() + 2 * 8, &nan_with_payload, 8), 0)
          << "a NaN lost its bits";
      for (size_t i = 0; i < values.size(); ++i) {
        if (i == 2) continue;
        const double r = Load(DType::kF64, coded->decoded.data() + i * 8);
        EXPECT_TRUE(std::abs(values[i] - r) <= max / 16) << "element " << i << " restored as " << r;
      }
    }
  }
}

// A payload written before the bound was capped could carry an infinite step (a relative bound
// on an F64 chunk whose range overflows). Its unchanged elements were reconstructed by the
// encoder as p + 0, keeping NaN bits; the decoder must do the same rather than add 0 * inf.
// Such a payload is made here by setting a fresh one's bound and step to +inf.
TEST(LossyCodec, UnchangedElementsUnderAnInfiniteStepKeepTheirBits) {
  std::vector<double> values(300);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25 * std::sin(static_cast<double>(i));
  std::vector<uint8_t> chunk = Pack(DType::kF64, values);
  const uint64_t nan_with_payload = 0xffffffffffffff0full;
  for (size_t i = 2; i < values.size(); i += 7) std::memcpy(&chunk[i * 8], &nan_with_payload, 8);
  LossyCodecOptions options;
  options.quantizer = Quantizer::kUniform;
  options.bound = {ErrorBound::Kind::kAbsolute, 1e-3};
  auto codec = NewLossyCodec(options);
  Coded key = EncodeDecode(*codec, DType::kF64, chunk, nullptr);
  Coded same = EncodeDecode(*codec, DType::kF64, key.decoded, &key.decoded);
  ASSERT_EQ(same.chunk.codec_id, CodecId::kLossyQuantized);
  ASSERT_EQ(same.chunk.info.exact_elements, 0u);
  std::string payload = same.chunk.payload;
  const double inf = std::numeric_limits<double>::infinity();
  std::memcpy(payload.data() + 5, &inf, 8);   // bound
  std::memcpy(payload.data() + 29, &inf, 8);  // the uniform quantizer's step
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  std::vector<uint8_t> out(chunk.size());
  ASSERT_TRUE(
      (*decoder)
          ->Decode(DType::kF64, AsBytes(payload), std::span<const uint8_t>(key.decoded), out)
          .ok());
  EXPECT_EQ(out, key.decoded);
}

TEST_P(EveryQuantizer, CorruptPayloadsNeverCrash) {
  std::mt19937_64 rng(14);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(5000);
  for (double& v : values) v = normal(rng) * 0.1;
  auto codec = Lossy(GetParam(), 1e-3);
  Coded key = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, values), nullptr);
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  std::vector<uint8_t> out(values.size() * 4);
  for (int trial = 0; trial < 500; ++trial) {
    std::string bad = key.chunk.payload;
    const bool truncated = trial % 3 == 0;
    if (truncated) {
      bad.resize(rng() % bad.size());
    } else {
      bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    // A flipped bit may still decode (to other values); anything else is DataLoss.
    const StatusCode code = (*decoder)->Decode(DType::kF32, AsBytes(bad), std::nullopt, out).code();
    if (truncated) {
      EXPECT_EQ(code, StatusCode::kDataLoss) << "trial " << trial;
    } else {
      EXPECT_TRUE(code == StatusCode::kOk || code == StatusCode::kDataLoss) << "trial " << trial;
    }
  }
}

// Variances and counts must stay non-negative: in a chunk without negative values no element
// restores negative, even when the lattice moves between versions (relative bounds).
TEST_P(EveryQuantizer, NonNegativeChunksNeverRestoreNegative) {
  LossyCodecOptions options;
  options.quantizer = GetParam().quantizer;
  options.reclaimable = GetParam().lattice;
  options.bound = {ErrorBound::Kind::kRelative, 1e-2};
  auto codec = NewLossyCodec(options);
  std::mt19937_64 rng(16);
  std::exponential_distribution<double> tiny(1e8);
  std::vector<double> v(8192);
  std::vector<uint8_t> reference;
  for (int version = 0; version < 30; ++version) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = tiny(rng) * (1 + version % 5);  // range moves
    const auto pushed = Pack(DType::kF32, v);
    Coded c = EncodeDecode(*codec, DType::kF32, pushed, version ? &reference : nullptr);
    reference = c.decoded;
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_FALSE(std::signbit(Load(DType::kF32, c.decoded.data() + i * 4)))
          << "version " << version << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Quantizers, EveryQuantizer, ::testing::ValuesIn(kAllCodings),
                         QuantizerParamName);

// Each quantizer is what its paper describes, recorded in the payload.
TEST(LossyCodec, QuantizersBehaveAsDescribed) {
  std::mt19937_64 rng(15);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values(1 << 16);
  for (double& v : values) v = normal(rng) * 0.05;
  const auto first = Pack(DType::kF32, values);
  Coded key = EncodeDecode(*Uniform(1e-3), DType::kF32, first, nullptr);
  // The next version, a training-like step away: each quantizer codes the delta.
  for (double& v : values) v += normal(rng) * 3e-3;
  const auto pushed = Pack(DType::kF32, values);
  for (Quantizer q :
       {Quantizer::kUniform, Quantizer::kExponent, Quantizer::kFloat, Quantizer::kCosine}) {
    Coded c = EncodeDecode(*Lossy(q, 1e-3), DType::kF32, pushed, &key.chunk.reconstruction);
    ASSERT_EQ(c.chunk.codec_id, CodecId::kLossyQuantized) << QuantizerName(q);
    EXPECT_EQ(c.chunk.info.quantizer, static_cast<uint8_t>(q));
    EXPECT_EQ(c.chunk.payload[1], static_cast<char>(q));
    ExpectWithinBound(DType::kF32, pushed, c.decoded, 1e-3, std::string(QuantizerName(q)));
  }
  // Cosine levels are finer for large magnitudes: a large value's error is far below the bound.
  std::vector<double> spiky(4096, 0.0);
  spiky[7] = 100.0;
  Coded cos = EncodeDecode(*Lossy(Quantizer::kCosine, 1e-3), DType::kF32, Pack(DType::kF32, spiky),
                           nullptr);
  EXPECT_LT(std::abs(Load(DType::kF32, cos.decoded.data() + 7 * 4) - 100.0), 1e-4);
  // auto picks the smallest: on mostly-unchanged data the lattice quantizer.
  EXPECT_NE(EncodeDecode(*Lossy(Quantizer::kAuto, 1e-3), DType::kF32, pushed, nullptr)
                .chunk.info.quantizer,
            0);
  // The float format is honoured when given.
  LossyCodecOptions e4m3;
  e4m3.quantizer = Quantizer::kFloat;
  e4m3.bound = {ErrorBound::Kind::kAbsolute, 1e-3};
  e4m3.float_exponent_bits = 4;
  e4m3.float_mantissa_bits = 3;
  Coded f = EncodeDecode(*NewLossyCodec(e4m3), DType::kF32, pushed, nullptr);
  EXPECT_GT(f.chunk.info.exact_elements, 0u) << "E4M3 cannot meet 1e-3 everywhere: outliers";
  ExpectWithinBound(DType::kF32, pushed, f.decoded, 1e-3, "E4M3");
}

}  // namespace
}  // namespace ckpt
