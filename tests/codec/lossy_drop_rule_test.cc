// Property tests of the drop rule (LossyCodecOptions::zero_below_mean) on the pointwise mode:
// in a keyframe every finite element meets |x - r| <= max(eps |x|, f * mean |x|), the elements
// within the floor restore as +0 and the others within eps |x|; NaN, ±Inf and ±0.0 restore
// exactly; deltas ignore the rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ckpt/codec/lossy_codec.h"
#include "lossy_test_support.h"
#include "test_support.h"

namespace ckpt {
namespace {

using namespace testing;  // the lossy codec tests' helpers: lossy_test_support.h

std::unique_ptr<TensorCodec> DropCodec(double eps, double factor) {
  LossyCodecOptions options;
  options.quantizer = Quantizer::kLog;
  options.bound = {ErrorBound::Kind::kPointwise, eps};
  options.zero_below_mean = factor;
  return NewLossyCodec(options);
}

// The mean |x| of the finite elements as the dtype holds them.
double MeanAbsolute(DType dtype, const std::vector<uint8_t>& bytes) {
  const size_t size = DTypeSize(dtype);
  long double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < bytes.size() / size; ++i) {
    const double x = Load(dtype, bytes.data() + i * size);
    if (std::isfinite(x)) sum += std::abs(x), ++count;
  }
  return count ? static_cast<double>(sum / count) : 0.0;
}

// The drop rule's guarantee element by element. Returns how many elements were dropped.
size_t ExpectWithinDropRule(DType dtype, const std::vector<uint8_t>& pushed,
                            const std::vector<uint8_t>& restored, double eps, double factor,
                            const std::string& where) {
  const size_t size = DTypeSize(dtype);
  EXPECT_EQ(pushed.size(), restored.size()) << where;
  // The encoder's mean may differ from this one in the last bits of a long double.
  const double floor = factor * MeanAbsolute(dtype, pushed) * (1 + 1e-12);
  size_t dropped = 0;
  for (size_t i = 0; i < pushed.size() / size; ++i) {
    const uint8_t* xp = pushed.data() + i * size;
    const uint8_t* rp = restored.data() + i * size;
    const double x = Load(dtype, xp);
    const double r = Load(dtype, rp);
    if (!std::isfinite(x) || x == 0) {
      EXPECT_EQ(0, std::memcmp(xp, rp, size))
          << where << " element " << i << ": " << x << " restored as " << r;
      continue;
    }
    if (r == 0) {
      EXPECT_FALSE(std::signbit(r)) << where << " element " << i << ": dropped as -0.0";
      EXPECT_LE(std::abs(x), floor)
          << where << " element " << i << ": " << x << " dropped above the floor " << floor;
      ++dropped;
      continue;
    }
    EXPECT_LE(std::abs(x - r), eps * std::abs(x))
        << where << " element " << i << ": pushed " << x << " restored " << r;
    if (::testing::Test::HasFailure()) return dropped;
  }
  return dropped;
}

TEST(LossyCodecDropRule, KeyframesOfEveryDtypeMeetTheRuleOnRandomAndAdversarialValues) {
  std::mt19937_64 rng(41);
  std::normal_distribution<double> normal(0, 1);
  for (DType dtype : kLossyDtypes) {
    for (double factor : {0.5, 2.0, 3.0}) {
      for (size_t elements : {kSmallChunk, kLargeChunk}) {
        // Adam-like momentum: signed, heavy-tailed, a few exact zeros and special values.
        std::vector<double> x(elements);
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = 1e-3 * normal(rng) * std::exp(2 * normal(rng));
          if (i % 41 == 0) x[i] = kSpecialValues[(i / 41) % std::size(kSpecialValues)];
        }
        const std::string where =
            std::string(DTypeName(dtype)) + " factor " + std::to_string(factor);
        const auto pushed = Pack(dtype, x);
        Coded with_rule = EncodeDecode(*DropCodec(0.25, factor), dtype, pushed, nullptr);
        const size_t dropped =
            ExpectWithinDropRule(dtype, pushed, with_rule.decoded, 0.25, factor, where);
        EXPECT_GT(dropped, elements / 4) << where;
        Coded without = EncodeDecode(*Lossy(Quantizer::kLog, 0.25), dtype, pushed, nullptr);
        EXPECT_LT(with_rule.chunk.payload.size(), without.chunk.payload.size()) << where;
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// Huge and tiny magnitudes: an F64 chunk near the dtype's maximum (the mean must not overflow
// into an infinite floor that drops everything), one of denormals only, one all NaN.
TEST(LossyCodecDropRule, HugeTinyAndNonFiniteChunks) {
  const double max = std::numeric_limits<double>::max();
  std::vector<double> huge(kLargeChunk), tiny(kLargeChunk),
      nan(kSmallChunk, std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < kLargeChunk; ++i) {
    huge[i] = (i % 2 ? -1 : 1) * max / static_cast<double>(1 + i % 7);
    tiny[i] = (i % 3 ? 1 : -1) * 4.9e-324 * static_cast<double>(1 + i % 1000);
  }
  auto codec = DropCodec(0.1, 2.0);
  const auto huge_bytes = Pack(DType::kF64, huge);
  Coded h = EncodeDecode(*codec, DType::kF64, huge_bytes, nullptr);
  const size_t dropped = ExpectWithinDropRule(DType::kF64, huge_bytes, h.decoded, 0.1, 2.0, "huge");
  EXPECT_LT(dropped, kLargeChunk) << "an infinite floor dropped everything";
  const auto tiny_bytes = Pack(DType::kF64, tiny);
  Coded t = EncodeDecode(*codec, DType::kF64, tiny_bytes, nullptr);
  ExpectWithinDropRule(DType::kF64, tiny_bytes, t.decoded, 0.1, 2.0, "denormals");
  const auto nan_bytes = Pack(DType::kF32, nan);
  Coded n = EncodeDecode(*codec, DType::kF32, nan_bytes, nullptr);
  EXPECT_EQ(n.decoded, nan_bytes);
}

TEST(LossyCodecDropRule, EmptyAndScalarChunks) {
  auto codec = DropCodec(0.25, 2.0);
  for (DType dtype : kLossyDtypes) {
    Coded empty = EncodeDecode(*codec, dtype, {}, nullptr);
    EXPECT_TRUE(empty.decoded.empty());
    // One element is its own mean: with a factor >= 1 it is within its floor.
    const auto scalar = Pack(dtype, {-0.75});
    Coded s = EncodeDecode(*codec, dtype, scalar, nullptr);
    ExpectWithinDropRule(dtype, scalar, s.decoded, 0.25, 2.0, std::string(DTypeName(dtype)));
  }
}

// A delta's symbol 0 is "unchanged", so the rule cannot drop there: a delta codes the plain
// pointwise bound (storage codes tensors under the rule as keyframes in every version).
TEST(LossyCodecDropRule, DeltasKeepThePointwiseBound) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> x(kLargeChunk);
  for (double& v : x) v = 1e-3 * normal(rng);
  auto codec = DropCodec(0.25, 2.0);
  const auto first = Pack(DType::kF32, x);
  Coded key = EncodeDecode(*codec, DType::kF32, first, nullptr);
  for (double& v : x) v = 0.1 * v + 1e-3 * normal(rng);
  const auto second = Pack(DType::kF32, x);
  Coded delta = EncodeDecode(*codec, DType::kF32, second, &key.chunk.reconstruction);
  ExpectWithinPointwise(DType::kF32, second, delta.decoded, 0.25, "delta");
}

}  // namespace
}  // namespace ckpt
