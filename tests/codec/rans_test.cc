// The rANS coder (codec/src/rans.h) on its own: histograms count what Add counts, and streams
// of skewed, uniform and single-symbol data round-trip with one and with four states, with and
// without branching refills.
#include "entropy/rans.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ckpt::rans {
namespace {

TEST(RansHistogram, AddAllCountsWhatAddCounts) {
  std::mt19937 rng(7);
  // Below and above the length from which AddAll counts in sets, with ragged ends.
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1001}, size_t{4095}, size_t{4096},
                   size_t{4099}, size_t{20002}}) {
    for (uint32_t context_count : {1u, 8u, kMaxContexts}) {
      std::vector<uint8_t> symbols(n), contexts(n);
      for (size_t i = 0; i < n; ++i) {
        // Runs of one symbol in one context, as deltas have, and the largest symbol.
        symbols[i] = rng() % 4 == 0 ? static_cast<uint8_t>(rng() % kMaxSymbols) : 0;
        contexts[i] = rng() % 4 == 0 ? static_cast<uint8_t>(rng() % context_count) : 0;
      }
      if (n > 0) symbols[n - 1] = kMaxSymbols - 1;
      Histogram one_by_one(context_count), all(context_count), all_order0(context_count);
      for (size_t i = 0; i < n; ++i) one_by_one.Add(contexts[i], symbols[i]);
      all.Add(0, 5);  // AddAll adds to what is there
      one_by_one.Add(0, 5);
      all.AddAll(symbols.data(), contexts.data(), n);
      EXPECT_EQ(all.counts, one_by_one.counts) << n << " symbols, " << context_count;
      Histogram order0(context_count);
      for (size_t i = 0; i < n; ++i) order0.Add(0, symbols[i]);
      all_order0.AddAll(symbols.data(), nullptr, n);
      EXPECT_EQ(all_order0.counts, order0.counts) << n << " symbols";
    }
  }
}

// Encodes `symbols` (contexts: symbol i's context, or none) into a stream.
std::string Encode(const std::vector<uint8_t>& symbols, const std::vector<uint8_t>& contexts,
                   uint32_t context_count, int ways) {
  Histogram histogram(context_count);
  const uint8_t* context_of = contexts.empty() ? nullptr : contexts.data();
  histogram.AddAll(symbols.data(), context_of, symbols.size());
  std::string stream;
  const std::vector<EncodeTable> tables = WriteTables(histogram, &stream);
  Encoder encoder(symbols.size(), ways);
  encoder.PutAll(symbols.data(), context_of, tables.data(), symbols.size());
  encoder.Finish(&stream);
  return stream;
}

// Decodes n symbols of `stream`; with `dense` (four ways), four at a time with GetDense while
// bytes remain for them, as the lossy decoder does with keyframes. *checked: Check()'s verdict.
std::vector<uint8_t> Decode(const std::string& stream, size_t n,
                            const std::vector<uint8_t>& contexts, uint32_t context_count, int ways,
                            bool dense, bool* checked) {
  const uint8_t* in = reinterpret_cast<const uint8_t*>(stream.data());
  const uint8_t* end = in + stream.size();
  DecodeTables decode_tables;
  EXPECT_TRUE(decode_tables.Read(in, end, context_count).ok());
  Decoder decoder;
  EXPECT_TRUE(decoder.Init(in, end, ways).ok());
  auto slots = [&](size_t i) { return decode_tables.context(contexts.empty() ? 0 : contexts[i]); };
  std::vector<uint8_t> out(n);
  size_t i = 0;
  for (; dense && i + 3 < n && decoder.HasBytes(8); i += 4) {
    out[i] = decoder.GetDense<0>(slots(i));
    out[i + 1] = decoder.GetDense<1>(slots(i + 1));
    out[i + 2] = decoder.GetDense<2>(slots(i + 2));
    out[i + 3] = decoder.GetDense<3>(slots(i + 3));
  }
  for (; i < n; ++i) {
    switch (ways == 1 ? 0 : i % 4) {
      case 0:
        out[i] = decoder.Get<0>(slots(i));
        break;
      case 1:
        out[i] = decoder.Get<1>(slots(i));
        break;
      case 2:
        out[i] = decoder.Get<2>(slots(i));
        break;
      default:
        out[i] = decoder.Get<3>(slots(i));
        break;
    }
  }
  *checked = decoder.Check().ok();
  return out;
}

// Encodes `symbols` and decodes them again, with GetDense as well where there are four ways.
std::vector<uint8_t> RoundTrip(const std::vector<uint8_t>& symbols,
                               const std::vector<uint8_t>& contexts, uint32_t context_count,
                               int ways) {
  const std::string stream = Encode(symbols, contexts, context_count, ways);
  bool checked = false;
  std::vector<uint8_t> out =
      Decode(stream, symbols.size(), contexts, context_count, ways, false, &checked);
  EXPECT_TRUE(checked);
  if (ways == kMaxWays) {
    EXPECT_EQ(Decode(stream, symbols.size(), contexts, context_count, ways, true, &checked), out);
    EXPECT_TRUE(checked);
  }
  return out;
}

TEST(RansCoder, SkewedUniformAndSingleSymbolStreamsRoundTrip) {
  std::mt19937 rng(11);
  for (int ways : {1, kMaxWays}) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{4096}, size_t{100003}}) {
      std::vector<uint8_t> skewed(n), uniform(n), single(n, 3), contexts(n);
      for (size_t i = 0; i < n; ++i) {
        // Mostly 0, and symbols of frequency 1 (which renormalize by two bytes).
        skewed[i] = rng() % 1000 == 0 ? static_cast<uint8_t>(1 + rng() % 100) : 0;
        uniform[i] = static_cast<uint8_t>(rng() % kMaxSymbols);
        contexts[i] = static_cast<uint8_t>(rng() % 8);
      }
      EXPECT_EQ(RoundTrip(skewed, {}, 1, ways), skewed) << n << " skewed, ways " << ways;
      EXPECT_EQ(RoundTrip(skewed, contexts, 8, ways), skewed) << n << " in contexts";
      EXPECT_EQ(RoundTrip(uniform, {}, 1, ways), uniform) << n << " uniform";
      EXPECT_EQ(RoundTrip(single, {}, 1, ways), single) << n << " one symbol";
    }
  }
}

// A damaged stream decodes to the same symbols and the same verdict whether its refills branch
// (Get) or not (GetDense): they take the same bytes.
TEST(RansCoder, ADamagedStreamDecodesAlikeWithAndWithoutBranchingRefills) {
  std::mt19937 rng(13);
  const size_t n = 20000;
  std::vector<uint8_t> symbols(n);
  for (auto& s : symbols) s = static_cast<uint8_t>(rng() % 16);
  const std::string stream = Encode(symbols, {}, 1, kMaxWays);
  for (int trial = 0; trial < 50; ++trial) {
    std::string damaged = stream;
    damaged[damaged.size() / 2 + rng() % (damaged.size() / 2)] ^=
        static_cast<char>(1 + rng() % 255);
    bool branching_ok = false, dense_ok = false;
    const auto branching = Decode(damaged, n, {}, 1, kMaxWays, false, &branching_ok);
    const auto dense = Decode(damaged, n, {}, 1, kMaxWays, true, &dense_ok);
    EXPECT_EQ(dense, branching) << trial;
    EXPECT_EQ(dense_ok, branching_ok) << trial;
  }
}

}  // namespace
}  // namespace ckpt::rans
