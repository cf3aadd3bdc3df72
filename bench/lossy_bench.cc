// Lossy codec benchmark on a real checkpoint sequence, in process (no daemon, no RocksDB).
//
// Reads safetensors files in name order, codes every tensor with a ckptd codec policy exactly as
// a push would (closed loop: each delta against the previous reconstruction, keyframes by the
// policy's rules, 4 MiB chunks), decodes every payload again and checks the bound. Prints per
// version and in total: raw bytes, payload bytes, ratio, bits/element, entropy of the coded
// symbols, encode and decode MB/s (per core, median over versions), and the same-run baseline
// zstd -3 of each file. Optionally writes the restored checkpoints for evaluation.
//
// Usage: lossy_bench POLICY_JSON DIR [--restored OUT_DIR] [--quiet] [--retention-rules]
//                    [--matrices] [--repeat K] [--tensors GLOB]
//   --retention-rules codes as the daemon does for a model with retention rules (lattice chains
//   without element history).
//   --tensors GLOB codes only the tensors whose names match (fnmatch), e.g. 'optim.*': the
//   figures are theirs alone (raw bytes, ratio and speeds; the zstd baseline stays whole files).
//   --matrices gives the codec every 2-D tensor's column count (LossyCodecOptions::
//   low_rank_columns): lattice deltas may then take a low-rank shift (payload version 4).
//   --repeat K codes and decodes every chunk K times and counts the fastest of each (default 1):
//   steadier speed figures on a shared machine, with caches and the allocator warm.
//   --reverse also prices the chains backwards, as the store's rearrangement would store them:
//   each chain's newest version as exact keyframes (EncodeExactOnLattice), every older version
//   as an exact delta against the next one (lossless tensors: their forward payloads, XOR
//   deltas being symmetric; lossy payloads without a lattice: losslessly).
//   e.g. lossy_bench '{"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[]}' ckpts/charlm
#include <fnmatch.h>
#include <time.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/storage/codec_policy.h"
#include "ckpt/codec/tensor_codec.h"

namespace {

// CPU time of this thread: throughput per core, unaffected by time the shared machine gives to
// other work (wall-clock figures on this VM vary by +-20% between runs).
struct Clock {
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Clock, duration>;
  static time_point now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec));
  }
};
constexpr uint64_t kChunkBytes = 4 << 20;

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// State of one tensor's chain: the reconstruction of each chunk, and chain bookkeeping.
struct Chain {
  std::vector<std::vector<uint8_t>> reconstruction;
  uint32_t length = 0;
  uint64_t keyframe_bytes = 0;
  uint64_t delta_bytes = 0;
  // --reverse: the newest stored payload of each chunk, and whether the tensor is lossy.
  std::vector<std::vector<uint8_t>> payload;
  bool lossy = false;
  ckpt::DType dtype = ckpt::DType::kF32;
};

// An exact re-encoding of `target` (the reconstruction `payload` decodes to) against
// `reference`, or losslessly when the payload has no lattice; its size.
uint64_t ExactBytes(const ckpt::TensorCodec& lossless, ckpt::DType dtype,
                    const std::vector<uint8_t>& payload, const std::vector<uint8_t>& target,
                    std::optional<std::span<const uint8_t>> reference) {
  auto exact = ckpt::EncodeExactOnLattice(dtype, payload, target, reference);
  if (!exact.ok()) exact = lossless.Encode(dtype, target, reference);
  return exact.ok() ? exact->payload.size() : 0;
}

// --reverse: the exact keyframes of a chain's newest version.
uint64_t NewestKeyframeBytes(const ckpt::TensorCodec& lossless, const Chain& chain) {
  uint64_t bytes = 0;
  for (size_t c = 0; c < chain.reconstruction.size(); ++c) {
    if (chain.lossy) {
      bytes += ExactBytes(lossless, chain.dtype, chain.payload[c], chain.reconstruction[c],
                          std::nullopt);
    } else {
      auto keyframe = lossless.Encode(chain.dtype, chain.reconstruction[c], std::nullopt);
      bytes += keyframe.ok() ? keyframe->payload.size() : 0;
    }
  }
  return bytes;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "lossy_bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: lossy_bench POLICY_JSON DIR [--restored OUT_DIR] [--quiet] "
                 "[--retention-rules] [--matrices] [--repeat K] [--reverse]\n");
    return 2;
  }
  auto policy = ckpt::CodecPolicy::FromJson(argv[1], ckpt::CodecPolicy{});
  if (!policy.ok()) return Fail(policy.status().ToString());
  std::string restored_dir;
  bool quiet = false;
  bool retention_rules = false;
  bool matrices = false;
  int repeat = 1;
  bool reverse = false;
  uint64_t reverse_deltas = 0, reverse_keyframes = 0;
  std::string only;  // --tensors: a glob; other tensors are left out of every figure
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--restored" && i + 1 < argc) {
      restored_dir = argv[++i];
    } else if (std::string(argv[i]) == "--quiet") {
      quiet = true;
    } else if (std::string(argv[i]) == "--retention-rules") {
      retention_rules = true;
    } else if (std::string(argv[i]) == "--reverse") {
      reverse = true;
    } else if (std::string(argv[i]) == "--matrices") {
      matrices = true;
    } else if (std::string(argv[i]) == "--tensors" && i + 1 < argc) {
      only = argv[++i];
    } else if (std::string(argv[i]) == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    }
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[2])) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return Fail("no .safetensors files in " + std::string(argv[2]));
  if (!restored_dir.empty()) std::filesystem::create_directories(restored_dir);

  const auto lossless = ckpt::NewLosslessCodec();
  std::map<std::string, Chain> chains;
  uint64_t total_raw = 0, total_stored = 0, total_zstd = 0, total_elements_lossy = 0;
  double total_entropy_bits = 0, lossy_payload_bits = 0, worst_ratio_to_bound = 0;
  std::vector<double> encode_mbps, decode_mbps, zstd_mbps;
  const uint32_t keyframe_every = policy->EffectiveKeyframeEvery();
  ZSTD_CCtx* zcctx = ZSTD_createCCtx();

  if (!quiet) {
    std::printf("%-28s %10s %10s %8s %9s %9s %9s %9s\n", "version", "raw", "stored", "ratio",
                "bits/el", "H bits/el", "enc MB/s", "dec MB/s");
  }
  for (const auto& path : files) {
    const std::string body = ReadFile(path);
    uint64_t n = 0;
    std::memcpy(&n, body.data(), 8);
    auto header = ckpt::ParseSafetensorsHeader(std::string_view(body).substr(8, n), body.size());
    if (!header.ok()) return Fail(path.string() + ": " + header.status().ToString());
    std::string restored = body;
    const char* data = body.data() + 8 + n;
    char* out = restored.data() + 8 + n;
    uint64_t stored = 0, elements_lossy = 0, coded_raw = 0;
    double entropy_bits = 0, lossy_bits = 0;
    Clock::duration encode_time{}, decode_time{};

    for (const auto& t : header->tensors) {
      if (!only.empty() && fnmatch(only.c_str(), t.name.c_str(), 0) != 0) continue;
      ckpt::TensorCoding coding = policy->ForTensor(t.name, t.dtype, t.shape);
      coded_raw += t.byte_size();
      if (retention_rules && coding.lossy && coding.lossy_options.reclaimable) {
        coding.lossy_options.history = false;
      }
      if (matrices && coding.lossy && t.shape.size() == 2) {
        coding.lossy_options.low_rank_columns = static_cast<uint32_t>(t.shape[1]);
      }
      std::unique_ptr<ckpt::TensorCodec> lossy_codec;
      if (coding.lossy) lossy_codec = ckpt::NewLossyCodec(coding.lossy_options);
      const ckpt::TensorCodec& codec = coding.lossy ? *lossy_codec : *lossless;
      const uint64_t element = ckpt::DTypeSize(t.dtype);
      const uint64_t chunk_bytes = std::max(element, kChunkBytes / element * element);
      const uint64_t chunks = (t.byte_size() + chunk_bytes - 1) / chunk_bytes;
      Chain& chain = chains[t.name];
      const bool delta = !coding.standalone && chain.reconstruction.size() == chunks &&
                         chunks > 0 && chain.length + 1 < keyframe_every &&
                         !(coding.lossy &&
                           policy->KeyframeBudgetExceeded(chain.keyframe_bytes, chain.delta_bytes));
      if (!delta) {
        // A chain ends: backwards, its newest version is the one stored whole.
        if (reverse && !chain.reconstruction.empty()) {
          reverse_keyframes += NewestKeyframeBytes(*lossless, chain);
        }
        chain = Chain{};
        chain.reconstruction.resize(chunks);
        chain.payload.resize(chunks);
      }
      chain.lossy = coding.lossy;
      chain.dtype = t.dtype;
      uint64_t tensor_stored = 0;
      for (uint64_t c = 0; c < chunks; ++c) {
        const uint64_t begin = t.begin + c * chunk_bytes;
        const uint64_t length = std::min(chunk_bytes, t.end - begin);
        std::span<const uint8_t> current(reinterpret_cast<const uint8_t*>(data + begin), length);
        std::optional<std::span<const uint8_t>> reference;
        if (delta) reference = std::span<const uint8_t>(chain.reconstruction[c]);
        // The fastest of `repeat` runs of each (coding is deterministic: every run gives the
        // same bytes), which leaves out the times the shared machine was busy elsewhere.
        auto t0 = Clock::now();
        auto encoded = codec.Encode(t.dtype, current, reference);
        Clock::duration fastest_encode = Clock::now() - t0;
        for (int run = 1; run < repeat && encoded.ok(); ++run) {
          t0 = Clock::now();
          encoded = codec.Encode(t.dtype, current, reference);
          fastest_encode = std::min(fastest_encode, Clock::now() - t0);
        }
        if (!encoded.ok()) return Fail(t.name + ": " + encoded.status().ToString());
        std::vector<uint8_t> decoded(length);
        auto payload = std::span<const uint8_t>(
            reinterpret_cast<const uint8_t*>(encoded->payload.data()), encoded->payload.size());
        auto decoder = ckpt::CodecForDecoding(static_cast<uint16_t>(encoded->codec_id));
        if (!decoder.ok()) return Fail(decoder.status().ToString());
        Clock::duration fastest_decode = Clock::duration::max();
        ckpt::Status s;
        for (int run = 0; run < repeat && s.ok(); ++run) {
          const auto t2 = Clock::now();
          s = (*decoder)->Decode(t.dtype, payload, reference, decoded);
          fastest_decode = std::min(fastest_decode, Clock::now() - t2);
        }
        if (!s.ok()) return Fail(t.name + ": " + s.ToString());
        encode_time += fastest_encode;
        decode_time += fastest_decode;
        const auto& expected = encoded->reconstruction_is_input
                                   ? std::vector<uint8_t>(current.begin(), current.end())
                                   : encoded->reconstruction;
        if (decoded != expected) return Fail(t.name + ": decoder differs from encoder");
        std::memcpy(out + begin, decoded.data(), length);
        if (reverse && delta) {
          // The version before, exactly, against this one.
          reverse_deltas += coding.lossy ? ExactBytes(*lossless, t.dtype, chain.payload[c],
                                                      chain.reconstruction[c], decoded)
                                         : encoded->payload.size();
        }
        if (reverse) chain.payload[c].assign(payload.begin(), payload.end());
        chain.reconstruction[c] = std::move(decoded);
        tensor_stored += encoded->payload.size();
        if (coding.lossy) {
          entropy_bits += encoded->info.model_entropy_bits;
          lossy_bits += 8.0 * encoded->payload.size();
          elements_lossy += encoded->info.elements;
          // Worst error relative to the bound, measured on the restored bytes.
          const double bound = encoded->info.bound;
          for (uint64_t off = 0; off < length; off += element) {
            double x = 0, r = 0;
            if (t.dtype == ckpt::DType::kF32) {
              float a, b;
              std::memcpy(&a, current.data() + off, 4);
              std::memcpy(&b, chain.reconstruction[c].data() + off, 4);
              x = a;
              r = b;
            } else {
              continue;
            }
            if (!std::isfinite(x)) continue;
            const double err = std::abs(x - r);
            if (err > bound) return Fail(t.name + ": bound violated");
            if (bound > 0) worst_ratio_to_bound = std::max(worst_ratio_to_bound, err / bound);
          }
        }
      }
      if (delta) {
        ++chain.length;
        chain.delta_bytes += tensor_stored;
      } else {
        chain.keyframe_bytes = tensor_stored;
      }
      stored += tensor_stored;
    }
    // Baseline in the same run: zstd -3 of the whole file.
    std::vector<char> zbuf(ZSTD_compressBound(body.size()));
    const auto z0 = Clock::now();
    const size_t zsize =
        ZSTD_compressCCtx(zcctx, zbuf.data(), zbuf.size(), body.data(), body.size(), 3);
    const auto z1 = Clock::now();
    if (ZSTD_isError(zsize)) return Fail("zstd failed");
    total_zstd += zsize;
    zstd_mbps.push_back(body.size() / 1e6 / Seconds(z1 - z0));

    // With --tensors the figures are the coded tensors' alone; else the whole file's, header
    // (kept verbatim) included.
    const uint64_t raw = only.empty() ? body.size() : coded_raw;
    if (only.empty()) stored += 8 + n;
    total_raw += raw;
    total_stored += stored;
    total_elements_lossy += elements_lossy;
    total_entropy_bits += entropy_bits;
    lossy_payload_bits += lossy_bits;
    encode_mbps.push_back(raw / 1e6 / Seconds(encode_time));
    decode_mbps.push_back(raw / 1e6 / Seconds(decode_time));
    if (!quiet) {
      std::printf("%-28s %10llu %10llu %8.2f %9.3f %9.3f %9.0f %9.0f\n",
                  path.filename().string().c_str(), static_cast<unsigned long long>(raw),
                  static_cast<unsigned long long>(stored), raw / double(stored),
                  elements_lossy ? lossy_bits / elements_lossy : 0.0,
                  elements_lossy ? entropy_bits / elements_lossy : 0.0, encode_mbps.back(),
                  decode_mbps.back());
    }
    if (!restored_dir.empty()) {
      std::ofstream f(std::filesystem::path(restored_dir) / path.filename(), std::ios::binary);
      f.write(restored.data(), static_cast<std::streamsize>(restored.size()));
    }
  }
  ZSTD_freeCCtx(zcctx);
  if (reverse) {
    for (const auto& [name, chain] : chains)
      reverse_keyframes += NewestKeyframeBytes(*lossless, chain);
    uint64_t headers = 0;
    for (const auto& path : files) {
      const std::string body = ReadFile(path);
      uint64_t n = 0;
      std::memcpy(&n, body.data(), 8);
      headers += 8 + n;
    }
    const uint64_t total = reverse_keyframes + reverse_deltas + headers;
    std::printf(
        "reverse chains: stored %llu  ratio %.2fx (newest versions' exact keyframes %llu, "
        "exact reverse deltas %llu)\n",
        static_cast<unsigned long long>(total), total_raw / double(total),
        static_cast<unsigned long long>(reverse_keyframes),
        static_cast<unsigned long long>(reverse_deltas));
  }
  std::printf(
      "policy %s\nfiles %zu  raw %llu  stored %llu  ratio %.2fx  | zstd -3 of the files: %llu "
      "(%.3fx, %.0f MB/s)\n",
      argv[1], files.size(), static_cast<unsigned long long>(total_raw),
      static_cast<unsigned long long>(total_stored), total_raw / double(total_stored),
      static_cast<unsigned long long>(total_zstd), total_raw / double(total_zstd),
      Median(zstd_mbps));
  std::printf(
      "quantized elements: %.3f bits/element coded, %.3f bits/element entropy (%.1f%% over); "
      "worst error %.3f of the bound\n",
      total_elements_lossy ? lossy_payload_bits / total_elements_lossy : 0.0,
      total_elements_lossy ? total_entropy_bits / total_elements_lossy : 0.0,
      total_entropy_bits > 0 ? 100.0 * (lossy_payload_bits / total_entropy_bits - 1) : 0.0,
      worst_ratio_to_bound);
  std::printf("encode %.0f MB/s, decode %.0f MB/s (median per version, one core)\n",
              Median(encode_mbps), Median(decode_mbps));
  return 0;
}
