// Stored bytes never change by accident: every way the codecs code a chunk (each quantizer, the
// lattice with and without element history, the low-rank shift, exact re-encodings, the
// lossless codec and the lossy codec's lossless fallback, every float dtype, small and large
// chunks, NaN/±Inf/−0.0/denormals) is run on fixed inputs, and the XXH3 digest of every payload
// and reconstruction is compared with the digest recorded when the coding was last changed on
// purpose. A change to the codecs' code that is meant to leave payloads alone must leave this
// table alone; a deliberate format change bumps a payload version and records new digests.
//
// The inputs come from a fixed SplitMix64 stream and integer-exact arithmetic (no libm), so they
// are the same on every machine. On a mismatch the test prints the digests it computed, in the
// table's own form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ckpt/base/hashing.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "lossy/format.h"  // internal: the payload versions
#include "lossy_test_support.h"

namespace ckpt {
namespace {

// SplitMix64: a fixed, platform-independent stream.
class Stream {
 public:
  explicit Stream(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1p-53; }  // [0, 1)
  // Irwin–Hall: mean 0, variance 1, exact arithmetic.
  double Normal() {
    double sum = 0;
    for (int k = 0; k < 12; ++k) sum += Uniform();
    return sum - 6;
  }

 private:
  uint64_t state_;
};

enum class Workload {
  kWeights,         // a random walk of small steps (trained weights)
  kSpecials,        // the same with NaN, ±Inf, ±0.0, denormals and huge values planted
  kMoments,         // positive values spanning orders of magnitude (Adam's exp_avg_sq)
  kGrowingMoments,  // the same, all growing by 2-4% a version (ratio mode with an offset)
  kLowRankDrift     // a 64 x 128 matrix drifting by rank-4 steps plus noise
};

constexpr size_t kLowRankRows = 64, kLowRankCols = 128;

std::vector<std::vector<double>> Chain(Workload workload, size_t n, int versions, uint64_t seed) {
  Stream rng(seed);
  std::vector<double> v(n);
  for (double& e : v) {
    e = workload == Workload::kMoments || workload == Workload::kGrowingMoments
            ? 1e-8 * (1 + 1000 * rng.Uniform() * rng.Uniform())
            : 0.05 * rng.Normal();
  }
  std::vector<std::vector<double>> chain;
  for (int t = 0; t < versions; ++t) {
    if (t > 0) {
      if (workload == Workload::kLowRankDrift) {
        constexpr int kRank = 4;
        std::vector<double> u(kLowRankRows * kRank), w(kLowRankCols * kRank);
        for (double& e : u) e = rng.Normal();
        for (double& e : w) e = rng.Normal();
        for (size_t i = 0; i < kLowRankRows; ++i) {
          for (size_t j = 0; j < kLowRankCols; ++j) {
            double s = 0;
            for (int k = 0; k < kRank; ++k) s += u[i * kRank + k] * w[j * kRank + k];
            v[i * kLowRankCols + j] += 2e-3 * s + 5e-4 * rng.Normal();
          }
        }
      } else if (workload == Workload::kMoments) {
        for (double& e : v) e *= 0.9 + 0.2 * rng.Uniform();
      } else if (workload == Workload::kGrowingMoments) {
        for (double& e : v) e *= 1.02 + 0.02 * rng.Uniform();
      } else {
        for (double& e : v) e += 4e-3 * rng.Normal();
      }
    }
    std::vector<double> version = v;
    if (workload == Workload::kSpecials) {
      const double inf = std::numeric_limits<double>::infinity();
      const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                                 inf,
                                 -inf,
                                 0.0,
                                 -0.0,
                                 0x1p-140,    // an F32 denormal
                                 -0x1p-1070,  // an F64 denormal
                                 1e30,
                                 -3e38};
      for (size_t k = 0; k < std::size(specials); ++k) {
        // Some stay put from version to version, some move.
        const size_t at = (k * 977 + (k % 2 ? t * 131 : 0)) % n;
        if (at < n) version[at] = specials[k];
      }
    }
    chain.push_back(std::move(version));
  }
  return chain;
}

// One coding: a chain coded closed-loop (each delta against the previous reconstruction).
struct Case {
  const char* name;
  DType dtype;
  Workload workload;
  size_t elements;
  int versions;
  std::function<std::unique_ptr<TensorCodec>(LossyKernels)> codec;
  // When set, the coded chain is re-encoded exactly (EncodeExactOnLattice): version t against
  // version t - 2's reconstruction (a keyframe for t < 2).
  bool exact_reencoding = false;
};

LossyCodecOptions Lossy(Quantizer quantizer, ErrorBound::Kind kind, double bound) {
  LossyCodecOptions options;
  options.quantizer = quantizer;
  options.bound = {kind, bound};
  return options;
}

std::function<std::unique_ptr<TensorCodec>(LossyKernels)> With(LossyCodecOptions options) {
  return [options](LossyKernels kernels) {
    LossyCodecOptions with_kernels = options;
    with_kernels.kernels = kernels;
    return NewLossyCodec(with_kernels);
  };
}

LossyCodecOptions Absolute(Quantizer quantizer, double bound = 5e-3) {
  return Lossy(quantizer, ErrorBound::Kind::kAbsolute, bound);
}

LossyCodecOptions Lattice(bool history, uint32_t low_rank_columns = 0) {
  LossyCodecOptions options = Absolute(Quantizer::kUniform);
  options.reclaimable = true;
  options.history = history;
  options.low_rank_columns = low_rank_columns;
  return options;
}

LossyCodecOptions FloatFormat(uint8_t exponent_bits, uint8_t mantissa_bits) {
  LossyCodecOptions options = Absolute(Quantizer::kFloat);
  options.float_exponent_bits = exponent_bits;
  options.float_mantissa_bits = mantissa_bits;
  return options;
}

LossyCodecOptions DropBelowMean(LossyCodecOptions options, double factor) {
  options.zero_below_mean = factor;
  return options;
}

LossyCodecOptions NoHistory(LossyCodecOptions options) {
  options.history = false;
  return options;
}

std::vector<Case> Cases() {
  using K = ErrorBound::Kind;
  using Q = Quantizer;
  using W = Workload;
  constexpr size_t kLarge = 8192;  // contexts, four rANS states, element history
  constexpr size_t kSmall = 1000;  // one context, one state
  constexpr size_t kMatrix = kLowRankRows * kLowRankCols;
  const auto lossless = [](LossyKernels) { return NewLosslessCodec(); };
  std::vector<Case> cases = {
      {"uniform/f32", DType::kF32, W::kWeights, kLarge, 4, With(Absolute(Q::kUniform))},
      {"uniform/f64", DType::kF64, W::kWeights, kLarge, 4, With(Absolute(Q::kUniform))},
      {"uniform/f16", DType::kF16, W::kWeights, kLarge, 4, With(Absolute(Q::kUniform))},
      {"uniform/bf16", DType::kBF16, W::kWeights, kLarge, 4, With(Absolute(Q::kUniform))},
      {"uniform/f32-small", DType::kF32, W::kWeights, kSmall, 3, With(Absolute(Q::kUniform))},
      {"uniform/f32-no-history", DType::kF32, W::kWeights, kLarge, 3,
       With(NoHistory(Absolute(Q::kUniform)))},
      {"uniform/f32-specials", DType::kF32, W::kSpecials, kLarge, 4, With(Absolute(Q::kUniform))},
      {"uniform/f64-specials", DType::kF64, W::kSpecials, kSmall, 3, With(Absolute(Q::kUniform))},
      {"uniform/f32-relative", DType::kF32, W::kWeights, kLarge, 3,
       With(Lossy(Q::kUniform, K::kRelative, 1e-3))},
      {"exponent/f32", DType::kF32, W::kWeights, kLarge, 3, With(Absolute(Q::kExponent))},
      {"exponent/f16-small", DType::kF16, W::kWeights, kSmall, 3, With(Absolute(Q::kExponent))},
      {"exponent/f32-specials", DType::kF32, W::kSpecials, kLarge, 3, With(Absolute(Q::kExponent))},
      {"float/f32", DType::kF32, W::kWeights, kLarge, 3, With(Absolute(Q::kFloat))},
      {"float/bf16", DType::kBF16, W::kWeights, kLarge, 3, With(Absolute(Q::kFloat))},
      {"float/f32-e5m10", DType::kF32, W::kWeights, kLarge, 3, With(FloatFormat(5, 10))},
      {"float/f64-e3m7-small", DType::kF64, W::kWeights, kSmall, 3, With(FloatFormat(3, 7))},
      {"cosine/f32", DType::kF32, W::kWeights, kLarge, 3, With(Absolute(Q::kCosine))},
      {"cosine/f16", DType::kF16, W::kWeights, kLarge, 3, With(Absolute(Q::kCosine))},
      {"cosine/f64-specials", DType::kF64, W::kSpecials, kSmall, 3, With(Absolute(Q::kCosine))},
      {"auto/f32", DType::kF32, W::kWeights, kLarge, 3, With(Absolute(Q::kAuto))},
      {"auto/f64-small", DType::kF64, W::kWeights, kSmall, 3, With(Absolute(Q::kAuto))},
      {"auto/bf16-specials", DType::kBF16, W::kSpecials, kLarge, 3, With(Absolute(Q::kAuto))},
      {"log/f32", DType::kF32, W::kMoments, kLarge, 4, With(Lossy(Q::kAuto, K::kPointwise, 1e-2))},
      {"log/f64", DType::kF64, W::kMoments, kLarge, 3, With(Lossy(Q::kAuto, K::kPointwise, 1e-2))},
      {"log/f16-small", DType::kF16, W::kMoments, kSmall, 3,
       With(Lossy(Q::kAuto, K::kPointwise, 5e-2))},
      {"log/bf16", DType::kBF16, W::kMoments, kLarge, 3,
       With(Lossy(Q::kAuto, K::kPointwise, 5e-2))},
      {"log/f32-specials", DType::kF32, W::kSpecials, kLarge, 3,
       With(Lossy(Q::kAuto, K::kPointwise, 1e-2))},
      {"log/f32-ratio-offset", DType::kF32, W::kGrowingMoments, kLarge, 4,
       With(Lossy(Q::kAuto, K::kPointwise, 5e-2))},
      {"log/f64-ratio-offset-small", DType::kF64, W::kGrowingMoments, kSmall, 3,
       With(Lossy(Q::kAuto, K::kPointwise, 5e-2))},
      {"log/f32-drop-rule", DType::kF32, W::kSpecials, kLarge, 3,
       With(DropBelowMean(Lossy(Q::kAuto, K::kPointwise, 0.25), 2))},
      {"log/bf16-drop-rule-small", DType::kBF16, W::kSpecials, kSmall, 2,
       With(DropBelowMean(Lossy(Q::kAuto, K::kPointwise, 0.25), 1))},
      {"lattice/f32-history", DType::kF32, W::kWeights, kLarge, 4, With(Lattice(true))},
      {"lattice/f64-history", DType::kF64, W::kWeights, kLarge, 3, With(Lattice(true))},
      {"lattice/f32-flat", DType::kF32, W::kWeights, kLarge, 4, With(Lattice(false))},
      {"lattice/f16", DType::kF16, W::kWeights, kLarge, 3, With(Lattice(true))},
      {"lattice/bf16-small", DType::kBF16, W::kWeights, kSmall, 3, With(Lattice(true))},
      {"lattice/f32-specials", DType::kF32, W::kSpecials, kLarge, 4, With(Lattice(true))},
      {"low-rank/f32", DType::kF32, W::kLowRankDrift, kMatrix, 4,
       With(Lattice(true, kLowRankCols))},
      {"low-rank/f64", DType::kF64, W::kLowRankDrift, kMatrix, 3,
       With(Lattice(true, kLowRankCols))},
      {"low-rank/f32-specials", DType::kF32, W::kSpecials, kMatrix, 3,
       With(Lattice(true, kLowRankCols))},
      {"exact/lattice-history", DType::kF32, W::kWeights, kLarge, 4, With(Lattice(true)), true},
      {"exact/lattice-flat", DType::kF32, W::kWeights, kLarge, 4, With(Lattice(false)), true},
      {"exact/lattice-f64-specials", DType::kF64, W::kSpecials, kSmall, 3, With(Lattice(true)),
       true},
      {"exact/low-rank", DType::kF32, W::kLowRankDrift, kMatrix, 4,
       With(Lattice(true, kLowRankCols)), true},
      {"fallback/f32-tiny-bound", DType::kF32, W::kWeights, kLarge, 3,
       With(Absolute(Q::kUniform, 1e-12))},
      {"fallback/f32-zero-bound", DType::kF32, W::kSpecials, kSmall, 3,
       With(Absolute(Q::kUniform, 0))},
      {"lossless/f32", DType::kF32, W::kWeights, kLarge, 3, lossless},
      {"lossless/f64-specials", DType::kF64, W::kSpecials, kSmall, 3, lossless},
      {"lossless/bf16", DType::kBF16, W::kWeights, kLarge, 3, lossless},
      {"lossless/f16", DType::kF16, W::kWeights, kSmall, 3, lossless},
  };
  return cases;
}

// The digests recorded for Cases(), in order.
struct Recorded {
  const char* name;
  uint64_t digest;
};
constexpr Recorded kRecorded[] = {
    {"uniform/f32", 0x611e454bf32948d5ull},
    {"uniform/f64", 0x2e770f10481d34cfull},
    {"uniform/f16", 0x64719460c90129f1ull},
    {"uniform/bf16", 0x09efabb3b28387eaull},
    {"uniform/f32-small", 0xefe7b737b3056c1full},
    {"uniform/f32-no-history", 0x348fd24eac2ebe26ull},
    {"uniform/f32-specials", 0x8d077daa7cae07c9ull},
    {"uniform/f64-specials", 0x1a91f2c8584410e2ull},
    {"uniform/f32-relative", 0x04d349e511076b6aull},
    {"exponent/f32", 0x9caf4333717c3b92ull},
    {"exponent/f16-small", 0x068c3789395dcea4ull},
    {"exponent/f32-specials", 0xa6a4b8734fa1154eull},
    {"float/f32", 0xfaf6562c75f56ee7ull},
    {"float/bf16", 0xd463db5a19747f4dull},
    {"float/f32-e5m10", 0x6c8c0fb4afbda1b5ull},
    {"float/f64-e3m7-small", 0xcb86b5fa5df94518ull},
    {"cosine/f32", 0xd6730fe349603967ull},
    {"cosine/f16", 0x16a28955408cd02eull},
    {"cosine/f64-specials", 0x955d8728cc8bbea4ull},
    {"auto/f32", 0x79c2b309fe697363ull},
    {"auto/f64-small", 0x057f075185520c2bull},
    {"auto/bf16-specials", 0x774d5f709dbe64ccull},
    {"log/f32", 0xde1e51bc3ede59e5ull},
    {"log/f64", 0x1a4597462e2d38adull},
    {"log/f16-small", 0xe73966e6a69e5285ull},
    {"log/bf16", 0x1de3a78bf963ca30ull},
    {"log/f32-specials", 0xd3d8b69e04af6ab0ull},
    {"log/f32-ratio-offset", 0x5c846fa1130d04baull},
    {"log/f64-ratio-offset-small", 0x0643fbceaefd7a98ull},
    {"log/f32-drop-rule", 0x408d6272f4c3eec4ull},
    {"log/bf16-drop-rule-small", 0xd03b7df61090a71eull},
    {"lattice/f32-history", 0x442004afbb865da9ull},
    {"lattice/f64-history", 0xa3f1c4ad1e4f0533ull},
    {"lattice/f32-flat", 0xc34a22316ea0273aull},
    {"lattice/f16", 0x6db391658925a4c4ull},
    {"lattice/bf16-small", 0x8b19a86d309f2f81ull},
    {"lattice/f32-specials", 0xc5352d8b03cefd74ull},
    {"low-rank/f32", 0x9f1a3a3ac5cef268ull},
    {"low-rank/f64", 0x29a4cce47788750cull},
    {"low-rank/f32-specials", 0x9bd01c36d6264a4cull},
    {"exact/lattice-history", 0x6e8b61195dd2d5ccull},
    {"exact/lattice-flat", 0xceb3ec2c418dbb46ull},
    {"exact/lattice-f64-specials", 0xfc5af0a87dad1a31ull},
    {"exact/low-rank", 0x47da7cdaf71106c1ull},
    {"fallback/f32-tiny-bound", 0xe1e14c02dcbc538full},
    {"fallback/f32-zero-bound", 0x3496b610541487b6ull},
    {"lossless/f32", 0xe1e14c02dcbc538full},
    {"lossless/f64-specials", 0x1918a8faeb994be3ull},
    {"lossless/bf16", 0x6380b73b37c30ccaull},
    {"lossless/f16", 0x524cbb4a803c70eeull},
};

// Folds one coded chunk into a running digest: codec id, payload, reconstruction.
uint64_t Fold(uint64_t digest, const EncodedChunk& chunk, std::span<const uint8_t> decoded) {
  std::string bytes(reinterpret_cast<const char*>(&digest), sizeof(digest));
  const auto id = static_cast<uint16_t>(chunk.codec_id);
  bytes.append(reinterpret_cast<const char*>(&id), sizeof(id));
  bytes += chunk.payload;
  bytes.append(reinterpret_cast<const char*>(decoded.data()), decoded.size());
  return Xxh3Checksum({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The payload versions a case wrote (byte 0 of lossy payloads; 0 for lossless ones).
struct Coded {
  uint64_t digest = 0;
  std::vector<int> payload_versions;
};

// A decoder of `id` that runs `kernels`.
std::unique_ptr<TensorCodec> DecoderOf(CodecId id, LossyKernels kernels) {
  if (id != CodecId::kLossyQuantized) return NewLosslessCodec();
  LossyCodecOptions options;
  options.kernels = kernels;
  return NewLossyCodec(options);
}

Coded Code(const Case& c, LossyKernels kernels) {
  Coded coded;
  const auto codec = c.codec(kernels);
  const auto chain = Chain(c.workload, c.elements, c.versions, c.elements * 31 + c.versions);
  std::vector<std::vector<uint8_t>> reconstructions;
  std::vector<std::string> payloads;
  for (size_t t = 0; t < chain.size(); ++t) {
    const std::vector<uint8_t> pushed = testing::Pack(c.dtype, chain[t]);
    std::optional<std::span<const uint8_t>> reference;
    if (t > 0) reference = std::span<const uint8_t>(reconstructions.back());
    auto chunk = codec->Encode(c.dtype, pushed, reference);
    EXPECT_TRUE(chunk.ok()) << c.name << " version " << t << ": " << chunk.status().ToString();
    if (!chunk.ok()) return coded;
    std::vector<uint8_t> decoded(pushed.size());
    const auto decoder = DecoderOf(chunk->codec_id, kernels);
    EXPECT_TRUE(decoder->Decode(c.dtype, Bytes(chunk->payload), reference, decoded).ok())
        << c.name << " version " << t;
    if (!chunk->reconstruction_is_input) {
      EXPECT_EQ(decoded, chunk->reconstruction) << c.name;
    }
    coded.digest = Fold(coded.digest, *chunk, decoded);
    coded.payload_versions.push_back(
        chunk->codec_id == CodecId::kLossyQuantized ? static_cast<uint8_t>(chunk->payload[0]) : 0);
    reconstructions.push_back(std::move(decoded));
    payloads.push_back(std::move(chunk->payload));
  }
  if (!c.exact_reencoding) return coded;
  for (size_t t = 0; t < chain.size(); ++t) {
    std::optional<std::span<const uint8_t>> reference;
    if (t >= 2) reference = std::span<const uint8_t>(reconstructions[t - 2]);
    auto chunk =
        EncodeExactOnLattice(c.dtype, Bytes(payloads[t]), reconstructions[t], reference, kernels);
    EXPECT_TRUE(chunk.ok()) << c.name << " exact " << t << ": " << chunk.status().ToString();
    if (!chunk.ok()) return coded;
    std::vector<uint8_t> decoded(reconstructions[t].size());
    const auto decoder = DecoderOf(chunk->codec_id, kernels);
    EXPECT_TRUE(decoder->Decode(c.dtype, Bytes(chunk->payload), reference, decoded).ok());
    EXPECT_EQ(decoded, reconstructions[t]) << c.name << " exact " << t;
    coded.digest = Fold(coded.digest, *chunk, decoded);
  }
  return coded;
}

bool Wrote(const Coded& coded, int payload_version) {
  return std::find(coded.payload_versions.begin(), coded.payload_versions.end(), payload_version) !=
         coded.payload_versions.end();
}

void ExpectRecordedDigests(LossyKernels kernels) {
  const std::vector<Case> cases = Cases();
  std::string table;
  bool all_match = cases.size() == std::size(kRecorded);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Coded coded = Code(cases[k], kernels);
    char line[128];
    std::snprintf(line, sizeof(line), "    {\"%s\", 0x%016" PRIx64 "ull},\n", cases[k].name,
                  coded.digest);
    table += line;
    const bool match = k < std::size(kRecorded) && kRecorded[k].digest == coded.digest &&
                       std::string(kRecorded[k].name) == cases[k].name;
    EXPECT_TRUE(match) << cases[k].name << ": payloads or reconstructions changed";
    all_match &= match;
  }
  if (!all_match) std::printf("The digests of this build:\n%s", table.c_str());
}

TEST(PayloadDigests, EveryCodingWritesTheRecordedBytes) {
  ExpectRecordedDigests(LossyKernels::kFastest);
}

// The portable kernels write the same bytes as the CPU's (AVX2 where it has it).
TEST(PayloadDigests, ThePortableKernelsWriteTheSameBytes) {
  ExpectRecordedDigests(LossyKernels::kPortable);
}

// The cases cover what they are named for: each payload version is written somewhere, and the
// lossless fallback really falls back.
TEST(PayloadDigests, TheCasesReachEveryPayloadVersion) {
  constexpr int kNewest = lossy::kPayloadVersionLogOffset;
  bool version[kNewest + 1] = {};
  bool fell_back = false;
  for (const Case& c : Cases()) {
    const Coded coded = Code(c, LossyKernels::kFastest);
    for (int v : coded.payload_versions) {
      ASSERT_TRUE(v >= 0 && v <= kNewest) << c.name << " wrote payload version " << v;
      version[v] = true;
    }
    if (std::string(c.name).starts_with("fallback/")) fell_back |= Wrote(coded, 0);
    if (std::string(c.name) == "low-rank/f32" || std::string(c.name) == "low-rank/f64") {
      EXPECT_TRUE(Wrote(coded, 4)) << c.name << " never took the low-rank shift";
    }
  }
  for (int v = 1; v <= kNewest; ++v) EXPECT_TRUE(version[v]) << "no payload of version " << v;
  EXPECT_TRUE(fell_back) << "no lossy chunk fell back to the lossless codec";
}

}  // namespace
}  // namespace ckpt
