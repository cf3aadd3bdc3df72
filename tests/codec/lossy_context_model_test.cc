// Which context model the lossy encoder codes a chunk's symbols in (docs/format.md,
// "context_model"): the choice changes speed and size, never the reconstruction.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ckpt/codec/lossy_codec.h"
#include "lossy_test_support.h"

namespace ckpt {
namespace {

using namespace testing;  // the lossy codec tests' helpers: lossy_test_support.h

// A large keyframe codes each symbol in the context of the two previous ones only where that
// saves a real share of the bytes (it halves the decoder's speed): weights-like noise, whose
// neighbours say nothing about each other, codes order-0; a chunk of runs keeps the contexts.
TEST(LossyCodec, KeyframesUseTheTwoPreviousSymbolsOnlyWhereTheyPay) {
  constexpr size_t kContextModelByte = 3;
  constexpr uint8_t kPrevious2 = 1, kOrder0 = 2;
  constexpr size_t kElements = 4 * kLargeChunk;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> noise(kElements), runs(kElements);
  for (double& e : noise) e = 0.05 * normal(rng);
  for (size_t i = 0; i < kElements; ++i) runs[i] = (i / 64) % 2 ? 0.05 * normal(rng) : 0.0;
  for (const Coding coding : {Coding(Quantizer::kUniform), Coding(Quantizer::kUniform, true)}) {
    auto codec = Lossy(coding, 5e-3);
    Coded n = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, noise), nullptr);
    Coded r = EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, runs), nullptr);
    ASSERT_EQ(n.chunk.codec_id, CodecId::kLossyQuantized);
    ASSERT_EQ(r.chunk.codec_id, CodecId::kLossyQuantized);
    EXPECT_EQ(n.chunk.payload[kContextModelByte], kOrder0) << ::testing::PrintToString(coding);
    EXPECT_EQ(r.chunk.payload[kContextModelByte], kPrevious2) << ::testing::PrintToString(coding);
    ExpectWithinBound(DType::kF32, Pack(DType::kF32, noise), n.decoded, 5e-3, "noise");
    ExpectWithinBound(DType::kF32, Pack(DType::kF32, runs), r.decoded, 5e-3, "runs");
  }
}

}  // namespace
}  // namespace ckpt
