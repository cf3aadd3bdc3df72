// Helpers shared by the ckptd test suites: temporary directories and synthetic checkpoints.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/hashing.h"
#include "ckpt/base/safetensors.h"

namespace ckpt::testing {

// A directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("ckpt-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::string bytes;
};

inline std::string Serialize(const std::vector<OwnedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape, t.bytes});
  return WriteSafetensors(specs, metadata).value();
}

inline std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.FinishHex();
}

inline uint64_t ElementCount(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

inline std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// Lowercase hex of `bytes`, and back: golden bytes of formats in tests.
inline std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

inline std::string Unhex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  }
  return out;
}

inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A model-like checkpoint that drifts slowly from step to step, like SGD would move it:
// F32 weight matrices, an F16 and a BF16 tensor, an I64 counter, a BOOL mask and an empty and a
// scalar tensor. `step` selects the drift; the same (seed, step) always gives the same bytes.
class DriftingModel {
 public:
  DriftingModel(uint64_t seed, size_t weight_elements) : rng_(seed) {
    std::normal_distribution<float> init(0.0f, 0.05f);
    weights_.resize(weight_elements);
    for (auto& w : weights_) w = init(rng_);
    bias_.resize(64);
    for (auto& b : bias_) b = init(rng_);
  }

  // Advances one step and returns the serialized checkpoint.
  std::string Next() {
    std::normal_distribution<float> noise(0.0f, 1e-3f);
    for (size_t i = 0; i < weights_.size(); ++i) {
      if (i % 3 != 0) weights_[i] += noise(rng_);  // a third of the weights stay frozen
    }
    for (auto& b : bias_) b += noise(rng_);
    ++step_;
    std::vector<OwnedTensor> t;
    const uint64_t cols = 64;
    t.push_back({"layer1.weight",
                 DType::kF32,
                 {weights_.size() / cols, cols},
                 FloatBytes(std::vector<float>(weights_.begin(),
                                               weights_.begin() + weights_.size() / cols * cols))});
    t.push_back({"layer1.bias", DType::kF32, {bias_.size()}, FloatBytes(bias_)});
    std::string half(bias_.size() * 2, '\0');
    std::string bf16(bias_.size() * 2, '\0');
    for (size_t i = 0; i < bias_.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &bias_[i], 4);
      bf16[2 * i] = static_cast<char>((bits >> 16) & 0xff);
      bf16[2 * i + 1] = static_cast<char>(bits >> 24);
      half[2 * i] = static_cast<char>(bits & 0xff);  // arbitrary but deterministic bit patterns
      half[2 * i + 1] = static_cast<char>((bits >> 8) & 0x3f);
    }
    t.push_back({"norm.f16", DType::kF16, {bias_.size()}, half});
    t.push_back({"norm.bf16", DType::kBF16, {bias_.size()}, bf16});
    int64_t counter = static_cast<int64_t>(step_);
    t.push_back({"step", DType::kI64, {}, std::string(reinterpret_cast<char*>(&counter), 8)});
    std::string mask(37, '\0');
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<char>((i + step_) % 2);
    t.push_back({"mask", DType::kBool, {37}, mask});
    t.push_back({"empty", DType::kF32, {0, 5}, ""});
    return Serialize(t, {{"format", "pt"}, {"step", std::to_string(step_)}});
  }

 private:
  std::mt19937_64 rng_;
  std::vector<float> weights_;
  std::vector<float> bias_;
  uint64_t step_ = 0;
};

// An IEEE half's bits as a double, exactly (subnormals, ±Inf and NaN included). Written out
// rather than through _Float16, which clang 14 (the fuzz build's compiler) lacks on x86-64.
inline double HalfBitsToDouble(uint16_t h) {
  const double sign = h & 0x8000 ? -1.0 : 1.0;
  const int exponent = h >> 10 & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Loads element i of a float tensor's bytes as a double (F64, F32, F16, BF16).
inline double LoadFloat(DType dtype, const char* p) {
  switch (dtype) {
    case DType::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfBitsToDouble(h);
    }
    default: {  // BF16
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t bits = uint32_t{b} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}

struct BoundCheck {
  std::string error;             // empty when the restored body honours the guarantee
  double worst = 0;              // largest |pushed - restored| over finite float elements
  uint64_t inexact_tensors = 0;  // float tensors that did not restore bit-exactly
};

// The header of a whole safetensors body (its data starts at 8 + json_size).
inline Result<SafetensorsHeader> ParseBodyHeader(std::string_view body) {
  if (body.size() < 8) return Status::InvalidArgument("shorter than 8 bytes");
  uint64_t n = 0;
  std::memcpy(&n, body.data(), 8);
  if (n > body.size() - 8) return Status::InvalidArgument("header length past the body");
  return ParseSafetensorsHeader(body.substr(8, n), body.size());
}

// Checks the lossy guarantee on a whole safetensors body: the header restores verbatim, every
// finite F64/F32/F16/BF16 element is within `bound` (or, for a tensor named in `pointwise`,
// within that factor of its own magnitude), non-finite ones and every other dtype are bit-exact.
inline BoundCheck CheckWithinBound(std::string_view pushed, std::string_view restored, double bound,
                                   const std::map<std::string, double>& pointwise = {}) {
  BoundCheck out;
  if (pushed.size() != restored.size()) {
    out.error = "size differs";
    return out;
  }
  uint64_t n = 0;
  std::memcpy(&n, pushed.data(), 8);
  if (pushed.substr(0, 8 + n) != restored.substr(0, 8 + n)) {
    out.error = "header differs";
    return out;
  }
  auto header = ParseSafetensorsHeader(pushed.substr(8, n), pushed.size());
  if (!header.ok()) {
    out.error = header.status().ToString();
    return out;
  }
  const char* p = pushed.data() + 8 + n;
  const char* r = restored.data() + 8 + n;
  for (const TensorInfo& t : header->tensors) {
    const bool is_float = t.dtype == DType::kF64 || t.dtype == DType::kF32 ||
                          t.dtype == DType::kF16 || t.dtype == DType::kBF16;
    const bool same = std::memcmp(p + t.begin, r + t.begin, t.byte_size()) == 0;
    if (!is_float) {
      if (!same)
        out.error =
            "tensor '" + t.name + "' (" + std::string(DTypeName(t.dtype)) + ") is not bit-exact";
      if (!same) return out;
      continue;
    }
    out.inexact_tensors += !same;
    const uint32_t size = DTypeSize(t.dtype);
    for (uint64_t off = t.begin; off < t.end; off += size) {
      const double x = LoadFloat(t.dtype, p + off), y = LoadFloat(t.dtype, r + off);
      if (!std::isfinite(x)) {
        if (std::memcmp(p + off, r + off, size) != 0) {
          out.error = "tensor '" + t.name + "': non-finite element not restored exactly";
          return out;
        }
        continue;
      }
      const double err = std::abs(x - y);
      out.worst = std::max(out.worst, err);
      const auto relative = pointwise.find(t.name);
      const double allowed = relative == pointwise.end() ? bound : relative->second * std::abs(x);
      if (!(err <= allowed)) {
        out.error = "tensor '" + t.name + "' element " + std::to_string((off - t.begin) / size) +
                    ": |" + std::to_string(x) + " - " + std::to_string(y) + "| > " +
                    std::to_string(allowed);
        return out;
      }
    }
  }
  return out;
}

}  // namespace ckpt::testing
