#include "ckpt/codec/tensor_codec.h"

#include "ckpt/codec/lossy_codec.h"

namespace ckpt {
namespace {

// Applies TensorCodec::Decode link by link, double-buffered.
class LinkByLinkChainDecoder final : public ChainDecoder {
 public:
  LinkByLinkChainDecoder(const TensorCodec* codec, DType dtype, size_t length)
      : codec_(codec), dtype_(dtype), length_(length) {}

  Status StartFromKeyframe(std::span<const uint8_t> payload) override {
    current_.resize(length_);
    started_ = true;
    borrowed_ = false;
    return codec_->Decode(dtype_, payload, std::nullopt, current_);
  }

  // The first delta reads `decoded` in place (the caller keeps it alive): no copy of a cached
  // reconstruction per restore.
  Status StartFromDecoded(std::span<const uint8_t> decoded) override {
    if (decoded.size() != length_) {
      return Status::DataLoss("chain: reconstruction length differs from chunk");
    }
    base_ = decoded;
    started_ = true;
    borrowed_ = true;
    return Status::Ok();
  }

  Status ApplyDelta(std::span<const uint8_t> payload) override {
    if (!started_) return Status::DataLoss("chain: delta before keyframe");
    next_.resize(length_);
    const std::span<const uint8_t> reference = borrowed_ ? base_ : std::span(current_);
    CKPT_RETURN_IF_ERROR(codec_->Decode(dtype_, payload, reference, next_));
    std::swap(current_, next_);
    borrowed_ = false;
    return Status::Ok();
  }

  Status Finish(std::vector<uint8_t>* out) override {
    if (!started_) return Status::DataLoss("chain: empty chain");
    if (borrowed_) {
      out->assign(base_.begin(), base_.end());
    } else {
      std::swap(*out, current_);
    }
    return Status::Ok();
  }

 private:
  const TensorCodec* codec_;
  const DType dtype_;
  const size_t length_;
  std::vector<uint8_t> current_;
  std::vector<uint8_t> next_;
  std::span<const uint8_t> base_;  // StartFromDecoded's, while borrowed_
  bool started_ = false;
  bool borrowed_ = false;  // the reconstruction so far is base_, not current_
};

}  // namespace

std::unique_ptr<ChainDecoder> TensorCodec::NewChainDecoder(DType dtype, size_t length) const {
  return std::make_unique<LinkByLinkChainDecoder>(this, dtype, length);
}

Result<const TensorCodec*> CodecForDecoding(uint16_t id) {
  static const std::unique_ptr<TensorCodec> lossless = NewLosslessCodec();
  static const std::unique_ptr<TensorCodec> lossy = NewLossyCodec({});
  switch (static_cast<CodecId>(id)) {
    case CodecId::kLosslessBytePlanes:
      return static_cast<const TensorCodec*>(lossless.get());
    case CodecId::kLossyQuantized:
      return static_cast<const TensorCodec*>(lossy.get());
  }
  return Status::DataLoss("unknown codec id " + std::to_string(id) +
                          " (written by a newer ckptd?)");
}

}  // namespace ckpt
