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

namespace ckpt {
namespace {

// A chain of `links` versions of a drifting F32 chunk, with its encoded payloads.
struct Chain {
  std::vector<std::vector<uint8_t>> versions;
  std::vector<std::string> payloads;  // keyframe first
};

Chain MakeChain(const TensorCodec& codec, DType dtype, size_t bytes, int links) {
  std::mt19937_64 rng(links);
  Chain c;
  c.versions.push_back(ToBytes(testing::RandomBytes(rng, bytes)));
  for (int i = 1; i < links; ++i) {
    auto next = c.versions.back();
    for (size_t j = 0; j < next.size(); j += 1 + rng() % 7) next[j] ^= static_cast<uint8_t>(rng());
    c.versions.push_back(std::move(next));
  }
  for (int i = 0; i < links; ++i) {
    std::optional<std::span<const uint8_t>> ref;
    if (i > 0) ref = std::span<const uint8_t>(c.versions[i - 1]);
    c.payloads.push_back(codec.Encode(dtype, c.versions[i], ref)->payload);
  }
  return c;
}

std::span<const uint8_t> Span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(LosslessChainDecoder, ReplaysChainsOfEveryDtypeBitExactly) {
  auto codec = NewLosslessCodec();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64, DType::kI64, DType::kU8}) {
    const size_t bytes = 4096 * DTypeSize(dtype);
    Chain chain = MakeChain(*codec, dtype, bytes, 12);
    for (size_t target = 0; target < chain.payloads.size(); ++target) {
      auto decoder = codec->NewChainDecoder(dtype, bytes);
      ASSERT_TRUE(decoder->StartFromKeyframe(Span(chain.payloads[0])).ok());
      for (size_t i = 1; i <= target; ++i) {
        ASSERT_TRUE(decoder->ApplyDelta(Span(chain.payloads[i])).ok());
      }
      std::vector<uint8_t> out;
      ASSERT_TRUE(decoder->Finish(&out).ok());
      ASSERT_EQ(out, chain.versions[target]) << DTypeName(dtype) << " target " << target;
    }
    // Starting from a decoded middle version gives the same result.
    auto decoder = codec->NewChainDecoder(dtype, bytes);
    ASSERT_TRUE(decoder->StartFromDecoded(chain.versions[5]).ok());
    for (size_t i = 6; i < chain.payloads.size(); ++i) {
      ASSERT_TRUE(decoder->ApplyDelta(Span(chain.payloads[i])).ok());
    }
    std::vector<uint8_t> out;
    ASSERT_TRUE(decoder->Finish(&out).ok());
    EXPECT_EQ(out, chain.versions.back());
  }
}

// The default (link-by-link) decoder of the interface agrees with the lossless fast path.
class LinkByLinkOnly final : public TensorCodec {
 public:
  explicit LinkByLinkOnly(const TensorCodec* inner) : inner_(inner) {}
  CodecId id() const override { return inner_->id(); }
  Result<EncodedChunk> Encode(DType d, std::span<const uint8_t> c,
                              std::optional<std::span<const uint8_t>> r) const override {
    return inner_->Encode(d, c, r);
  }
  Status Decode(DType d, std::span<const uint8_t> p, std::optional<std::span<const uint8_t>> r,
                std::span<uint8_t> o) const override {
    return inner_->Decode(d, p, r, o);
  }

 private:
  const TensorCodec* inner_;
};

// The link-by-link decoder reads a decoded start in place: it neither changes it nor depends on
// anything but it, with or without deltas after it.
TEST(LinkByLinkChainDecoder, StartsFromADecodedReconstructionWithoutChangingIt) {
  auto codec = NewLosslessCodec();
  LinkByLinkOnly generic(codec.get());
  Chain chain = MakeChain(*codec, DType::kF32, 4 * 3000, 8);
  for (size_t start = 0; start + 1 < chain.versions.size(); ++start) {
    const std::vector<uint8_t> base = chain.versions[start];
    for (size_t last = start; last < chain.versions.size(); ++last) {
      auto decoder = generic.NewChainDecoder(DType::kF32, 4 * 3000);
      ASSERT_TRUE(decoder->StartFromDecoded(base).ok());
      for (size_t i = start + 1; i <= last; ++i) {
        ASSERT_TRUE(decoder->ApplyDelta(Span(chain.payloads[i])).ok());
      }
      std::vector<uint8_t> out(7, 0xab);  // Finish replaces what is there
      ASSERT_TRUE(decoder->Finish(&out).ok());
      EXPECT_EQ(out, chain.versions[last]) << "from " << start << " to " << last;
      EXPECT_EQ(base, chain.versions[start]) << "the start was written to";
    }
  }
  auto wrong_length = generic.NewChainDecoder(DType::kF32, 4 * 2999);
  EXPECT_EQ(wrong_length->StartFromDecoded(chain.versions[0]).code(), StatusCode::kDataLoss);
}

TEST(LosslessChainDecoder, AgreesWithLinkByLinkDecoding) {
  auto codec = NewLosslessCodec();
  LinkByLinkOnly generic(codec.get());
  Chain chain = MakeChain(*codec, DType::kF16, 2 * 10000, 9);
  std::vector<uint8_t> fast, slow;
  for (auto [c, out] : {std::pair<const TensorCodec*, std::vector<uint8_t>*>{codec.get(), &fast},
                        {&generic, &slow}}) {
    auto decoder = c->NewChainDecoder(DType::kF16, 2 * 10000);
    ASSERT_TRUE(decoder->StartFromKeyframe(Span(chain.payloads[0])).ok());
    for (size_t i = 1; i < chain.payloads.size(); ++i) {
      ASSERT_TRUE(decoder->ApplyDelta(Span(chain.payloads[i])).ok());
    }
    ASSERT_TRUE(decoder->Finish(out).ok());
  }
  EXPECT_EQ(fast, slow);
  EXPECT_EQ(fast, chain.versions.back());
}

TEST(LosslessChainDecoder, RejectsMismatchedAndCorruptLinks) {
  auto codec = NewLosslessCodec();
  Chain chain = MakeChain(*codec, DType::kF32, 4 * 5000, 3);
  auto decoder = codec->NewChainDecoder(DType::kF32, 4 * 5000);
  EXPECT_EQ(decoder->ApplyDelta(Span(chain.payloads[1])).code(), StatusCode::kDataLoss);
  ASSERT_TRUE(decoder->StartFromKeyframe(Span(chain.payloads[0])).ok());
  std::string corrupt = chain.payloads[1];
  corrupt.resize(corrupt.size() / 2);
  EXPECT_EQ(decoder->ApplyDelta(Span(corrupt)).code(), StatusCode::kDataLoss);
  auto wrong_length = codec->NewChainDecoder(DType::kF32, 4 * 4000);
  EXPECT_EQ(wrong_length->StartFromKeyframe(Span(chain.payloads[0])).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ckpt
