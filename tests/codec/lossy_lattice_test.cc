// The lattice (reconstructions that depend on a version's values alone), its exact
// re-encodings for garbage collection, and the low-rank shift of the lattice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "lossy_test_support.h"

namespace ckpt {
namespace {

using namespace testing;  // the lossy codec tests' helpers: lossy_test_support.h

std::vector<uint8_t> WithoutHistoryBits(std::vector<uint8_t> f32) {
  for (size_t i = 0; i + 4 <= f32.size(); i += 4) f32[i] &= 0xf8;
  return f32;
}

// Lattice points depend on the pushed values alone: the same values reached through different
// chains restore to the same lattice points (elements stored verbatim aside); only the history
// state in the lowest mantissa bits (chunks large enough for contexts) tells the chains apart.
TEST(LossyCodecLattice, ReconstructionsDoNotDependOnTheChain) {
  auto codec = Lossy({Quantizer::kUniform, true}, 1e-3);
  std::mt19937_64 rng(40);
  std::normal_distribution<double> normal(0, 1);
  for (size_t n : {kSmallChunk, kLargeChunk}) {
    std::vector<double> v(n);
    for (double& e : v) e = 0.1 * normal(rng);
    const auto v0 = Pack(DType::kF32, v);
    for (double& e : v) e += 3e-3 * normal(rng);
    const auto v1 = Pack(DType::kF32, v);
    for (double& e : v) e += 3e-3 * normal(rng);
    const auto v2 = Pack(DType::kF32, v);
    Coded k0 = EncodeDecode(*codec, DType::kF32, v0, nullptr);
    Coded d1 = EncodeDecode(*codec, DType::kF32, v1, &k0.decoded);
    Coded via_chain = EncodeDecode(*codec, DType::kF32, v2, &d1.decoded);
    Coded direct = EncodeDecode(*codec, DType::kF32, v2, &k0.decoded);
    Coded keyframe = EncodeDecode(*codec, DType::kF32, v2, nullptr);
    EXPECT_EQ(WithoutHistoryBits(via_chain.decoded), WithoutHistoryBits(direct.decoded)) << n;
    EXPECT_EQ(WithoutHistoryBits(via_chain.decoded), WithoutHistoryBits(keyframe.decoded)) << n;
    if (n == kSmallChunk) {  // no history: the same bits
      EXPECT_EQ(via_chain.decoded, direct.decoded);
      EXPECT_EQ(via_chain.decoded, keyframe.decoded);
    } else {
      EXPECT_NE(via_chain.decoded, keyframe.decoded);
    }
    ExpectWithinBound(DType::kF32, v2, via_chain.decoded, 1e-3, "lattice");
  }
}

// A lossy decoder running the portable kernels (true) or the ones this CPU chooses (false).
std::unique_ptr<TensorCodec> DecoderRunning(bool portable) {
  LossyCodecOptions options;
  options.kernels = portable ? LossyKernels::kPortable : LossyKernels::kFastest;
  return NewLossyCodec(options);
}

// The lattice's deltas, with and without element history, decode with this CPU's vector kernels
// (AVX2 where it has them, eight elements at a time) and with the portable ones to the encoder's
// reconstruction: adversarial values, large moves and a length that is no multiple of eight
// take the per-element path inside the vector loops.
TEST(LossyCodecLattice, EveryKernelDecodesTheLatticesDeltas) {
  const double inf = std::numeric_limits<double>::infinity();
  for (bool history : {false, true}) {
    SCOPED_TRACE(history ? "with history" : "plain lattice");
    LossyCodecOptions options;
    options.quantizer = Quantizer::kUniform;
    options.reclaimable = true;
    options.history = history;
    options.bound = {ErrorBound::Kind::kAbsolute, 1e-3};
    auto codec = NewLossyCodec(options);
    std::mt19937_64 rng(43);
    std::normal_distribution<double> normal(0, 1);
    std::vector<double> x(kLargeChunk + 13);
    for (double& e : x) e = 0.1 * normal(rng);
    std::vector<uint8_t> previous;
    for (size_t t = 0; t < 5; ++t) {
      for (double& e : x) e += 2e-3 * normal(rng);
      std::vector<double> pushed_values = x;
      for (size_t i = 5 * t; i < x.size(); i += 1013) {
        pushed_values[i] =
            std::vector<double>{inf, -inf, std::nan(""), -0.0, 1e-40, 0.0, 0.5}[(i + t) % 7];
      }
      const auto pushed = Pack(DType::kF32, pushed_values);
      std::optional<std::span<const uint8_t>> ref;
      if (t) ref = std::span<const uint8_t>(previous);
      auto encoded = codec->Encode(DType::kF32, pushed, ref);
      ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
      for (bool portable : {false, true}) {
        std::vector<uint8_t> decoded(pushed.size());
        const Status s =
            DecoderRunning(portable)->Decode(DType::kF32, AsBytes(encoded->payload), ref, decoded);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_EQ(decoded, encoded->reconstruction)
            << "version " << t << (portable ? ", portable kernels" : ", the CPU's kernels");
      }
      ExpectWithinBound(DType::kF32, pushed, encoded->reconstruction, 1e-3,
                        "version " + std::to_string(t));
      previous = encoded->reconstruction;
    }
  }
}

// Garbage collection's exact re-encoding: a version of a lattice chain re-encoded against an
// older version (or as a keyframe) decodes to exactly its reconstruction, for every dtype and
// with adversarial values, and costs about one delta over the gap, not a full-precision copy.
TEST(LossyCodecLattice, ExactReencodingIsBitExactAndCheap) {
  const double inf = std::numeric_limits<double>::infinity();
  std::mt19937_64 rng(41);
  std::normal_distribution<double> normal(0, 1);
  for (DType dtype : kLossyDtypes) {
    for (bool relative : {false, true}) {
      LossyCodecOptions options;
      options.quantizer = Quantizer::kUniform;
      options.reclaimable = true;
      options.bound = relative ? ErrorBound{ErrorBound::Kind::kRelative, 1e-3}
                               : ErrorBound{ErrorBound::Kind::kAbsolute, 1e-3};
      auto codec = NewLossyCodec(options);
      std::vector<double> v(kLargeChunk);
      for (double& e : v) e = 0.2 * normal(rng);
      std::vector<Coded> chain;
      for (int version = 0; version < 12; ++version) {
        for (size_t i = 0; i < v.size(); ++i) {
          v[i] += 2e-3 * normal(rng) * (1 + version % 3);  // the range (relative step) moves
          if (i % 211 == static_cast<size_t>(version)) {
            v[i] = std::vector<double>{inf, -inf, std::nan(""), -0.0, 1e-40, 3.0}[i % 6];
          }
        }
        chain.push_back(
            EncodeDecode(*codec, dtype, Pack(dtype, v), version ? &chain.back().decoded : nullptr));
      }
      const std::string where =
          std::string(DTypeName(dtype)) + (relative ? " relative" : " absolute");
      const Coded& target = chain[11];
      ASSERT_EQ(target.chunk.codec_id, CodecId::kLossyQuantized) << where;
      size_t gap_bytes = 0;
      for (int version = 2; version <= 11; ++version) {
        gap_bytes += chain[version].chunk.payload.size();
      }
      const std::vector<uint8_t>* references[] = {&chain[1].decoded, nullptr};
      for (const std::vector<uint8_t>* reference : references) {
        std::optional<std::span<const uint8_t>> ref;
        if (reference) ref = std::span<const uint8_t>(*reference);
        auto rebased =
            EncodeExactOnLattice(dtype, AsBytes(target.chunk.payload), target.decoded, ref);
        ASSERT_TRUE(rebased.ok()) << where << ": " << rebased.status().ToString();
        auto decoder = CodecForDecoding(static_cast<uint16_t>(rebased->codec_id));
        ASSERT_TRUE(decoder.ok());
        std::vector<uint8_t> out(target.decoded.size());
        ASSERT_TRUE((*decoder)->Decode(dtype, AsBytes(rebased->payload), ref, out).ok()) << where;
        EXPECT_EQ(out, target.decoded) << where << (reference ? " delta" : " keyframe");
        if (reference && (dtype == DType::kF32 || dtype == DType::kF64)) {
          EXPECT_EQ(rebased->codec_id, CodecId::kLossyQuantized) << where;
          EXPECT_LT(rebased->payload.size(), gap_bytes / 2) << where << ": one delta over the gap";
        }
      }
    }
  }
}

TEST(LossyCodecLattice, ExactReencodingOfOtherPayloads) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> v(kLargeChunk);
  for (double& e : v) e = 0.2 * normal(rng);
  const auto first = Pack(DType::kF32, v);
  for (double& e : v) e += 2e-3 * normal(rng);
  const auto second = Pack(DType::kF32, v);
  // Additive payloads with element history: still exact (history bits go verbatim or lossless).
  auto additive = Uniform(1e-3);
  Coded a0 = EncodeDecode(*additive, DType::kF32, first, nullptr);
  Coded a1 = EncodeDecode(*additive, DType::kF32, second, &a0.decoded);
  auto rebased =
      EncodeExactOnLattice(DType::kF32, AsBytes(a1.chunk.payload), a1.decoded, std::nullopt);
  ASSERT_TRUE(rebased.ok()) << rebased.status().ToString();
  std::vector<uint8_t> out(a1.decoded.size());
  ASSERT_TRUE((*CodecForDecoding(static_cast<uint16_t>(rebased->codec_id)))
                  ->Decode(DType::kF32, AsBytes(rebased->payload), std::nullopt, out)
                  .ok());
  EXPECT_EQ(out, a1.decoded);
  // Quantizers without a lattice are refused; garbage is DataLoss; the dtype must match.
  Coded c = EncodeDecode(*Lossy(Quantizer::kCosine, 1e-3), DType::kF32, first, nullptr);
  EXPECT_EQ(EncodeExactOnLattice(DType::kF32, AsBytes(c.chunk.payload), c.decoded, std::nullopt)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      EncodeExactOnLattice(DType::kF32, AsBytes(std::string("junk")), a1.decoded, std::nullopt)
          .status()
          .code(),
      StatusCode::kDataLoss);
  EXPECT_FALSE(
      EncodeExactOnLattice(DType::kF64, AsBytes(a1.chunk.payload), a1.decoded, std::nullopt).ok());
}

// Lattice payloads cost what additive payloads with element history cost: both code each
// symbol in the context of its element's history.
TEST(LossyCodecLattice, CostsWhatElementHistoryCosts) {
  std::mt19937_64 rng(43);
  std::normal_distribution<double> normal(0, 1);
  auto additive = Uniform(1e-3);
  auto lattice = Lossy({Quantizer::kUniform, true}, 1e-3);
  std::vector<double> v(1 << 15), momentum(v.size());
  for (double& e : v) e = 0.1 * normal(rng);
  std::vector<uint8_t> ref_a, ref_l;
  size_t bytes_a = 0, bytes_l = 0;
  for (int version = 0; version < 20; ++version) {
    for (size_t i = 0; i < v.size(); ++i) {
      momentum[i] = 0.9 * momentum[i] + 3e-4 * normal(rng);
      v[i] += momentum[i];
    }
    const auto pushed = Pack(DType::kF32, v);
    Coded a = EncodeDecode(*additive, DType::kF32, pushed, version ? &ref_a : nullptr);
    Coded l = EncodeDecode(*lattice, DType::kF32, pushed, version ? &ref_l : nullptr);
    ExpectWithinBound(DType::kF32, pushed, l.decoded, 1e-3, "lattice");
    ref_a = a.decoded;
    ref_l = l.decoded;
    if (version) {
      bytes_a += a.chunk.payload.size();
      bytes_l += l.chunk.payload.size();
    }
  }
  EXPECT_LT(static_cast<double>(bytes_l), 1.01 * static_cast<double>(bytes_a));
  std::cout << "deltas: additive with history " << bytes_a << " bytes, lattice " << bytes_l
            << " bytes\n";
}

// The reason for closing the loop: an encoder that deltas against the previous *input* while
// the decoder applies the deltas to the previous *reconstruction* drifts past the bound; the
// closed loop never does.
// Versions of a rows x cols matrix that drift along a few fresh directions each time (as
// Adam's deltas do: docs/decisions.md, the low-rank shift), plus some noise.
std::vector<std::vector<double>> LowRankDrift(size_t rows, size_t cols, int versions, double drift,
                                              double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> v(rows * cols);
  for (double& e : v) e = 0.05 * normal(rng);
  std::vector<std::vector<double>> chain{v};
  constexpr int kRank = 4;
  for (int t = 1; t < versions; ++t) {
    std::vector<double> u(rows * kRank), w(cols * kRank);
    for (double& e : u) e = normal(rng);
    for (double& e : w) e = normal(rng);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        double s = 0;
        for (int k = 0; k < kRank; ++k) s += u[i * kRank + k] * w[j * kRank + k];
        v[i * cols + j] += drift * s / 2 + noise * normal(rng);
      }
    }
    chain.push_back(v);
  }
  return chain;
}

LossyCodecOptions LatticeOptions(double bound, uint32_t low_rank_columns) {
  LossyCodecOptions options;
  options.quantizer = Quantizer::kUniform;
  options.reclaimable = true;
  options.bound = {ErrorBound::Kind::kAbsolute, bound};
  options.low_rank_columns = low_rank_columns;
  return options;
}

uint8_t PayloadVersion(const Coded& c) {
  return c.chunk.codec_id == CodecId::kLossyQuantized ? static_cast<uint8_t>(c.chunk.payload[0])
                                                      : 0;
}

// The low-rank shift: every version within the bound (decoder == encoder, checked by
// EncodeDecode), chosen on low-rank drift and coding it much smaller than the flat lattice.
TEST(LossyCodecLowRank, ShiftedLatticeKeepsTheBoundAndCodesLowRankDriftSmaller) {
  const auto chain = LowRankDrift(256, 64, 10, 4e-3, 5e-4, 51);
  size_t bytes[2] = {0, 0};
  int low_rank_deltas[2] = {0, 0};
  for (int columns : {0, 1}) {
    auto codec = NewLossyCodec(LatticeOptions(5e-3, columns ? 64 : 0));
    std::vector<uint8_t> previous;
    for (size_t t = 0; t < chain.size(); ++t) {
      const auto pushed = Pack(DType::kF32, chain[t]);
      Coded c = EncodeDecode(*codec, DType::kF32, pushed, t ? &previous : nullptr);
      ExpectWithinBound(DType::kF32, pushed, c.decoded, 5e-3,
                        "version " + std::to_string(t) + (columns ? " low-rank" : " flat"));
      if (t) bytes[columns] += c.chunk.payload.size();
      low_rank_deltas[columns] += PayloadVersion(c) == 4;
      previous = c.decoded;
    }
  }
  EXPECT_EQ(low_rank_deltas[0], 0);
  EXPECT_EQ(low_rank_deltas[1], 9);
  EXPECT_LT(bytes[1], bytes[0] * 0.8) << bytes[1] << " vs flat " << bytes[0];
}

// No low-rank structure: the encoder keeps the plain lattice (or a shift that pays); adversarial
// values keep the guarantee; a length that is not whole rows stays flat.
TEST(LossyCodecLowRank, NoiseAdversarialValuesAndOddShapes) {
  std::mt19937_64 rng(52);
  std::normal_distribution<double> normal(0, 1);
  const size_t rows = 128, cols = 48;
  std::vector<double> v(rows * cols);
  for (double& e : v) e = 0.05 * normal(rng);
  auto flat = NewLossyCodec(LatticeOptions(5e-3, 0));
  auto shifted = NewLossyCodec(LatticeOptions(5e-3, cols));
  const auto v0 = Pack(DType::kF32, v);
  Coded key = EncodeDecode(*shifted, DType::kF32, v0, nullptr);
  for (double& e : v) e += 3e-3 * normal(rng);
  const auto v1 = Pack(DType::kF32, v);
  Coded noise_flat = EncodeDecode(*flat, DType::kF32, v1, &key.decoded);
  Coded noise_shifted = EncodeDecode(*shifted, DType::kF32, v1, &key.decoded);
  EXPECT_LE(noise_shifted.chunk.payload.size(), noise_flat.chunk.payload.size() * 1.02 + 16);

  const double inf = std::numeric_limits<double>::infinity();
  const auto chain = LowRankDrift(rows, cols, 6, 4e-3, 5e-4, 53);
  std::vector<uint8_t> previous;
  for (size_t t = 0; t < chain.size(); ++t) {
    std::vector<double> x = chain[t];
    for (size_t i = t; i < x.size(); i += 97) {
      x[i] = std::vector<double>{inf, -inf, std::nan(""), -0.0, 1e-40, 1e30, 0.0}[(i + t) % 7];
    }
    const auto pushed = Pack(DType::kF32, x);
    Coded c = EncodeDecode(*shifted, DType::kF32, pushed, t ? &previous : nullptr);
    ExpectWithinBound(DType::kF32, pushed, c.decoded, 5e-3, "adversarial " + std::to_string(t));
    previous = c.decoded;
  }
  // 47 columns do not divide the chunk: coded flat.
  auto odd = NewLossyCodec(LatticeOptions(5e-3, cols - 1));
  const auto c0 = Pack(DType::kF32, chain[0]), c1 = Pack(DType::kF32, chain[1]);
  Coded k = EncodeDecode(*odd, DType::kF32, c0, nullptr);
  EXPECT_EQ(PayloadVersion(EncodeDecode(*odd, DType::kF32, c1, &k.decoded)), 3);
  // F64 matrices take the shift too; F16 has no room for history and stays flat.
  auto wide = NewLossyCodec(LatticeOptions(5e-3, cols));
  const auto d0 = Pack(DType::kF64, chain[0]), d1 = Pack(DType::kF64, chain[1]);
  Coded kd = EncodeDecode(*wide, DType::kF64, d0, nullptr);
  Coded dd = EncodeDecode(*wide, DType::kF64, d1, &kd.decoded);
  EXPECT_EQ(PayloadVersion(dd), 4);
  ExpectWithinBound(DType::kF64, d1, dd.decoded, 5e-3, "f64");
  const auto h0 = Pack(DType::kF16, chain[0]), h1 = Pack(DType::kF16, chain[1]);
  Coded kh = EncodeDecode(*wide, DType::kF16, h0, nullptr);
  EXPECT_NE(PayloadVersion(EncodeDecode(*wide, DType::kF16, h1, &kh.decoded)), 4);
}

// Payloads written with this CPU's vector kernels (AVX2 where it has them) decode with the
// portable ones to the encoder's reconstruction, and the other way round: the shift and the
// lattice arithmetic are the same bits on every CPU, adversarial values included.
TEST(LossyCodecLowRank, EveryKernelDecodesEveryOthersPayloads) {
  const size_t rows = 96, cols = 72;
  auto shifted = NewLossyCodec(LatticeOptions(5e-3, cols));
  LossyCodecOptions portable_options = LatticeOptions(5e-3, cols);
  portable_options.kernels = LossyKernels::kPortable;
  auto portable_shifted = NewLossyCodec(portable_options);
  const double inf = std::numeric_limits<double>::infinity();
  for (bool portable_encoder : {false, true}) {
    SCOPED_TRACE(portable_encoder ? "portable encoder" : "the CPU's encoder");
    const auto chain = LowRankDrift(rows, cols, 5, 4e-3, 5e-4, 71);
    std::vector<uint8_t> previous;
    int low_rank_deltas = 0;
    for (size_t t = 0; t < chain.size(); ++t) {
      std::vector<double> x = chain[t];
      // A few adversarial values (a huge one would turn history off; many would be most of
      // what the fit sees).
      for (size_t i = 3 * t; i < x.size(); i += 997) {
        x[i] = std::vector<double>{inf, -inf, std::nan(""), -0.0, 1e-40, 0.0}[(i + t) % 6];
      }
      const auto pushed = Pack(DType::kF32, x);
      std::optional<std::span<const uint8_t>> ref;
      if (t) ref = std::span<const uint8_t>(previous);
      auto encoded =
          (portable_encoder ? portable_shifted : shifted)->Encode(DType::kF32, pushed, ref);
      ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
      low_rank_deltas += encoded->payload[0] == 4;
      std::vector<uint8_t> decoded(pushed.size());
      const Status s = DecoderRunning(!portable_encoder)
                           ->Decode(DType::kF32, AsBytes(encoded->payload), ref, decoded);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(decoded, encoded->reconstruction) << "version " << t;
      ExpectWithinBound(DType::kF32, pushed, decoded, 5e-3, "version " + std::to_string(t));
      previous = decoded;
    }
    EXPECT_GE(low_rank_deltas, 3);
  }
}

// Garbage collection re-encodes a low-rank version exactly (on its fine lattice), against an
// older version or as a keyframe, and the chain continues from the re-encoding.
TEST(LossyCodecLowRank, ExactReencodingOfALowRankVersion) {
  const auto chain = LowRankDrift(256, 64, 7, 4e-3, 5e-4, 54);
  auto codec = NewLossyCodec(LatticeOptions(5e-3, 64));
  std::vector<Coded> coded;
  for (size_t t = 0; t + 1 < chain.size(); ++t) {
    coded.push_back(EncodeDecode(*codec, DType::kF32, Pack(DType::kF32, chain[t]),
                                 t ? &coded.back().decoded : nullptr));
  }
  const Coded& target = coded.back();
  ASSERT_EQ(PayloadVersion(target), 4);
  const std::vector<uint8_t>* references[] = {&coded[1].decoded, nullptr};
  for (const std::vector<uint8_t>* reference : references) {
    std::optional<std::span<const uint8_t>> ref;
    if (reference) ref = std::span<const uint8_t>(*reference);
    auto rebased =
        EncodeExactOnLattice(DType::kF32, AsBytes(target.chunk.payload), target.decoded, ref);
    ASSERT_TRUE(rebased.ok()) << rebased.status().ToString();
    auto decoder = CodecForDecoding(static_cast<uint16_t>(rebased->codec_id));
    ASSERT_TRUE(decoder.ok());
    std::vector<uint8_t> out(target.decoded.size());
    ASSERT_TRUE((*decoder)->Decode(DType::kF32, AsBytes(rebased->payload), ref, out).ok());
    EXPECT_EQ(out, target.decoded) << (reference ? "delta" : "keyframe");
    // Exact re-encodings cost more than a lattice move but far less than the raw chunk.
    EXPECT_LT(rebased->payload.size(), out.size() / 2);
    const auto next = Pack(DType::kF32, chain.back());
    Coded continued = EncodeDecode(*codec, DType::kF32, next, &out);
    ExpectWithinBound(DType::kF32, next, continued.decoded, 5e-3, "after the re-encoding");
  }
}

TEST(LossyCodecLowRank, CorruptPayloadsYieldDataLossNeverCrash) {
  const auto chain = LowRankDrift(128, 64, 2, 4e-3, 5e-4, 55);
  auto codec = NewLossyCodec(LatticeOptions(5e-3, 64));
  const auto v0 = Pack(DType::kF32, chain[0]), v1 = Pack(DType::kF32, chain[1]);
  Coded key = EncodeDecode(*codec, DType::kF32, v0, nullptr);
  Coded delta = EncodeDecode(*codec, DType::kF32, v1, &key.decoded);
  ASSERT_EQ(PayloadVersion(delta), 4);
  auto decoder = CodecForDecoding(static_cast<uint16_t>(CodecId::kLossyQuantized));
  const std::span<const uint8_t> ref(key.decoded);
  std::vector<uint8_t> out(v1.size());
  for (size_t len = 0; len < delta.chunk.payload.size(); len += 5) {
    EXPECT_EQ((*decoder)
                  ->Decode(DType::kF32, AsBytes(delta.chunk.payload.substr(0, len)), ref, out)
                  .code(),
              StatusCode::kDataLoss)
        << "length " << len;
  }
  std::string older = delta.chunk.payload;
  older[0] = 3;  // the low-rank flag under another version
  EXPECT_EQ((*decoder)->Decode(DType::kF32, AsBytes(older), ref, out).code(),
            StatusCode::kDataLoss);
  EXPECT_EQ((*decoder)->Decode(DType::kF32, AsBytes(delta.chunk.payload), std::nullopt, out).code(),
            StatusCode::kDataLoss);
  std::mt19937_64 rng(56);
  for (int trial = 0; trial < 1500; ++trial) {
    std::string bad = delta.chunk.payload;
    // Mostly the header and the shift, where the new fields are.
    const size_t span = trial % 2 ? std::min<size_t>(bad.size(), 600) : bad.size();
    bad[rng() % span] ^= static_cast<char>(1 + rng() % 255);
    const StatusCode code = (*decoder)->Decode(DType::kF32, AsBytes(bad), ref, out).code();
    EXPECT_TRUE(code == StatusCode::kOk || code == StatusCode::kDataLoss) << "trial " << trial;
  }
}

}  // namespace
}  // namespace ckpt
