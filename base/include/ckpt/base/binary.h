// Little-endian binary encoding helpers shared by codec payloads and storage records.
//
// ByteWriter appends fixed-width integers and length-prefixed strings; ByteReader reads them
// back with bounds checks, returning DataLoss naming `what` and the failing offset on truncation.
// Thread-compatible value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt {

class ByteWriter {
 public:
  void PutU8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void PutU16(uint16_t v) { PutFixed(v, 2); }
  void PutU32(uint32_t v) { PutFixed(v, 4); }
  void PutU64(uint64_t v) { PutFixed(v, 8); }
  void PutBytes(std::string_view bytes) { out_.append(bytes); }
  // u32 length followed by the bytes.
  void PutLengthPrefixed(std::string_view bytes) {
    PutU32(static_cast<uint32_t>(bytes.size()));
    out_.append(bytes);
  }
  // u64 length followed by the bytes, for values that may exceed 4 GiB.
  void PutLengthPrefixed64(std::string_view bytes) {
    PutU64(bytes.size());
    out_.append(bytes);
  }
  const std::string& data() const { return out_; }
  std::string Release() { return std::move(out_); }

 private:
  void PutFixed(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> in, std::string_view what) : in_(in), what_(what) {}
  ByteReader(std::string_view in, std::string_view what)
      : in_(reinterpret_cast<const uint8_t*>(in.data()), in.size()), what_(what) {}

  Status GetU8(uint8_t* v) { return GetFixed(v, 1); }
  Status GetU16(uint16_t* v) { return GetFixed(v, 2); }
  Status GetU32(uint32_t* v) { return GetFixed(v, 4); }
  Status GetU64(uint64_t* v) { return GetFixed(v, 8); }
  Status GetSpan(uint64_t n, std::span<const uint8_t>* out) {
    if (n > in_.size() - pos_) return Truncated(n);
    *out = in_.subspan(pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  Status GetLengthPrefixed(std::string* out) {
    uint32_t n = 0;
    CKPT_RETURN_IF_ERROR(GetU32(&n));
    return GetString(n, out);
  }
  Status GetLengthPrefixed64(std::string* out) {
    uint64_t n = 0;
    CKPT_RETURN_IF_ERROR(GetU64(&n));
    return GetString(n, out);
  }
  bool empty() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  Status GetString(uint64_t n, std::string* out) {
    std::span<const uint8_t> s;
    CKPT_RETURN_IF_ERROR(GetSpan(n, &s));
    out->assign(reinterpret_cast<const char*>(s.data()), s.size());
    return Status::Ok();
  }
  template <typename T>
  Status GetFixed(T* v, int bytes) {
    if (static_cast<size_t>(bytes) > in_.size() - pos_) return Truncated(bytes);
    uint64_t x = 0;
    for (int i = bytes - 1; i >= 0; --i) x = (x << 8) | in_[pos_ + i];
    pos_ += bytes;
    *v = static_cast<T>(x);
    return Status::Ok();
  }
  Status Truncated(uint64_t wanted) const {
    return Status::DataLoss(std::string(what_) + ": truncated at offset " + std::to_string(pos_) +
                            " (wanted " + std::to_string(wanted) + " bytes, " +
                            std::to_string(in_.size() - pos_) + " left)");
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  std::string_view what_;
};

}  // namespace ckpt
