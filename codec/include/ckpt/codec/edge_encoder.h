// The client's half of a push encoded at the edge: a checkpoint coded by the plan the daemon
// handed out (coding_plan.h), with the same codecs, options and chunks a push the daemon
// encodes would use, written as an encoded push body (encoded_body.h). Deltas are taken
// against the reference the client holds: the restored body of the plan's base, which the
// client kept from its previous push (the reconstruction this function returns) or pulled.
//
// Thread safety: the functions are reentrant; a CheckpointView must outlive its uses.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/base/status.h"
#include "ckpt/codec/coding_plan.h"

namespace ckpt {

// A complete safetensors checkpoint in memory, read in place: one body (a checkpoint file, or a
// restored body), or its header and each tensor's bytes where they lie (a program's tensors,
// never copied into one body).
class CheckpointView {
 public:
  // InvalidArgument when `body` is not one complete safetensors body.
  static Result<CheckpointView> Parse(std::span<const uint8_t> body);
  // `raw_header`: the length prefix and the JSON header; `tensor_data`: the bytes of each of
  // its tensors in body order. InvalidArgument when they do not make one complete body.
  static Result<CheckpointView> FromParts(std::span<const uint8_t> raw_header,
                                          std::vector<std::span<const uint8_t>> tensor_data);

  const SafetensorsHeader& header() const { return header_; }
  // The length prefix and the JSON header, as in the body.
  std::string_view raw_header() const {
    return {reinterpret_cast<const char*>(raw_header_.data()), raw_header_.size()};
  }
  // Bytes of the whole body.
  uint64_t byte_size() const { return header_.total_size(); }
  // SHA-256 (hex) of the whole body.
  std::string Sha256Hex() const;
  // The bytes of tensor `index` (body order).
  std::span<const uint8_t> TensorData(size_t index) const { return tensor_data_[index]; }
  // The bytes of the tensor named `name`, if the body has one.
  std::optional<std::span<const uint8_t>> TensorData(std::string_view name) const;

 private:
  CheckpointView(std::span<const uint8_t> raw_header, SafetensorsHeader header,
                 std::vector<std::span<const uint8_t>> tensor_data)
      : raw_header_(raw_header), header_(std::move(header)), tensor_data_(std::move(tensor_data)) {}

  std::span<const uint8_t> raw_header_;
  SafetensorsHeader header_;
  std::vector<std::span<const uint8_t>> tensor_data_;
};

struct EdgeEncoding {
  uint64_t raw_bytes = 0;       // of the checkpoint
  uint64_t encoded_bytes = 0;   // of the encoded body written
  std::string pushed_sha256;    // hex, of the checkpoint
  std::string restored_sha256;  // hex, of what a restore of the pushed version sends
};

// Receives the restored body of the pushed version, piece by piece in body order (its header
// first): what a restore of it will send, and the reference of the next push.
using RestoredSink = std::function<Status(std::span<const uint8_t>)>;

// A RestoredSink that collects the body in `out` (cleared first).
RestoredSink CollectInto(std::vector<uint8_t>* out);

// Encodes `checkpoint` by `plan`, against `reference` (the restored body of plan.base; may be
// null when the plan has no delta), on up to `threads` threads, handing the encoded body to
// `write` in order, piece by piece, and, when `restored` is given, the restored body to it.
// A plan of a shard (plan.shard) codes a shard: `checkpoint` is the shard (its slices declared
// as for a plain shard), `reference` the rank's part of the base (the same tensors and
// slices), the body an encoded shard (format 2: owned chunks coded, the rest raw), and the
// restored body the shard with its coded chunks replaced by their reconstructions.
// Errors: InvalidArgument when the plan does not describe the checkpoint; FailedPrecondition
// when a delta's reference is missing or is not the base's reconstruction (its SHA-256 differs
// from the plan's); whatever `write` or `restored` returns.
Result<EdgeEncoding> EncodeByPlan(const CodingPlan& plan, const CheckpointView& checkpoint,
                                  const CheckpointView* reference, int threads,
                                  const std::function<Status(std::string_view)>& write,
                                  const RestoredSink& restored = nullptr);

}  // namespace ckpt
