// The extra-bits stream of lossy payloads: raw bits, least significant first, packed from the
// low bit of each byte up (docs/format.md). Thread-compatible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace ckpt::lossy {

class BitWriter {
 public:
  void Put(uint64_t value, uint32_t bits) {
    if (bits > 32) {  // keeps fill_ + bits within the 64-bit accumulator
      Put(value & 0xffffffffu, 32);
      Put(value >> 32, bits - 32);
      return;
    }
    acc_ |= (value & ((uint64_t{1} << bits) - 1)) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      out_.push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  std::string Finish() {
    if (fill_) out_.push_back(static_cast<char>(acc_));
    fill_ = 0;
    acc_ = 0;
    return std::move(out_);
  }

 private:
  std::string out_;
  uint64_t acc_ = 0;  // fill_ (< 8 between calls) pending bits
  uint32_t fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // Reads `bits` (<= 64) bits; false when the stream is exhausted.
  bool Get(uint32_t bits, uint64_t* value) {
    if (bits > size_ * 8 - pos_) return false;
    uint64_t v = 0;
    uint32_t got = 0;
    while (got < bits) {  // a byte (or what is left of one) at a time
      const uint32_t shift = static_cast<uint32_t>(pos_ & 7);
      const uint32_t take = std::min(8 - shift, bits - got);
      const uint64_t piece = (data_[pos_ >> 3] >> shift) & ((1u << take) - 1);
      v |= piece << got;
      got += take;
      pos_ += take;
    }
    *value = v;
    return true;
  }
  // True when at most the padding bits of the last byte are left.
  bool AtEnd() const { return size_ * 8 - pos_ < 8; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace ckpt::lossy
