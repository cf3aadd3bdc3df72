// Writes the fuzzers' seed corpora into <dir>/<harness>/: valid safetensors bodies, payloads of
// every codec, quantizer and float dtype (keyframes and deltas, with awkward values), policy
// documents and HTTP requests for every route. Deterministic: the same files on every run.
//
// Usage: fuzz_make_seeds <corpus dir>   (`make fuzz-seeds` runs it on tests/fuzz/corpus)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/lossy_codec.h"
#include "ckpt/codec/tensor_codec.h"
#include "encoded_push_scenario.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

fs::path root;

void Write(const std::string& harness, const std::string& name, std::string_view bytes) {
  fs::create_directories(root / harness);
  std::ofstream out(root / harness / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The value of `result`; exits naming the failure otherwise.
template <typename T>
T Must(Result<T> result) {
  if (!result.ok()) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", result.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(result).value();
}

std::string_view View(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

// `count` elements of `dtype` near `scale`, with NaN, ±Inf, -0 and a denormal among them.
std::vector<uint8_t> Values(DType dtype, size_t count, double scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, scale);
  std::vector<uint8_t> out(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    double v = normal(rng);
    if (i == 3) v = std::numeric_limits<double>::quiet_NaN();
    if (i == 5) v = std::numeric_limits<double>::infinity();
    if (i == 6) v = -std::numeric_limits<double>::infinity();
    if (i == 7) v = -0.0;
    if (i == 9) v = std::numeric_limits<float>::denorm_min();
    uint8_t* p = out.data() + i * DTypeSize(dtype);
    if (dtype == DType::kF64) {
      std::memcpy(p, &v, 8);
    } else {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      if (dtype == DType::kF32) {
        std::memcpy(p, &f, 4);
      } else if (dtype == DType::kBF16) {
        const auto b = static_cast<uint16_t>(bits >> 16);
        std::memcpy(p, &b, 2);
      } else {  // F16, roughly: enough to be a plausible value
        const auto h =
            static_cast<uint16_t>((bits >> 16 & 0x8000) | (((bits >> 13) & 0x7fff) - (112 << 10)));
        std::memcpy(p, &h, 2);
      }
    }
  }
  return out;
}

// tensor_decode input: codec byte, dtype tag, u16 count, frame byte, reference, payload.
void DecodeSeed(const std::string& name, CodecId codec, DType dtype, size_t count,
                const std::vector<uint8_t>* reference, const std::string& payload) {
  std::string input;
  input.push_back(codec == CodecId::kLossyQuantized ? 1 : 0);
  input.push_back(static_cast<char>(static_cast<uint8_t>(dtype) - 1));
  input.push_back(static_cast<char>(count & 0xff));
  input.push_back(static_cast<char>(count >> 8));
  input.push_back(reference ? 1 : 0);
  if (reference) input += View(*reference);
  input += payload;
  Write("tensor_decode", name, input);
}

// Two versions of a 64 x 64 matrix, the second moved along two directions: a delta the
// encoder codes with the low-rank shift (payload version 4) at bounds around 1e-3.
std::pair<std::vector<double>, std::vector<double>> LowRankDriftVersions() {
  std::vector<double> a(4096), b(4096);
  for (size_t i = 0; i < 64; ++i) {
    for (size_t j = 0; j < 64; ++j) {
      const double x = static_cast<double>(i), y = static_cast<double>(j);
      a[i * 64 + j] = 0.05 * std::sin(0.37 * x + 0.11 * y);
      b[i * 64 + j] = a[i * 64 + j] + 4e-3 * std::sin(x / 5) * std::cos(y / 7) +
                      2e-3 * std::sin(x / 3 + 1) * std::cos(y / 4 - 1);
    }
  }
  return {a, b};
}

void TensorDecodeSeeds() {
  const size_t count = 300;
  for (DType dtype :
       {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kU8}) {
    const std::string dname(DTypeName(dtype));
    const auto v1 = Values(dtype, count, 1.0, 1), v2 = Values(dtype, count, 1.0, 1);
    auto moved = v2;
    for (size_t i = 0; i < moved.size(); i += 13) moved[i] ^= 1;
    auto lossless = NewLosslessCodec();
    auto key = lossless->Encode(dtype, v1, std::nullopt);
    auto delta = lossless->Encode(dtype, moved, std::span<const uint8_t>(v1));
    DecodeSeed("lossless_key_" + dname, CodecId::kLosslessBytePlanes, dtype, count, nullptr,
               key->payload);
    DecodeSeed("lossless_delta_" + dname, CodecId::kLosslessBytePlanes, dtype, count, &v1,
               delta->payload);
    if (!LossyCodecSupports(dtype)) continue;
    const std::pair<const char*, LossyCodecOptions> variants[] = {
        {"uniform", {Quantizer::kUniform, {ErrorBound::Kind::kAbsolute, 1e-2}}},
        {"lattice", {Quantizer::kUniform, {ErrorBound::Kind::kAbsolute, 1e-2}, 0, 0, true}},
        {"exponent", {Quantizer::kExponent, {ErrorBound::Kind::kAbsolute, 1e-2}}},
        {"float", {Quantizer::kFloat, {ErrorBound::Kind::kRelative, 1e-3}, 4, 0}},
        {"cosine", {Quantizer::kCosine, {ErrorBound::Kind::kAbsolute, 1e-2}}},
        {"log", {Quantizer::kLog, {ErrorBound::Kind::kPointwise, 1e-2}}},
        {"auto", {Quantizer::kAuto, {ErrorBound::Kind::kAbsolute, 1e-3}}},
    };
    for (const auto& [qname, options] : variants) {
      auto codec = NewLossyCodec(options);
      auto k = codec->Encode(dtype, v1, std::nullopt);
      if (!k.ok() || k->codec_id != CodecId::kLossyQuantized) continue;
      const std::vector<uint8_t> recon = k->reconstruction_is_input ? v1 : k->reconstruction;
      auto d = codec->Encode(dtype, Values(dtype, count, 1.01, 2), std::span(recon));
      DecodeSeed(std::string("lossy_key_") + qname + "_" + dname, CodecId::kLossyQuantized, dtype,
                 count, nullptr, k->payload);
      if (d.ok() && d->codec_id == CodecId::kLossyQuantized) {
        DecodeSeed(std::string("lossy_delta_") + qname + "_" + dname, CodecId::kLossyQuantized,
                   dtype, count, &recon, d->payload);
      }
    }
  }
  // A low-rank lattice delta (payload version 4) of a matrix drifting along two directions.
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const auto [a, b] = LowRankDriftVersions();
    LossyCodecOptions options{Quantizer::kUniform, {ErrorBound::Kind::kAbsolute, 1e-3}};
    options.reclaimable = true;
    options.low_rank_columns = 64;
    auto codec = NewLossyCodec(options);
    const auto pack = [&](const std::vector<double>& v) {
      std::vector<uint8_t> out(v.size() * DTypeSize(dtype));
      for (size_t i = 0; i < v.size(); ++i) {
        if (dtype == DType::kF32) {
          const float f = static_cast<float>(v[i]);
          std::memcpy(out.data() + 4 * i, &f, 4);
        } else {
          std::memcpy(out.data() + 8 * i, &v[i], 8);
        }
      }
      return out;
    };
    auto k = codec->Encode(dtype, pack(a), std::nullopt);
    if (!k.ok() || k->codec_id != CodecId::kLossyQuantized) continue;
    auto d = codec->Encode(dtype, pack(b), std::span(k->reconstruction));
    if (!d.ok() || d->codec_id != CodecId::kLossyQuantized || d->payload[0] != 4) {
      std::fprintf(stderr, "make_seeds: no low-rank delta for %s\n", DTypeName(dtype).data());
      continue;
    }
    const std::string dname(DTypeName(dtype));
    DecodeSeed("lossy_delta_low_rank_" + dname, CodecId::kLossyQuantized, dtype, 4096,
               &k->reconstruction, d->payload);
  }
  // Lattice payloads with element history need chunks of at least 4096 elements: a keyframe, a
  // delta, and the delta re-encoded exactly against the keyframe (explicit history states).
  const size_t large = 4096;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const std::string dname(DTypeName(dtype));
    auto codec = NewLossyCodec({Quantizer::kUniform,
                                {ErrorBound::Kind::kAbsolute, 1e-2},
                                0,
                                0,
                                /*lattice=*/true});
    auto k = codec->Encode(dtype, Values(dtype, large, 1.0, 3), std::nullopt);
    if (!k.ok() || k->codec_id != CodecId::kLossyQuantized) continue;
    auto d = codec->Encode(dtype, Values(dtype, large, 1.01, 3), std::span(k->reconstruction));
    if (!d.ok() || d->codec_id != CodecId::kLossyQuantized) continue;
    DecodeSeed("lossy_key_lattice_history_" + dname, CodecId::kLossyQuantized, dtype, large,
               nullptr, k->payload);
    DecodeSeed("lossy_delta_lattice_history_" + dname, CodecId::kLossyQuantized, dtype, large,
               &k->reconstruction, d->payload);
    auto exact = EncodeExactOnLattice(
        dtype, std::span(reinterpret_cast<const uint8_t*>(d->payload.data()), d->payload.size()),
        d->reconstruction, std::span<const uint8_t>(k->reconstruction));
    if (exact.ok() && exact->codec_id == CodecId::kLossyQuantized) {
      DecodeSeed("lossy_delta_lattice_explicit_history_" + dname, CodecId::kLossyQuantized, dtype,
                 large, &k->reconstruction, exact->payload);
    }
  }
}

// lossy_roundtrip options byte (see lossy_roundtrip_fuzzer.cc): the dtype in bits 0-1, 0x20
// lattice, 0x40 history, 0x80 policy changes allowed, and the bound kind as bits 2-7 modulo 3
// (0 absolute, 1 relative, 2 pointwise), which bits 2-3 adjust.
enum class Kind : uint8_t { kAbsolute = 0, kRelative = 1, kPointwise = 2 };
constexpr uint8_t kLattice = 0x20, kHistory = 0x40, kPolicyChanges = 0x80;

uint8_t DTypeBits(DType dtype) {
  return dtype == DType::kF32 ? 0 : dtype == DType::kF64 ? 1 : dtype == DType::kF16 ? 2 : 3;
}

uint8_t OptionsByte(DType dtype, Kind kind, uint8_t features) {
  for (uint8_t low = 0; low < 4; ++low) {
    const uint8_t flags = static_cast<uint8_t>(features | low << 2 | DTypeBits(dtype));
    if ((flags >> 2) % 3 == static_cast<uint8_t>(kind)) return flags;
  }
  return 0;  // unreachable: four consecutive values cover every residue
}

// The 5 option bytes: flags, quantizer (+ 5 x float exponent bits), float mantissa bits (for
// pointwise bounds 32 x the drop rule's factor), bound mantissa, bound exponent (absolute
// 2^(e - 150), relative 2^-e, pointwise 2^(-1 - e)).
std::string Options(uint8_t flags, uint8_t quantizer, uint8_t bound_exponent,
                    uint8_t mantissa = 3) {
  return {static_cast<char>(flags), static_cast<char>(quantizer), static_cast<char>(mantissa), 0,
          static_cast<char>(bound_exponent)};
}

// A lossy_roundtrip input: options, count, a raw first version (Values: awkward elements
// included), then drifted, rescaled and unchanged versions with special values written over a
// few elements. With `changes` (three more option strings) each later version switches to the
// next options, as a policy change between pushes does.
std::string RoundtripInput(DType dtype, const std::string& options, size_t count,
                           const std::vector<std::string>& changes = {}) {
  const auto change = [&](size_t i) { return i < changes.size() ? changes[i] : std::string(); };
  const char flag = changes.empty() ? 0 : static_cast<char>(0x80);
  std::string input = options;
  input.push_back(static_cast<char>(count & 0xff));
  input.push_back(static_cast<char>(count >> 8));
  input.push_back(3);  // four versions
  input.push_back(0);  // raw
  input += View(Values(dtype, count, 0.05, 7));
  input.push_back(0);  // no specials
  // Drift by about one bound (seed 0x44332211, scale 2^0), no specials.
  input += static_cast<char>(0x01 | flag) + change(0) + std::string("\x11\x22\x33\x44\x0c\x00", 6);
  // Scale by 2^3, drift by half a bound, then NaN at element 5 and the largest finite at 16.
  input += static_cast<char>(0x02 | flag) + change(1) +
           std::string("\x17\x55\x66\x77\x88\x0b\x02\x05\x00\x00\x10\x00\x06", 13);
  input += static_cast<char>(0x03 | flag) + change(2) + std::string("\x00", 1);  // unchanged
  return input;
}

void LossyRoundtripSeeds() {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    const std::string dname(DTypeName(dtype));
    const bool large = dtype == DType::kF32 || dtype == DType::kF64;
    const size_t history_count = large ? 4096 : 300;
    const auto seed = [&](const std::string& name, Kind kind, uint8_t features, uint8_t quantizer,
                          uint8_t bound_exponent, size_t count, uint8_t mantissa = 3) {
      Write("lossy_roundtrip", name + "_" + dname,
            RoundtripInput(
                dtype,
                Options(OptionsByte(dtype, kind, features), quantizer, bound_exponent, mantissa),
                count));
    };
    seed("lattice_history", Kind::kAbsolute, kLattice | kHistory, 1, 143, history_count);
    seed("lattice", Kind::kAbsolute, kLattice, 1, 143, 300);
    // Quantizer byte 1 + 45 x 2: uniform, 64 matrix columns (low-rank lattice deltas).
    seed("lattice_history_matrix", Kind::kAbsolute, kLattice | kHistory, 1 + 45 * 2, 143,
         history_count);
    seed("additive_history", Kind::kAbsolute, kHistory, 1, 143, history_count);
    seed("auto", Kind::kAbsolute, kLattice | kHistory, 0, 140, 300);
    seed("exponent", Kind::kAbsolute, kHistory, 2, 143, 300);
    seed("float_E4M3", Kind::kAbsolute, kHistory, 3 + 5 * 4, 143, 300);
    seed("cosine", Kind::kAbsolute, kHistory, 4, 143, 300);
    seed("relative", Kind::kRelative, kLattice | kHistory, 0, 10, 300);
    seed("pointwise", Kind::kPointwise, 0, 0, 6, 300, 0);
    // Pointwise 2^-2 with the drop rule at twice the mean magnitude (Adam's exp_avg).
    seed("pointwise_drop_rule", Kind::kPointwise, 0, 0, 1, history_count, 64);
    if (large) {
      // Two raw versions of a 64 x 64 matrix, the second moved along two directions: a delta
      // the encoder codes with the low-rank shift (payload version 4).
      const auto [a, b] = LowRankDriftVersions();
      std::string input = Options(OptionsByte(dtype, Kind::kAbsolute, kLattice | kHistory),
                                  1 + 45 * 2, 140);  // 64 columns, bound 2^-10
      input += std::string{0x00, 0x10, 0x01};        // 4096 elements, two versions
      for (const auto* v : {&a, &b}) {
        input.push_back(0);  // raw
        for (double e : *v) {
          if (dtype == DType::kF32) {
            const float f = static_cast<float>(e);
            input.append(reinterpret_cast<const char*>(&f), 4);
          } else {
            input.append(reinterpret_cast<const char*>(&e), 8);
          }
        }
        input.push_back(0);  // no specials
      }
      Write("lossy_roundtrip", "low_rank_drift_" + dname, input);
    }
    // Policy changes along one chain: lattice with history, then additive cosine, a relative
    // bound on the plain lattice, and a pointwise bound.
    Write("lossy_roundtrip", "policy_changes_" + dname,
          RoundtripInput(
              dtype,
              Options(OptionsByte(dtype, Kind::kAbsolute, kLattice | kHistory | kPolicyChanges), 1,
                      143),
              history_count,
              {Options(OptionsByte(dtype, Kind::kAbsolute, kHistory), 4, 141),
               Options(OptionsByte(dtype, Kind::kRelative, kLattice), 1, 9),
               Options(OptionsByte(dtype, Kind::kPointwise, 0), 0, 6)}));
  }
}

std::string Floats(std::initializer_list<float> values) {
  return {reinterpret_cast<const char*>(std::data(values)), values.size() * sizeof(float)};
}

std::string SampleBody() {
  const std::string w = Floats({0.5f, -1.25f, 3.0f, 0.0f, -0.0f, 1e-40f});
  const std::string b = Floats({0.1f, 0.2f});
  const std::string ids = "\x01\x02\x03\x04";
  return Must(WriteSafetensors({{"layer.weight", DType::kF32, {2, 3}, w},
                                {"layer.bias", DType::kF32, {2}, b},
                                {"ids", DType::kU8, {4}, ids},
                                {"empty", DType::kF16, {0, 4}, ""},
                                {"scalar", DType::kF32, {}, Floats({7.0f})}},
                               {{"format", "pt"}, {"metric.loss", "0.25"}}));
}

void SafetensorsSeeds() {
  const std::string body = SampleBody();
  for (uint8_t piece : {0, 1, 255}) {
    Write("safetensors", "sample_piece" + std::to_string(piece), std::string(1, piece) + body);
  }
  Write("safetensors", "empty_header", std::string(1, 3) + Must(WriteSafetensors({})));
  const std::string bf16("\x80\x3f\x00\x40", 4);
  Write("safetensors", "bf16",
        std::string(1, 0) + Must(WriteSafetensors({{"x", DType::kBF16, {2}, bf16}})));
  std::string hand = R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string prefix(8, '\0');
  const uint64_t n = hand.size();
  std::memcpy(prefix.data(), &n, 8);
  Write("safetensors", "hand_written", std::string(1, 2) + prefix + hand + std::string(8, 'x'));
}

void PolicySeeds() {
  const char* codec_policies[] = {
      R"({"mode":"lossless"})",
      R"({"mode":"lossless","keyframe_every":8,"zstd_level":3})",
      R"({"mode":"lossy","max_abs_error":1e-4})",
      R"({"mode":"lossy","max_rel_error":1e-3,"quantizer":"cosine"})",
      R"({"mode":"lossy","max_abs_error":1e-3,"quantizer":"float","float_format":"E4M3"})",
      R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":["*.bias","norm*"],)"
      R"("reclaimable":false})",
      R"({"mode":"lossy","max_abs_error":1e-3,"overrides":[{"tensors":["exp_avg_sq*"],)"
      R"("max_pointwise_rel_error":0.01}]})",
      R"({"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[],"overrides":[)"
      R"({"tensors":"optim.*.exp_avg","max_pointwise_rel_error":0.25,"zero_below_mean":2},)"
      R"({"tensors":"optim.*.exp_avg_sq","max_pointwise_rel_error":0.1}]})",
      R"({"preset":"full-state","max_abs_error":1e-3,"overrides":[{"tensors":"*.bias",)"
      R"("lossless":true}]})",
  };
  int i = 0;
  for (const char* p : codec_policies) {
    Write("policy_json", "codec_" + std::to_string(i), std::string(1, 0) + p);
    Write("policy_json", "codec_over_lossy_" + std::to_string(i++), std::string(1, 1) + p);
  }
  const char* retention[] = {
      R"({"keep_last":5})",
      R"({"keep_last":3,"keep_every":1000,"keep_within":"7d","max_bytes":1000000000})",
      R"({"keep_best":{"metric":"loss","mode":"min","count":2}})",
      R"({})",
  };
  i = 0;
  for (const char* p : retention) {
    Write("policy_json", "retention_" + std::to_string(i++), std::string(1, 2) + p);
  }
}

void HttpSeeds() {
  const std::string body = SampleBody();
  auto request = [](const std::string& method, const std::string& target, const std::string& token,
                    const std::string& payload) {
    std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
    if (!token.empty()) r += "Authorization: Bearer " + token + "\r\n";
    if (!payload.empty() || method == "PUT" || method == "POST") {
      r += "Content-Length: " + std::to_string(payload.size()) + "\r\n";
    }
    return r + "\r\n" + payload;
  };
  const struct {
    const char* name;
    std::string bytes;
  } seeds[] = {
      {"push",
       request("PUT", "/v1/models/m/versions/40?metric.loss=0.1&tag=new", "write-token", body)},
      {"push_new_model", request("PUT", "/v1/models/mnew/versions/1", "admin-token", body)},
      {"push_chunked",
       "PUT /v1/models/m/versions/50 HTTP/1.1\r\nHost: x\r\nAuthorization: "
       "Bearer write-token\r\nTransfer-Encoding: chunked\r\n\r\n" +
           [&] {
             char size[32];
             std::snprintf(size, sizeof size, "%zx\r\n", body.size());
             return std::string(size) + body + "\r\n0\r\n\r\n";
           }()},
      {"restore_latest", request("GET", "/v1/models/mlossy/versions/latest", "read-token", "")},
      {"restore_tag", request("GET", "/v1/models/m/versions/tag:best", "read-token", "")},
      {"head", request("HEAD", "/v1/models/m/versions/10", "read-token", "")},
      {"detail", request("GET", "/v1/models/mlossy/versions/30?detail=1", "read-token", "")},
      {"list_models", request("GET", "/v1/models", "write-token", "")},
      {"list_versions", request("GET", "/v1/models/m/versions", "read-token", "")},
      {"model", request("GET", "/v1/models/other", "read-token", "")},
      {"policy_put", request("PUT", "/v1/models/m/policy", "write-token",
                             R"({"mode":"lossy","max_abs_error":0.001})")},
      {"retention_put",
       request("PUT", "/v1/models/m/retention", "write-token", R"({"keep_last":2})")},
      {"retention_preview", request("POST", "/v1/models/m/retention:preview", "read-token", "")},
      {"retention_apply",
       request("POST", "/v1/models/m/retention:apply", "write-token", R"({"keep_last":2})")},
      {"tag", request("PUT", "/v1/models/m/versions/30/tags/keep", "write-token", "")},
      {"untag", request("DELETE", "/v1/models/m/versions/20/tags/best", "write-token", "")},
      {"delete_version", request("DELETE", "/v1/models/m/versions/10", "write-token", "")},
      {"admin_gc", request("POST", "/v1/admin/gc", "admin-token", "")},
      {"admin_scrub", request("POST", "/v1/admin/scrub", "admin-token", "")},
      {"metrics", request("GET", "/metrics", "admin-token", "")},
      {"status_page", request("GET", "/?model=m", "read-token", "")},
      {"healthz", request("GET", "/healthz", "", "")},
      {"unauthenticated", request("GET", "/v1/models", "", "")},
  };
  for (const auto& seed : seeds) Write("http_request", seed.name, seed.bytes);
}

// Encoded pushes of version 2 of the scenario's model: the valid frames (after the preamble the
// harness writes), the whole body, and a body of keyframes where the plan has deltas.
void EncodedPushSeeds() {
  std::string dir = (fs::temp_directory_path() / "ckpt-seeds-enc-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) std::exit(1);
  {
    auto store = fuzz::OpenScenarioStore(dir);
    const std::vector<uint8_t> reference = fuzz::SeedScenarioModel(*store, "m");
    const std::string checkpoint = fuzz::ScenarioCheckpoint(2);
    const std::string body = fuzz::EncodeForStore(*store, "m", 2, checkpoint, reference, nullptr);
    const uint64_t preamble =
        32 + Must(CheckpointView::Parse(fuzz::AsSpan(checkpoint))).raw_header().size();
    Write("encoded_push", "frames", std::string(1, '\0') + body.substr(preamble));
    Write("encoded_push", "whole", std::string(1, '\1') + body);
    Write("encoded_push", "end_only", std::string(1, '\0') + body.substr(body.size() - 129));
    // Shard 0 of 2 of version 2, coded by its rank against its part of version 1.
    const std::string shard_0 = fuzz::ScenarioShardOf(fuzz::AsSpan(checkpoint), 0);
    const std::string shard_body =
        fuzz::EncodeShardForStore(*store, "m", 2, 0, shard_0, fuzz::ScenarioShardOf(reference, 0));
    const uint64_t shard_preamble =
        32 + Must(CheckpointView::Parse(fuzz::AsSpan(shard_0))).raw_header().size();
    Write("encoded_push", "shard_frames", std::string(1, '\2') + shard_body.substr(shard_preamble));
    Write("encoded_push", "shard_whole", std::string(1, '\3') + shard_body);
  }
  fs::remove_all(dir);
}

// Encoded pulls of the scenario's model, each after the harness's flags (and the held
// reconstruction, for a sync): version 2 whole from its keyframes, since version 1, and a part
// (a box of the matrix, and the bias alone).
void EncodedPullSeeds() {
  std::string dir = (fs::temp_directory_path() / "ckpt-seeds-pull-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) std::exit(1);
  {
    auto store = fuzz::OpenScenarioStore(dir);
    const std::vector<uint8_t> v1 = fuzz::SeedScenarioModel(*store, "m");
    std::vector<uint8_t> v2;
    const std::string body =
        fuzz::EncodeForStore(*store, "m", 2, fuzz::ScenarioCheckpoint(2), v1, &v2);
    PushOptions options;
    options.body_format = PushBodyFormat::kEncoded;
    auto push = Must(store->BeginPush("m", 2, body.size(), options));
    if (!push->Write(fuzz::AsSpan(body)).ok() || !push->Commit().ok()) std::exit(1);
    auto pull = [&](std::optional<uint64_t> since, const RestoreSelection& part) {
      auto stream = Must(store->OpenEncodedRestore("m", 2, since, part));
      std::string out;
      for (;;) {
        auto piece = Must(stream->Next());
        if (piece.empty()) return out;
        out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
      }
    };
    Write("encoded_pull", "whole", std::string(1, '\x02') + pull(std::nullopt, {}));
    std::string held(4, '\0');
    const uint32_t length = static_cast<uint32_t>(v1.size());
    std::memcpy(held.data(), &length, 4);
    Write("encoded_pull", "since",
          std::string(1, '\x01') + held + std::string(View(v1)) + pull(1, {}));
    RestoreSelection box;
    box.box = std::make_pair(std::string("layer.weight"), TensorBox{{20, 3}, {30, 5}});
    Write("encoded_pull", "box", std::string(1, '\x06') + pull(std::nullopt, box));
    RestoreSelection bias;
    bias.tensors = {"*.bias"};
    Write("encoded_pull", "tensors", std::string(1, '\x00') + pull(std::nullopt, bias));

    // Model "t": a [20, 32] matrix cut by columns over 2 shards, stored in tiles (formats 3, 4).
    std::string held_t;
    for (uint64_t version = 1; version <= 2; ++version) {
      std::vector<float> w(20 * 32);
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] = 0.01f * static_cast<float>((i * 31) % 97) + 0.001f * static_cast<float>(version);
      }
      for (uint32_t shard = 0; shard < 2; ++shard) {
        std::string part;
        for (size_t row = 0; row < 20; ++row) {
          part.append(reinterpret_cast<const char*>(&w[row * 32 + shard * 16]), 16 * 4);
        }
        const std::string slices = R"({"w": {"global_shape": [20, 32], "offsets": [0, )" +
                                   std::to_string(16 * shard) + "]}}";
        const std::string shard_body =
            *WriteSafetensors({{"w", DType::kF32, {20, 16}, part}}, {{"ckptd.slices", slices}});
        auto session = Must(store->BeginShard("t", version, shard, 2, shard_body.size(), {}));
        if (!session->Write(fuzz::AsSpan(shard_body)).ok() || !session->Finish().ok()) {
          std::exit(1);
        }
      }
      if (version == 1) {
        auto stream = Must(store->OpenRestore("t", 1));
        for (auto piece = Must(stream->Next()); !piece.empty(); piece = Must(stream->Next())) {
          held_t.append(reinterpret_cast<const char*>(piece.data()), piece.size());
        }
      }
    }
    auto pull_t = [&](std::optional<uint64_t> since, const RestoreSelection& part) {
      auto stream = Must(store->OpenEncodedRestore("t", 2, since, part));
      std::string out;
      for (auto piece = Must(stream->Next()); !piece.empty(); piece = Must(stream->Next())) {
        out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
      }
      return out;
    };
    Write("encoded_pull", "tiles_whole", std::string(1, '\x02') + pull_t(std::nullopt, {}));
    const uint32_t held_length = static_cast<uint32_t>(held_t.size());
    std::memcpy(held.data(), &held_length, 4);
    Write("encoded_pull", "tiles_since", std::string(1, '\x01') + held + held_t + pull_t(1, {}));
    RestoreSelection tile;
    tile.box = std::make_pair(std::string("w"), TensorBox{{2, 10}, {15, 12}});
    Write("encoded_pull", "tiles_box", std::string(1, '\x06') + pull_t(std::nullopt, tile));
  }
  fs::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds <corpus dir>\n");
    return 2;
  }
  root = argv[1];
  TensorDecodeSeeds();
  LossyRoundtripSeeds();
  SafetensorsSeeds();
  PolicySeeds();
  HttpSeeds();
  EncodedPushSeeds();
  EncodedPullSeeds();
  return 0;
}
