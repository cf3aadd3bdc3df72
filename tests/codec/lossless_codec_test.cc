#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ckpt/codec/tensor_codec.h"
#include "test_support.h"

namespace ckpt {
namespace {

std::vector<uint8_t> ToBytes(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<uint8_t> RoundTrip(const TensorCodec& codec, DType dtype,
                               const std::vector<uint8_t>& data,
                               const std::vector<uint8_t>* reference) {
  std::optional<std::span<const uint8_t>> ref;
  if (reference) ref = std::span<const uint8_t>(*reference);
  auto encoded = codec.Encode(dtype, data, ref);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  std::vector<uint8_t> out(data.size());
  auto payload = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(encoded->payload.data()),
                                          encoded->payload.size());
  Status s = codec.Decode(dtype, payload, ref, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::vector<uint8_t> AdversarialFloats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          1e-40f,
                          3.14159f};
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  // NaN with a payload and the sign bit set.
  uint32_t nan_payload = 0xffc12345u;
  bytes.resize(bytes.size() + 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &nan_payload, 4);
  return bytes;
}

class LosslessCodecAllDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(LosslessCodecAllDtypes, KeyframesAndDeltasRoundTripBitExactly) {
  const DType dtype = GetParam();
  auto codec = NewLosslessCodec();
  std::mt19937_64 rng(static_cast<uint64_t>(dtype));
  for (size_t elements : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
    auto current = ToBytes(testing::RandomBytes(rng, elements * DTypeSize(dtype)));
    auto reference = current;
    for (size_t i = 0; i < reference.size(); i += 3) reference[i] ^= static_cast<uint8_t>(rng());
    EXPECT_EQ(RoundTrip(*codec, dtype, current, nullptr), current) << elements;
    EXPECT_EQ(RoundTrip(*codec, dtype, current, &reference), current) << elements;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, LosslessCodecAllDtypes,
                         ::testing::Values(DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                           DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                           DType::kU64, DType::kU32, DType::kU16, DType::kU8,
                                           DType::kBool, DType::kF8E4M3, DType::kF8E5M2),
                         [](const auto& param_info) {
                           return std::string(DTypeName(param_info.param));
                         });

TEST(LosslessCodec, AdversarialFloatsRoundTripBitExactly) {
  auto codec = NewLosslessCodec();
  auto data = AdversarialFloats();
  std::vector<uint8_t> reference(data.rbegin(), data.rend());
  EXPECT_EQ(RoundTrip(*codec, DType::kF32, data, nullptr), data);
  EXPECT_EQ(RoundTrip(*codec, DType::kF32, data, &reference), data);
}

TEST(LosslessCodec, DeltaOfUnchangedTensorIsTiny) {
  auto codec = NewLosslessCodec();
  std::mt19937_64 rng(7);
  auto data = ToBytes(testing::RandomBytes(rng, 1 << 20));
  auto encoded = codec->Encode(DType::kF32, data, std::span<const uint8_t>(data));
  ASSERT_TRUE(encoded.ok());
  EXPECT_LT(encoded->payload.size(), 1000u);
}

TEST(LosslessCodec, BytePlanesBeatPlainZstdOnSmoothFloats) {
  auto codec = NewLosslessCodec();
  std::mt19937_64 rng(1);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> w(1 << 18);
  for (auto& x : w) x = n(rng);
  std::vector<uint8_t> bytes(w.size() * 4);
  std::memcpy(bytes.data(), w.data(), bytes.size());
  auto planes = codec->Encode(DType::kF32, bytes, std::nullopt);
  auto plain = codec->Encode(DType::kU32, bytes, std::nullopt);  // integers: one plane
  ASSERT_TRUE(planes.ok() && plain.ok());
  EXPECT_LT(planes->payload.size(), plain->payload.size());
}

TEST(LosslessCodec, CorruptPayloadsYieldDataLossNeverCrash) {
  auto codec = NewLosslessCodec();
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(4096);
  for (auto& x : w) x = n(rng);
  std::vector<uint8_t> bytes(w.size() * 4);
  std::memcpy(bytes.data(), w.data(), bytes.size());
  auto encoded = codec->Encode(DType::kF32, bytes, std::nullopt);
  ASSERT_TRUE(encoded.ok());
  int failures = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string payload = encoded->payload;
    if (i % 3 == 0) {
      payload.resize(rng() % payload.size());
    } else {
      payload[rng() % payload.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    std::vector<uint8_t> out(bytes.size());
    Status s = codec->Decode(
        DType::kF32,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()),
        std::nullopt, out);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      ++failures;
    }
  }
  EXPECT_GT(failures, 0);
}

TEST(LosslessCodec, RejectsUnknownCodecIdAsDataLoss) {
  auto codec = CodecForDecoding(999);
  EXPECT_EQ(codec.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(CodecForDecoding(1).ok());
}

}  // namespace
}  // namespace ckpt
