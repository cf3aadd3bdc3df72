// Codec micro-benchmark: the lossless byte-plane codec on realistic float data (a Gaussian
// weight tensor and its next version after a small update), next to zstd -1 and zstd -3 of the
// same bytes measured in the same run. Reported counters: bytes_per_second (input bytes) and
// ratio (input / output). Also the safetensors header parser on headers of 1,000 to 65,536
// tensors (items_per_second: tensors), next to a plain nlohmann::json parse of the same text.
//
// Run: build-release/bench/codec_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>
#include <zstd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/tensor_codec.h"

namespace {

constexpr size_t kElements = 1 << 20;  // one 4 MiB chunk of F32

struct Data {
  std::vector<uint8_t> previous;
  std::vector<uint8_t> current;
};

const Data& Weights() {
  static const Data data = [] {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> init(0.0f, 0.02f), step(0.0f, 1e-4f);
    std::vector<float> w(kElements);
    for (auto& x : w) x = init(rng);
    Data d;
    auto bytes = [](const std::vector<float>& v) {
      const auto* p = reinterpret_cast<const uint8_t*>(v.data());
      return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
    };
    d.previous = bytes(w);
    for (size_t i = 0; i < w.size(); ++i) {
      if (i % 3) w[i] += step(rng);
    }
    d.current = bytes(w);
    return d;
  }();
  return data;
}

void Report(benchmark::State& state, size_t in, size_t out) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * in));
  state.counters["ratio"] = static_cast<double>(in) / static_cast<double>(out);
}

void BM_LosslessKeyframeEncode(benchmark::State& state) {
  auto codec = ckpt::NewLosslessCodec({static_cast<int>(state.range(0))});
  const auto& d = Weights();
  size_t out = 0;
  for (auto _ : state) {
    auto e = codec->Encode(ckpt::DType::kF32, d.current, std::nullopt);
    out = e->payload.size();
    benchmark::DoNotOptimize(out);
  }
  Report(state, d.current.size(), out);
}

void BM_LosslessDeltaEncode(benchmark::State& state) {
  auto codec = ckpt::NewLosslessCodec({static_cast<int>(state.range(0))});
  const auto& d = Weights();
  size_t out = 0;
  for (auto _ : state) {
    auto e = codec->Encode(ckpt::DType::kF32, d.current, std::span<const uint8_t>(d.previous));
    out = e->payload.size();
    benchmark::DoNotOptimize(out);
  }
  Report(state, d.current.size(), out);
}

void BM_LosslessDeltaDecode(benchmark::State& state) {
  auto codec = ckpt::NewLosslessCodec();
  const auto& d = Weights();
  auto e = codec->Encode(ckpt::DType::kF32, d.current, std::span<const uint8_t>(d.previous));
  std::vector<uint8_t> out(d.current.size());
  auto payload = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(e->payload.data()),
                                          e->payload.size());
  for (auto _ : state) {
    auto s = codec->Decode(ckpt::DType::kF32, payload, std::span<const uint8_t>(d.previous), out);
    benchmark::DoNotOptimize(s);
  }
  Report(state, d.current.size(), e->payload.size());
}

// Replays a 16-link chain (keyframe + 15 deltas, the longest with keyframe_every 16) of the
// drifting weights. Argument 1: the codec's plane-domain chain decoder; 0: link by link.
void BM_LosslessChainDecode(benchmark::State& state) {
  auto codec = ckpt::NewLosslessCodec();
  const auto& d = Weights();
  constexpr int kLinks = 16;
  std::vector<std::string> payloads;
  std::mt19937_64 rng(2);
  std::normal_distribution<float> step(0.0f, 1e-4f);
  std::vector<float> w(kElements);
  std::memcpy(w.data(), d.previous.data(), d.previous.size());
  std::vector<uint8_t> previous = d.previous, current = d.previous;
  payloads.push_back(codec->Encode(ckpt::DType::kF32, current, std::nullopt)->payload);
  for (int i = 1; i < kLinks; ++i) {
    for (size_t j = 0; j < w.size(); ++j) {
      if (j % 3) w[j] += step(rng);
    }
    std::memcpy(current.data(), w.data(), current.size());
    payloads.push_back(
        codec->Encode(ckpt::DType::kF32, current, std::span<const uint8_t>(previous))->payload);
    previous = current;
  }
  auto span = [](const std::string& p) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(p.data()), p.size());
  };
  std::vector<uint8_t> out(current.size()), next(current.size());
  for (auto _ : state) {
    if (state.range(0) == 1) {
      auto decoder = codec->NewChainDecoder(ckpt::DType::kF32, current.size());
      (void)decoder->StartFromKeyframe(span(payloads[0]));
      for (int i = 1; i < kLinks; ++i) (void)decoder->ApplyDelta(span(payloads[i]));
      (void)decoder->Finish(&out);
    } else {
      (void)codec->Decode(ckpt::DType::kF32, span(payloads[0]), std::nullopt, out);
      for (int i = 1; i < kLinks; ++i) {
        (void)codec->Decode(ckpt::DType::kF32, span(payloads[i]), std::span<const uint8_t>(out),
                            next);
        std::swap(out, next);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * current.size() * kLinks));
}

void BM_ZstdBaseline(benchmark::State& state) {
  const int level = static_cast<int>(state.range(0));
  const auto& d = Weights();
  std::vector<char> out(ZSTD_compressBound(d.current.size()));
  size_t n = 0;
  for (auto _ : state) {
    n = ZSTD_compress(out.data(), out.size(), d.current.data(), d.current.size(), level);
    benchmark::DoNotOptimize(n);
  }
  Report(state, d.current.size(), n);
}

void BM_ZstdDecompressBaseline(benchmark::State& state) {
  const auto& d = Weights();
  std::vector<char> z(ZSTD_compressBound(d.current.size()));
  const size_t n = ZSTD_compress(z.data(), z.size(), d.current.data(), d.current.size(), 3);
  std::vector<uint8_t> out(d.current.size());
  for (auto _ : state) {
    auto r = ZSTD_decompress(out.data(), out.size(), z.data(), n);
    benchmark::DoNotOptimize(r);
  }
  Report(state, d.current.size(), n);
}

// The JSON header of a checkpoint of `tensors` scalar F32 tensors (an optimizer's step
// counters: the most tensors per byte).
std::string ManyTensorHeader(int64_t tensors) {
  std::string text = "{";
  for (int64_t i = 0; i < tensors; ++i) {
    if (i) text += ",";
    text += "\"state." + std::to_string(i) + ".step\":{\"dtype\":\"F32\",\"shape\":[],";
    text += "\"data_offsets\":[" + std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  return text + "}";
}

// Argument: tensors in the header. Validates everything a push needs (duplicates, offsets).
void BM_SafetensorsHeaderParse(benchmark::State& state) {
  const std::string text = ManyTensorHeader(state.range(0));
  for (auto _ : state) {
    auto header = ckpt::ParseSafetensorsHeader(text, std::nullopt);
    if (!header.ok()) state.SkipWithError(header.status().ToString().c_str());
    benchmark::DoNotOptimize(header);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Baseline: nlohmann::json's own parse of the same text, nothing checked.
void BM_JsonParseBaseline(benchmark::State& state) {
  const std::string text = ManyTensorHeader(state.range(0));
  for (auto _ : state) {
    auto doc = nlohmann::json::parse(text);
    benchmark::DoNotOptimize(doc);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Argument: zstd level of the lossless codec.
BENCHMARK(BM_LosslessKeyframeEncode)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LosslessDeltaEncode)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LosslessDeltaDecode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LosslessChainDecode)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ZstdBaseline)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ZstdDecompressBaseline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SafetensorsHeaderParse)
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(65536)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_JsonParseBaseline)->Arg(1000)->Arg(10000)->Arg(65536)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
