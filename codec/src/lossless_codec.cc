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
#include <functional>
#include <mutex>

#include "byte_planes.h"
#include "ckpt/base/binary.h"
#include "ckpt/codec/tensor_codec.h"

namespace ckpt {
namespace {

constexpr uint8_t kPayloadVersion = 1;
constexpr uint8_t kPlaneStored = 0;
constexpr uint8_t kPlaneZstd = 1;
// A plane whose first kSampleBytes do not shrink below kIncompressible of their size at zstd
// level 1 is stored as is: mantissa planes of trained weights are close to random, and skipping
// zstd on them saves most of the encoding time at no cost in size.
constexpr size_t kSampleBytes = 64 << 10;
constexpr double kIncompressible = 0.98;

uint32_t PlaneCount(DType dtype) { return DTypeIsFloat(dtype) ? DTypeSize(dtype) : 1; }

// dst[i] ^= src[i] for n bytes, eight at a time: the byte loop, whose pointers may alias, is not
// vectorized at -O2, and the plane-domain chain decoder spends its time here.
void XorInto(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < n; ++i) dst[i] ^= src[i];
}

// A small free list of reusable objects (zstd contexts, scratch buffers), so that steady-state
// encoding allocates and page-faults nothing. Safe for concurrent use.
template <typename T>
class Pool {
 public:
  using Factory = std::function<std::unique_ptr<T, void (*)(T*)>()>;
  using Handle = std::unique_ptr<T, void (*)(T*)>;
  explicit Pool(Factory make) : make_(std::move(make)) {}

  // Returns an object to the pool when the lease ends.
  class Lease {
   public:
    Lease(Pool* pool, Handle h) : pool_(pool), handle_(std::move(h)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (handle_) pool_->Release(std::move(handle_));
    }
    T* get() const { return handle_.get(); }
    T* operator->() const { return handle_.get(); }

   private:
    Pool* pool_;
    Handle handle_;
  };

  Lease Acquire() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        Handle h = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(h));
      }
    }
    return Lease(this, make_());
  }

 private:
  static constexpr size_t kMaxFree = 8;
  void Release(Handle h) {
    std::lock_guard lock(mu_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(h));
  }
  Factory make_;
  std::mutex mu_;
  std::vector<Handle> free_;  // guarded by mu_
};

using Buffer = std::vector<uint8_t>;

class LosslessBytePlaneCodec final : public TensorCodec {
 public:
  explicit LosslessBytePlaneCodec(const LosslessCodecOptions& options)
      : options_(options),
        cctx_pool_([] {
          return Pool<ZSTD_CCtx>::Handle(ZSTD_createCCtx(), [](ZSTD_CCtx* c) { ZSTD_freeCCtx(c); });
        }),
        dctx_pool_([] {
          return Pool<ZSTD_DCtx>::Handle(ZSTD_createDCtx(), [](ZSTD_DCtx* c) { ZSTD_freeDCtx(c); });
        }),
        buffer_pool_(
            [] { return Pool<Buffer>::Handle(new Buffer(), [](Buffer* b) { delete b; }); }) {}

  CodecId id() const override { return CodecId::kLosslessBytePlanes; }
  bool DeltasAreSymmetric() const override { return true; }

  Result<EncodedChunk> Encode(DType dtype, std::span<const uint8_t> current,
                              std::optional<std::span<const uint8_t>> reference) const override {
    const uint32_t planes = PlaneCount(dtype);
    if (current.size() % DTypeSize(dtype) != 0) {
      return Status::InvalidArgument("lossless codec: chunk of " + std::to_string(current.size()) +
                                     " bytes is not a whole number of elements");
    }
    if (reference && reference->size() != current.size()) {
      return Status::InvalidArgument("lossless codec: reference length differs from chunk");
    }
    auto split = buffer_pool_.Acquire();
    split->resize(current.size());
    SplitPlanes(current, reference ? reference->data() : nullptr, planes, split->data());

    const size_t plane_len = current.size() / planes;
    const size_t header_len = 1 + 1 + 8 + planes * (1 + 4);
    auto cctx = cctx_pool_.Acquire();
    auto sample = buffer_pool_.Acquire();
    EncodedChunk out;
    out.codec_id = CodecId::kLosslessBytePlanes;
    out.payload.resize(header_len + planes * ZSTD_compressBound(plane_len));
    char* cursor = out.payload.data() + header_len;
    ByteWriter header;
    header.PutU8(kPayloadVersion);
    header.PutU8(static_cast<uint8_t>(planes));
    header.PutU64(current.size());
    for (uint32_t p = 0; p < planes; ++p) {
      const uint8_t* plane = split->data() + p * plane_len;
      uint8_t encoding = kPlaneZstd;
      size_t n = 0;
      if (plane_len > 2 * kSampleBytes) {
        sample->resize(ZSTD_compressBound(kSampleBytes));
        size_t z =
            ZSTD_compressCCtx(cctx.get(), sample->data(), sample->size(), plane, kSampleBytes, 1);
        if (!ZSTD_isError(z) && z > kIncompressible * kSampleBytes) encoding = kPlaneStored;
      }
      if (encoding == kPlaneZstd) {
        n = ZSTD_compressCCtx(cctx.get(), cursor, ZSTD_compressBound(plane_len), plane, plane_len,
                              options_.zstd_level);
        if (ZSTD_isError(n)) {
          return Status::Internal(std::string("lossless codec: zstd: ") + ZSTD_getErrorName(n));
        }
        if (n >= plane_len) encoding = kPlaneStored;
      }
      if (encoding == kPlaneStored) {
        if (plane_len > 0) std::memcpy(cursor, plane, plane_len);  // empty chunks: null planes
        n = plane_len;
      }
      header.PutU8(encoding);
      header.PutU32(static_cast<uint32_t>(n));
      cursor += n;
    }
    out.payload.resize(static_cast<size_t>(cursor - out.payload.data()));
    std::memcpy(out.payload.data(), header.data().data(), header_len);
    return out;
  }

  Status Decode(DType dtype, std::span<const uint8_t> payload,
                std::optional<std::span<const uint8_t>> reference,
                std::span<uint8_t> out) const override {
    if (reference && reference->size() != out.size()) {
      return Status::DataLoss("lossless payload: reference length differs from chunk");
    }
    auto split = buffer_pool_.Acquire();
    uint32_t planes = 0;
    CKPT_RETURN_IF_ERROR(
        DecodePlanes(dtype, payload, out.size(), /*xor_into=*/false, *split.get(), &planes));
    MergePlanes(*split.get(), reference ? reference->data() : nullptr, planes, out.data());
    return Status::Ok();
  }

  std::unique_ptr<ChainDecoder> NewChainDecoder(DType dtype, size_t length) const override;

  // A buffer of the codec's pool, returned to it when the lease ends.
  Pool<Buffer>::Lease AcquireBuffer() const { return buffer_pool_.Acquire(); }

  // Decodes the planes of `payload` into `split` (plane p at p * length / planes), or XORs them
  // into it when `xor_into`. Validates the whole payload; corrupt input is DataLoss.
  Status DecodePlanes(DType dtype, std::span<const uint8_t> payload, size_t length, bool xor_into,
                      Buffer& split, uint32_t* plane_count) const {
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
    if (raw_length != length || raw_length % planes != 0) {
      return Status::DataLoss("lossless payload: raw length " + std::to_string(raw_length) +
                              " does not match chunk length " + std::to_string(length));
    }
    if (xor_into && (split.size() != length || *plane_count != planes)) {
      return Status::DataLoss("lossless payload: plane layout differs from the chain's");
    }
    *plane_count = planes;
    uint8_t encodings[8];
    uint32_t lengths[8];
    for (uint32_t p = 0; p < planes; ++p) {
      CKPT_RETURN_IF_ERROR(r.GetU8(&encodings[p]));
      CKPT_RETURN_IF_ERROR(r.GetU32(&lengths[p]));
    }
    const size_t plane_len = raw_length / planes;
    auto dctx = dctx_pool_.Acquire();
    auto scratch = buffer_pool_.Acquire();
    if (!xor_into) split.resize(raw_length);
    for (uint32_t p = 0; p < planes; ++p) {
      std::span<const uint8_t> encoded;
      CKPT_RETURN_IF_ERROR(r.GetSpan(lengths[p], &encoded));
      uint8_t* dst = split.data() + p * plane_len;
      const uint8_t* plane = nullptr;
      if (encodings[p] == kPlaneStored) {
        if (encoded.size() != plane_len) {
          return Status::DataLoss("lossless payload: stored plane " + std::to_string(p) + " has " +
                                  std::to_string(encoded.size()) + " bytes, expected " +
                                  std::to_string(plane_len));
        }
        plane = encoded.data();
      } else if (encodings[p] == kPlaneZstd) {
        uint8_t* target = dst;
        if (xor_into) {
          scratch->resize(plane_len);
          target = scratch->data();
        }
        size_t n =
            ZSTD_decompressDCtx(dctx.get(), target, plane_len, encoded.data(), encoded.size());
        if (ZSTD_isError(n) || n != plane_len) {
          return Status::DataLoss(
              "lossless payload: plane " + std::to_string(p) + " does not decompress to " +
              std::to_string(plane_len) + " bytes" +
              (ZSTD_isError(n) ? std::string(": ") + ZSTD_getErrorName(n) : std::string()));
        }
        plane = target;
      } else {
        return Status::DataLoss("lossless payload: unknown plane encoding " +
                                std::to_string(encodings[p]));
      }
      if (xor_into) {
        XorInto(dst, plane, plane_len);
      } else if (plane != dst && plane_len > 0) {
        std::memcpy(dst, plane, plane_len);
      }
    }
    if (!r.empty()) {
      return Status::DataLoss("lossless payload: " + std::to_string(r.remaining()) +
                              " trailing bytes");
    }
    return Status::Ok();
  }

 private:
  LosslessCodecOptions options_;
  mutable Pool<ZSTD_CCtx> cctx_pool_;
  mutable Pool<ZSTD_DCtx> dctx_pool_;
  mutable Pool<Buffer> buffer_pool_;
};

// XOR deltas compose: the reconstruction after k deltas is the keyframe XOR every delta. And
// the byte-plane transposition is a permutation of bytes, so the XORs can all happen in the
// plane domain and the chain needs a single transposition at the end instead of one per link.
class LosslessChainDecoder final : public ChainDecoder {
 public:
  // The planes live in a buffer of the codec's pool: a restore decodes chunk after chunk of the
  // same length, so the buffer is neither allocated, zero-filled nor page-faulted per chunk.
  LosslessChainDecoder(const LosslessBytePlaneCodec* codec, DType dtype, size_t length)
      : codec_(codec),
        dtype_(dtype),
        length_(length),
        planes_lease_(codec->AcquireBuffer()),
        planes_(*planes_lease_.get()) {}

  Status StartFromKeyframe(std::span<const uint8_t> payload) override {
    started_ = true;
    return codec_->DecodePlanes(dtype_, payload, length_, /*xor_into=*/false, planes_, &count_);
  }

  Status StartFromDecoded(std::span<const uint8_t> decoded) override {
    if (decoded.size() != length_) {
      return Status::DataLoss("lossless chain: reconstruction length differs from chunk");
    }
    started_ = true;
    count_ = PlaneCount(dtype_);
    planes_.resize(length_);
    SplitPlanes(decoded, nullptr, count_, planes_.data());
    return Status::Ok();
  }

  Status ApplyDelta(std::span<const uint8_t> payload) override {
    if (!started_) return Status::DataLoss("lossless chain: delta before keyframe");
    // The format lets a payload of a multi-byte dtype have one plane or one per byte; a delta
    // laid out unlike the chain so far gets the chain's planes rearranged to its layout first.
    if (payload.size() >= 2 && payload[1] != count_ &&
        (payload[1] == 1 || payload[1] == DTypeSize(dtype_)) && planes_.size() == length_) {
      Buffer elements(length_);
      MergePlanes(planes_, nullptr, count_, elements.data());
      count_ = payload[1];
      SplitPlanes(elements, nullptr, count_, planes_.data());
    }
    return codec_->DecodePlanes(dtype_, payload, length_, /*xor_into=*/true, planes_, &count_);
  }

  Status Finish(std::vector<uint8_t>* out) override {
    if (!started_) return Status::DataLoss("lossless chain: empty chain");
    out->resize(length_);
    MergePlanes(planes_, nullptr, count_, out->data());
    return Status::Ok();
  }

 private:
  const LosslessBytePlaneCodec* codec_;
  const DType dtype_;
  const size_t length_;
  Pool<Buffer>::Lease planes_lease_;
  Buffer& planes_;  // *planes_lease_
  uint32_t count_ = 0;
  bool started_ = false;
};

std::unique_ptr<ChainDecoder> LosslessBytePlaneCodec::NewChainDecoder(DType dtype,
                                                                      size_t length) const {
  return std::make_unique<LosslessChainDecoder>(this, dtype, length);
}

}  // namespace

std::unique_ptr<TensorCodec> NewLosslessCodec(const LosslessCodecOptions& options) {
  return std::make_unique<LosslessBytePlaneCodec>(options);
}

}  // namespace ckpt
