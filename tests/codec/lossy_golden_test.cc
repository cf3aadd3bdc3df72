// Payloads written by earlier releases of the lossy codec (tests/codec/testdata) decode to the
// bytes their encoders reconstructed: formats are forever.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "lossy_test_support.h"
#include "testdata/lossy_history_payloads.h"
#include "testdata/lossy_lattice_history_payloads.h"
#include "testdata/lossy_lattice_payloads.h"
#include "testdata/lossy_log_offset_payloads.h"
#include "testdata/lossy_log_wide_index_payload.h"
#include "testdata/lossy_low_rank_payloads.h"
#include "testdata/lossy_v1_payloads.h"

namespace ckpt {
namespace {

using namespace testing;  // the lossy codec tests' helpers: lossy_test_support.h

std::string FromHex(std::string_view hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return bytes;
}

uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// TinyEpsOnChunksSpanningManyOrdersOfMagnitude as written by the encoder before the fix: that
// payload, which its release could not decode, decodes now to the bytes its encoder reconstructed,
// within the bound.
TEST(LossyCodecPointwise, EarlierPayloadsWithWideIndicesDecode) {
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  ASSERT_TRUE(decoder.ok());
  const std::string payload = FromHex(golden::kLogWideIndexKeyframeHex);
  std::vector<uint8_t> out(128 * 8);
  const Status decoded = (*decoder)->Decode(DType::kF64, AsBytes(payload), std::nullopt, out);
  ASSERT_TRUE(decoded.ok()) << decoded.ToString();
  EXPECT_EQ(Fnv1a(out), golden::kLogWideIndexKeyframeFnv);
  std::vector<double> x(128);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = i % 10 == 0 ? 1e-300 : 1.0 + 1e-3 * std::sin(static_cast<double>(i));
  }
  ExpectWithinPointwise(DType::kF64, Pack(DType::kF64, x), out, 1e-7, "golden");
}

// Formats are forever: payloads written by the first lossy release (one rANS state, raster
// contexts, no element history) decode to the bytes that release reconstructed.
TEST(LossyCodec, PayloadsOfTheFirstReleaseStillDecode) {
  const auto from_hex = FromHex;
  const auto fnv = Fnv1a;
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  ASSERT_TRUE(decoder.ok());
  const std::string keyframe = from_hex(golden::kV1KeyframeHex);
  const std::string delta = from_hex(golden::kV1DeltaHex);
  std::vector<uint8_t> first(4096 * 4), second(4096 * 4);
  ASSERT_TRUE((*decoder)->Decode(DType::kF32, AsBytes(keyframe), std::nullopt, first).ok());
  EXPECT_EQ(fnv(first), golden::kV1KeyframeFnv);
  ASSERT_TRUE((*decoder)
                  ->Decode(DType::kF32, AsBytes(delta), std::span<const uint8_t>(first), second)
                  .ok());
  EXPECT_EQ(fnv(second), golden::kV1DeltaFnv);
  // Raw extra bits (large symbols) keep their bit order.
  const std::string wide = from_hex(golden::kV1WideKeyframeHex);
  std::vector<uint8_t> third(4096 * 4);
  ASSERT_TRUE((*decoder)->Decode(DType::kF32, AsBytes(wide), std::nullopt, third).ok());
  EXPECT_EQ(fnv(third), golden::kV1WideKeyframeFnv);
  // And they are what they claim to be: within the bound of the values they were made from.
  for (size_t i = 0; i < 4096; ++i) {
    const double x = static_cast<float>(0.03 * std::sin(static_cast<double>(i) / 50.0) +
                                        0.012 * std::sin(static_cast<double>(i) / 13.0));
    ASSERT_LE(std::abs(Load(DType::kF32, second.data() + 4 * i) - x), 5e-3) << i;
  }
}

// Decodes a golden keyframe (`elements` F32 elements) and a delta against it, checks both
// against the FNV-1a hashes of what the writing release reconstructed, and returns the delta's
// output.
std::vector<uint8_t> DecodeGoldenPair(const char* keyframe_hex, uint64_t keyframe_fnv,
                                      const char* delta_hex, uint64_t delta_fnv,
                                      size_t elements = 8192,
                                      LossyKernels kernels = LossyKernels::kFastest) {
  LossyCodecOptions options;
  options.kernels = kernels;
  const auto decoder = NewLossyCodec(options);
  const std::string keyframe = FromHex(keyframe_hex), delta = FromHex(delta_hex);
  std::vector<uint8_t> first(elements * 4), second(elements * 4);
  EXPECT_TRUE(decoder->Decode(DType::kF32, AsBytes(keyframe), std::nullopt, first).ok());
  EXPECT_EQ(Fnv1a(first), keyframe_fnv);
  EXPECT_TRUE(
      decoder->Decode(DType::kF32, AsBytes(delta), std::span<const uint8_t>(first), second).ok());
  EXPECT_EQ(Fnv1a(second), delta_fnv);
  return second;
}

// Payloads with element history (history contexts, four rANS states) decode to the bytes the
// release that wrote them reconstructed, history bits included.
TEST(LossyCodec, PayloadsWithElementHistoryStillDecode) {
  const std::vector<uint8_t> second =
      DecodeGoldenPair(golden::kHistoryKeyframeHex, golden::kHistoryKeyframeFnv,
                       golden::kHistoryDeltaHex, golden::kHistoryDeltaFnv);
  for (size_t i = 0; i < 8192; ++i) {
    const double d = static_cast<double>(i);
    const double x = static_cast<float>(0.03 * std::sin(d / 50.0) + 0.012 * std::sin(d / 13.0) +
                                        (i % 101 ? 0.0 : 0.5));
    ASSERT_LE(std::abs(Load(DType::kF32, second.data() + 4 * i) - x), 5e-3) << i;
  }
}

// Low-rank lattice deltas (payload version 4) decode to the bytes the release that wrote them
// reconstructed, within the bound of the values they were written from.
// Ratio-mode log deltas on a shifted lattice (version 5) decode to the bytes their encoder
// reconstructed, within the pointwise bound.
TEST(LossyCodecPointwise, RatioOffsetPayloadsStillDecode) {
  ASSERT_EQ(FromHex(golden::kLogOffsetDeltaHex)[0], 5);
  const std::vector<uint8_t> second =
      DecodeGoldenPair(golden::kLogOffsetKeyframeHex, golden::kLogOffsetKeyframeFnv,
                       golden::kLogOffsetDeltaHex, golden::kLogOffsetDeltaFnv, 512);
  std::vector<double> x1(512);
  for (size_t i = 0; i < x1.size(); ++i) {
    const double x0 = static_cast<float>(1e-8 * std::ldexp(1.0, static_cast<int>(i % 20)) *
                                         (1 + 0.1 * std::sin(static_cast<double>(i))));
    x1[i] = static_cast<float>(x0 * (1.03 + 0.01 * std::sin(3.0 * static_cast<double>(i))));
  }
  ExpectWithinPointwise(DType::kF32, Pack(DType::kF32, x1), second, 0.05, "golden");
}

TEST(LossyCodec, LowRankPayloadsStillDecode) {
  ASSERT_EQ(FromHex(golden::kLowRankDeltaHex)[0], 4);
  // The same bytes from the portable kernels as from the ones this CPU chooses.
  DecodeGoldenPair(golden::kLowRankKeyframeHex, golden::kLowRankKeyframeFnv,
                   golden::kLowRankDeltaHex, golden::kLowRankDeltaFnv, 8192,
                   LossyKernels::kPortable);
  const std::vector<uint8_t> second =
      DecodeGoldenPair(golden::kLowRankKeyframeHex, golden::kLowRankKeyframeFnv,
                       golden::kLowRankDeltaHex, golden::kLowRankDeltaFnv);
  std::vector<double> x1(8192);
  for (int i = 0; i < 128; ++i) {
    for (int j = 0; j < 64; ++j) {
      const double v = 0.03 * std::sin(i / 7.0 + j / 5.0) + 0.02 * std::cos(i * j / 31.0);
      double d = 1e-3 * std::sin(i * 12.9898 + j * 78.233);
      for (int k = 0; k < 3; ++k) {
        d += std::sin(i * (k + 1) / 9.0 + k) * std::cos(j * (k + 2) / 11.0 - k) * 6e-3 / (k + 1);
      }
      x1[i * 64 + j] = static_cast<float>(v + d);
    }
  }
  ExpectWithinBound(DType::kF32, Pack(DType::kF32, x1), second, 5e-3, "golden low-rank delta");
}

TEST(LossyCodec, LatticePayloadsStillDecode) {
  const std::vector<uint8_t> second =
      DecodeGoldenPair(golden::kLatticeKeyframeHex, golden::kLatticeKeyframeFnv,
                       golden::kLatticeDeltaHex, golden::kLatticeDeltaFnv);
  // Every element is a lattice point of pitch 2 * 5e-3 (none of these went verbatim).
  for (size_t i = 0; i < 8192; ++i) {
    const double r = Load(DType::kF32, second.data() + 4 * i);
    ASSERT_EQ(r, static_cast<float>(std::nearbyint(r / 1e-2) * 1e-2)) << i;
  }
}

// Lattice payloads with element history decode to the bytes the release that wrote them
// reconstructed: lattice points with history bits, and the exact re-encoding (explicit states).
TEST(LossyCodec, LatticePayloadsWithElementHistoryStillDecode) {
  const std::vector<uint8_t> second =
      DecodeGoldenPair(golden::kLatticeHistoryKeyframeHex, golden::kLatticeHistoryKeyframeFnv,
                       golden::kLatticeHistoryDeltaHex, golden::kLatticeHistoryDeltaFnv);
  size_t with_history = 0;
  for (size_t i = 0; i < 8192; ++i) {
    uint32_t bits;
    std::memcpy(&bits, second.data() + 4 * i, 4);
    const float lattice_point = std::bit_cast<float>(bits & ~7u);
    const double r = Load(DType::kF32, second.data() + 4 * i);
    // The lattice point of pitch 2 * 5e-3 within 8 units in the last place.
    ASSERT_LE(std::abs(r - static_cast<float>(std::nearbyint(r / 1e-2) * 1e-2)),
              8 * std::abs(std::nextafter(lattice_point, 1.0f) - lattice_point))
        << i;
    with_history += (bits & 7u) != 0;
  }
  EXPECT_GT(with_history, 4096u);
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  ASSERT_TRUE(decoder.ok());
  const std::string exact = FromHex(golden::kLatticeExplicitHistoryKeyframeHex);
  std::vector<uint8_t> out(8192 * 4);
  ASSERT_TRUE((*decoder)->Decode(DType::kF32, AsBytes(exact), std::nullopt, out).ok());
  EXPECT_EQ(Fnv1a(out), golden::kLatticeExplicitHistoryKeyframeFnv);
  EXPECT_EQ(out, second);
}

// The three lowest mantissa bits of every F32 element cleared: what is left of a lattice
// reconstruction when its history state is taken out.
}  // namespace
}  // namespace ckpt
