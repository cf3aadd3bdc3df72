// Lossless byte-plane codec.
//
// Payload layout (all integers little-endian), see docs/format.md:
//   u8  payload_version        (1)
//   u8  plane_count P          (1, or the element size for float dtypes)
//   u64 raw_length             bytes of the decoded chunk
//   P × { u8 plane_encoding (0 = stored, 1 = zstd); u32 encoded_length }
//   P encoded planes, in order
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "ckpt/codec/tensor_codec.h"
#include "ckpt/codec/binary.h"

namespace ckpt {
namespace {

constexpr uint8_t kPayloadVersion = 1;
constexpr uint8_t kPlaneStored = 0;
constexpr uint8_t kPlaneZstd = 1;

uint32_t PlaneCount(DType dtype) { return DTypeIsFloat(dtype) ? DTypeSize(dtype) : 1; }

// Byte j of every element goes to plane j.
void SplitPlanes(std::span<const uint8_t> in, uint32_t planes, std::vector<uint8_t>& out) {
  out.resize(in.size());
  const size_t n = in.size() / planes;
  for (uint32_t p = 0; p < planes; ++p) {
    uint8_t* dst = out.data() + p * n;
    const uint8_t* src = in.data() + p;
    for (size_t i = 0; i < n; ++i) dst[i] = src[i * planes];
  }
}

void MergePlanes(std::span<const uint8_t> in, uint32_t planes, std::span<uint8_t> out) {
  const size_t n = in.size() / planes;
  for (uint32_t p = 0; p < planes; ++p) {
    const uint8_t* src = in.data() + p * n;
    uint8_t* dst = out.data() + p;
    for (size_t i = 0; i < n; ++i) dst[i * planes] = src[i];
  }
}

class LosslessBytePlaneCodec final : public TensorCodec {
 public:
  explicit LosslessBytePlaneCodec(const LosslessCodecOptions& options) : options_(options) {}

  CodecId id() const override { return CodecId::kLosslessBytePlanes; }

  Result<EncodedChunk> Encode(DType dtype, std::span<const uint8_t> current,
                              std::optional<std::span<const uint8_t>> reference) const override {
    const uint32_t planes = PlaneCount(dtype);
    if (current.size() % DTypeSize(dtype) != 0) {
      return Status::InvalidArgument("lossless codec: chunk of " +
                                     std::to_string(current.size()) +
                                     " bytes is not a whole number of elements");
    }
    std::vector<uint8_t> xored;
    std::span<const uint8_t> source = current;
    if (reference) {
      if (reference->size() != current.size()) {
        return Status::InvalidArgument("lossless codec: reference length differs from chunk");
      }
      xored.resize(current.size());
      for (size_t i = 0; i < current.size(); ++i) xored[i] = current[i] ^ (*reference)[i];
      source = xored;
    }
    std::vector<uint8_t> split;
    if (planes > 1) {
      SplitPlanes(source, planes, split);
      source = split;
    }

    ByteWriter w;
    w.PutU8(kPayloadVersion);
    w.PutU8(static_cast<uint8_t>(planes));
    w.PutU64(current.size());
    const size_t plane_len = current.size() / planes;
    std::vector<std::string> encoded(planes);
    std::vector<uint8_t> encodings(planes);
    for (uint32_t p = 0; p < planes; ++p) {
      auto plane = source.subspan(p * plane_len, plane_len);
      std::string z(ZSTD_compressBound(plane.size()), '\0');
      size_t n = ZSTD_compress(z.data(), z.size(), plane.data(), plane.size(),
                               options_.zstd_level);
      if (ZSTD_isError(n)) {
        return Status::Internal(std::string("lossless codec: zstd: ") + ZSTD_getErrorName(n));
      }
      if (n < plane.size()) {
        z.resize(n);
        encodings[p] = kPlaneZstd;
        encoded[p] = std::move(z);
      } else {
        encodings[p] = kPlaneStored;
        encoded[p].assign(reinterpret_cast<const char*>(plane.data()), plane.size());
      }
    }
    for (uint32_t p = 0; p < planes; ++p) {
      w.PutU8(encodings[p]);
      w.PutU32(static_cast<uint32_t>(encoded[p].size()));
    }
    for (const auto& e : encoded) w.PutBytes(e);
    EncodedChunk out;
    out.payload = w.Release();
    return out;
  }

  Status Decode(DType dtype, std::span<const uint8_t> payload,
                std::optional<std::span<const uint8_t>> reference,
                std::span<uint8_t> out) const override {
    ByteReader r(payload, "lossless payload");
    uint8_t version = 0, planes = 0;
    uint64_t raw_length = 0;
    CKPT_RETURN_IF_ERROR(r.GetU8(&version));
    if (version != kPayloadVersion) {
      return Status::DataLoss("lossless payload: unsupported payload version " +
                              std::to_string(version));
    }
    CKPT_RETURN_IF_ERROR(r.GetU8(&planes));
    CKPT_RETURN_IF_ERROR(r.GetU64(&raw_length));
    if (planes != 1 && planes != DTypeSize(dtype)) {
      return Status::DataLoss("lossless payload: plane count " + std::to_string(planes) +
                              " invalid for dtype " + std::string(DTypeName(dtype)));
    }
    if (raw_length != out.size() || raw_length % planes != 0) {
      return Status::DataLoss("lossless payload: raw length " + std::to_string(raw_length) +
                              " does not match chunk length " + std::to_string(out.size()));
    }
    if (reference && reference->size() != out.size()) {
      return Status::DataLoss("lossless payload: reference length differs from chunk");
    }
    std::vector<uint8_t> encodings(planes);
    std::vector<uint32_t> lengths(planes);
    for (uint32_t p = 0; p < planes; ++p) {
      CKPT_RETURN_IF_ERROR(r.GetU8(&encodings[p]));
      CKPT_RETURN_IF_ERROR(r.GetU32(&lengths[p]));
    }
    const size_t plane_len = raw_length / planes;
    std::vector<uint8_t> split;
    std::span<uint8_t> target = out;
    if (planes > 1) {
      split.resize(raw_length);
      target = split;
    }
    for (uint32_t p = 0; p < planes; ++p) {
      std::span<const uint8_t> encoded;
      CKPT_RETURN_IF_ERROR(r.GetSpan(lengths[p], &encoded));
      auto dst = target.subspan(p * plane_len, plane_len);
      if (encodings[p] == kPlaneStored) {
        if (encoded.size() != plane_len) {
          return Status::DataLoss("lossless payload: stored plane " + std::to_string(p) +
                                  " has " + std::to_string(encoded.size()) + " bytes, expected " +
                                  std::to_string(plane_len));
        }
        std::copy(encoded.begin(), encoded.end(), dst.begin());
      } else if (encodings[p] == kPlaneZstd) {
        size_t n = ZSTD_decompress(dst.data(), dst.size(), encoded.data(), encoded.size());
        if (ZSTD_isError(n) || n != plane_len) {
          return Status::DataLoss("lossless payload: plane " + std::to_string(p) +
                                  " does not decompress to " + std::to_string(plane_len) +
                                  " bytes" +
                                  (ZSTD_isError(n) ? std::string(": ") + ZSTD_getErrorName(n)
                                                   : std::string()));
        }
      } else {
        return Status::DataLoss("lossless payload: unknown plane encoding " +
                                std::to_string(encodings[p]));
      }
    }
    if (!r.empty()) {
      return Status::DataLoss("lossless payload: " + std::to_string(r.remaining()) +
                              " trailing bytes");
    }
    if (planes > 1) MergePlanes(split, planes, out);
    if (reference) {
      for (size_t i = 0; i < out.size(); ++i) out[i] ^= (*reference)[i];
    }
    return Status::Ok();
  }

 private:
  LosslessCodecOptions options_;
};

}  // namespace

std::unique_ptr<TensorCodec> NewLosslessCodec(const LosslessCodecOptions& options) {
  return std::make_unique<LosslessBytePlaneCodec>(options);
}

Result<const TensorCodec*> CodecForDecoding(uint16_t id) {
  static const LosslessBytePlaneCodec lossless{LosslessCodecOptions{}};
  switch (static_cast<CodecId>(id)) {
    case CodecId::kLosslessBytePlanes:
      return static_cast<const TensorCodec*>(&lossless);
  }
  return Status::DataLoss("unknown codec id " + std::to_string(id) +
                          " (written by a newer ckptd?)");
}

}  // namespace ckpt
