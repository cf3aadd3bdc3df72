// The safetensors file format: strict header parsing, an incremental body parser, a writer.
//
// Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON starting with '{'
// (tensor name -> {"dtype","shape","data_offsets"} plus an optional "__metadata__" map of
// string -> string), then the data buffer. Offsets are relative to the data buffer, END is
// exclusive, and the tensors, sorted by offset, must tile the buffer exactly: no overlaps, no
// holes, nothing past the end, no trailing bytes.
//
// Everything here is pure computation; the classes hold no global state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/dtype.h"
#include "ckpt/base/status.h"

namespace ckpt {

// The largest JSON header accepted (the reference implementation's MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // offset of the first byte in the data buffer
  uint64_t end = 0;    // offset one past the last byte

  uint64_t byte_size() const { return end - begin; }
  uint64_t element_count() const;
};

struct SafetensorsHeader {
  // Tensors in data-buffer order (ascending offsets), which is also body order.
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
  uint64_t json_size = 0;                       // N, the header length field
  uint64_t data_size = 0;                       // bytes of the data buffer

  uint64_t total_size() const { return 8 + json_size + data_size; }
};

// Parses and validates the JSON header. `json` is exactly the N header bytes. If
// `body_size` is known (Content-Length), the tiled data buffer must match it exactly.
// Errors are InvalidArgument with a message naming the offending tensor or field.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json,
                                                 std::optional<uint64_t> body_size);

// The same for a header in its raw form: the 8-byte length prefix and the JSON, nothing more.
Result<SafetensorsHeader> ParseRawSafetensorsHeader(std::string_view raw_header);

// Receives a safetensors body as the stream parser decodes it.
class SafetensorsSink {
 public:
  virtual ~SafetensorsSink() = default;
  // Called once, after the header is parsed and validated. `raw_header` is the 8-byte length
  // prefix followed by the N JSON bytes, exactly as received.
  virtual Status OnHeader(const SafetensorsHeader& header, std::string_view raw_header) = 0;
  // Called with consecutive pieces of tensor `index` (in header.tensors order); the pieces of
  // one tensor arrive in order and together cover its byte range exactly.
  virtual Status OnTensorData(size_t index, std::span<const uint8_t> bytes) = 0;
  // Called when all bytes of tensor `index` have been delivered (also for empty tensors).
  virtual Status OnTensorEnd(size_t index) = 0;
};

// Parses a safetensors body incrementally: header first, then tensors in offset order. Holds
// at most the header in memory; tensor bytes are passed through to the sink as they arrive.
//
// Thread-compatible: one parser per body, driven by one thread at a time.
class SafetensorsStreamParser {
 public:
  // `sink` must outlive the parser. `body_size`, if known, is checked against the header before
  // any tensor byte is consumed. `max_header_bytes` rejects larger headers before buffering.
  SafetensorsStreamParser(SafetensorsSink* sink, std::optional<uint64_t> body_size,
                          uint64_t max_header_bytes = kMaxSafetensorsHeaderBytes);

  // Consumes the next bytes of the body. After an error the parser stays failed.
  Status Feed(std::span<const uint8_t> bytes);
  // Declares the end of the body; fails if the body is truncated.
  Status Finish();

  // Bytes consumed so far.
  uint64_t consumed() const { return consumed_; }
  // The header, once parsed (nullptr before).
  const SafetensorsHeader* header() const { return header_ ? &*header_ : nullptr; }

 private:
  Status FeedHeader(std::span<const uint8_t>& bytes);
  Status FeedData(std::span<const uint8_t>& bytes);
  Status EmitEmptyTensorsFrom(size_t index);

  SafetensorsSink* sink_;
  std::optional<uint64_t> body_size_;
  uint64_t max_header_bytes_;
  std::string raw_header_;  // length prefix + JSON, while the header is being read
  std::optional<SafetensorsHeader> header_;
  size_t tensor_index_ = 0;     // tensor whose bytes come next
  uint64_t tensor_offset_ = 0;  // bytes of that tensor already delivered
  uint64_t consumed_ = 0;
  Status failed_;
};

// A tensor to serialize: the bytes must be dtype-sized elements in row-major order.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::string_view data;
};

// The header of a safetensors file of `tensors` (in the given order; their `data` is not read,
// sizes follow from dtype and shape): the 8-byte length prefix and the JSON, padded with spaces
// to a multiple of 8 bytes as the reference writer does. The data buffer follows it.
Result<std::string> WriteSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// Serializes tensors (in the given order) into a complete safetensors file (the header as
// WriteSafetensorsHeader writes it, then the data).
Result<std::string> WriteSafetensors(const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata = {});

}  // namespace ckpt
