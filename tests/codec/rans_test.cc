// The rANS coder (codec/src/rans.h) on its own: histograms count what Add counts, and streams
// of skewed, uniform and single-symbol data round-trip with one and with four states.
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

// Encodes `symbols` (contexts: symbol i's context, or none) and decodes them again.
std::vector<uint8_t> RoundTrip(const std::vector<uint8_t>& symbols,
                               const std::vector<uint8_t>& contexts, uint32_t context_count,
                               int ways) {
  Histogram histogram(context_count);
  const uint8_t* context_of = contexts.empty() ? nullptr : contexts.data();
  histogram.AddAll(symbols.data(), context_of, symbols.size());
  std::string stream;
  const std::vector<EncodeTable> tables = WriteTables(histogram, &stream);
  Encoder encoder(symbols.size(), ways);
  encoder.PutAll(symbols.data(), context_of, tables.data(), symbols.size());
  encoder.Finish(&stream);

  const uint8_t* in = reinterpret_cast<const uint8_t*>(stream.data());
  const uint8_t* end = in + stream.size();
  DecodeTables decode_tables;
  EXPECT_TRUE(decode_tables.Read(in, end, context_count).ok());
  Decoder decoder;
  EXPECT_TRUE(decoder.Init(in, end, ways).ok());
  std::vector<uint8_t> out(symbols.size());
  for (size_t i = 0; i < symbols.size(); ++i) {
    const uint32_t* slots = decode_tables.context(contexts.empty() ? 0 : contexts[i]);
    switch (ways == 1 ? 0 : i % 4) {
      case 0:
        out[i] = decoder.Get<0>(slots);
        break;
      case 1:
        out[i] = decoder.Get<1>(slots);
        break;
      case 2:
        out[i] = decoder.Get<2>(slots);
        break;
      default:
        out[i] = decoder.Get<3>(slots);
        break;
    }
  }
  EXPECT_TRUE(decoder.Check().ok());
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

}  // namespace
}  // namespace ckpt::rans
