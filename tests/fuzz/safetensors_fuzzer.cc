// Fuzzes the safetensors parsers with arbitrary bodies. Invariants: errors are InvalidArgument
// (the body is the client's), the stream parser hands every tensor's bytes over exactly once and
// in order whatever the piece sizes, it agrees with the header parser, and a body it accepts
// survives a write/parse round trip unchanged.
//
// Input: one byte choosing the piece size the body is fed in (1 + b * 37 bytes), then the body.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "fuzz_support.h"

using namespace ckpt;

namespace {

// Records what the parser delivers and checks the order of calls.
class RecordingSink : public SafetensorsSink {
 public:
  Status OnHeader(const SafetensorsHeader& header, std::string_view raw_header) override {
    fuzz::Check(!header_, "OnHeader called twice");
    fuzz::Check(raw_header.size() == 8 + header.json_size, "raw header of the wrong length");
    header_ = header;
    data_.resize(header.tensors.size());
    ended_.assign(header.tensors.size(), false);
    return Status::Ok();
  }
  Status OnTensorData(size_t index, std::span<const uint8_t> bytes) override {
    fuzz::Check(header_ && index < data_.size() && !ended_[index], "data for a wrong tensor");
    fuzz::Check(index == 0 || ended_[index - 1], "tensor data out of order");
    data_[index].append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    fuzz::Check(data_[index].size() <= header_->tensors[index].byte_size(), "tensor overrun");
    return Status::Ok();
  }
  Status OnTensorEnd(size_t index) override {
    fuzz::Check(header_ && index < data_.size() && !ended_[index], "end of a wrong tensor");
    fuzz::Check(data_[index].size() == header_->tensors[index].byte_size(), "tensor cut short");
    ended_[index] = true;
    return Status::Ok();
  }

  const std::optional<SafetensorsHeader>& header() const { return header_; }
  const std::vector<std::string>& data() const { return data_; }
  bool all_ended() const { return std::find(ended_.begin(), ended_.end(), false) == ended_.end(); }

 private:
  std::optional<SafetensorsHeader> header_;
  std::vector<std::string> data_;
  std::vector<bool> ended_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const size_t piece = 1 + in.Byte() * size_t{37};
  const auto body = in.Rest();

  // The header parser on the JSON the length prefix names (if the body holds it).
  std::optional<SafetensorsHeader> parsed;
  if (body.size() >= 8) {
    uint64_t n = 0;
    std::memcpy(&n, body.data(), 8);
    if (n <= body.size() - 8) {
      auto header = ParseSafetensorsHeader(fuzz::AsText(body.subspan(8, n)), body.size());
      fuzz::CheckStatusIn(header.status(), {StatusCode::kInvalidArgument},
                          "ParseSafetensorsHeader");
      if (header.ok()) parsed = *header;
    }
  }

  RecordingSink sink;
  SafetensorsStreamParser parser(&sink, body.size(), /*max_header_bytes=*/1 << 20);
  Status status;
  for (size_t off = 0; off < body.size() && status.ok(); off += piece) {
    status = parser.Feed(body.subspan(off, std::min(piece, body.size() - off)));
  }
  if (status.ok()) status = parser.Finish();
  fuzz::CheckStatusIn(status, {StatusCode::kInvalidArgument}, "SafetensorsStreamParser");
  if (!status.ok()) return 0;

  fuzz::Check(parsed.has_value(), "the stream parser accepted what the header parser refused");
  fuzz::Check(sink.header() && sink.all_ended(), "accepted without delivering every tensor");
  fuzz::Check(parser.consumed() == body.size(), "accepted without consuming the body");
  const SafetensorsHeader& header = *sink.header();
  fuzz::Check(header.total_size() == body.size(), "header sizes do not add up to the body");
  fuzz::Check(parsed->tensors.size() == header.tensors.size(), "the parsers disagree");

  // Round trip: write what was parsed, parse it again, same tensors and bytes.
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    specs.push_back({t.name, t.dtype, t.shape, sink.data()[i]});
  }
  auto written = WriteSafetensors(specs, header.metadata);
  fuzz::Check(written.ok(), "WriteSafetensors refused tensors the parser accepted");
  RecordingSink again;
  SafetensorsStreamParser reparser(&again, written->size());
  Status reparsed =
      reparser.Feed({reinterpret_cast<const uint8_t*>(written->data()), written->size()});
  if (reparsed.ok()) reparsed = reparser.Finish();
  fuzz::Check(reparsed.ok(), "a written body does not parse");
  fuzz::Check(again.data() == sink.data(), "round trip changed tensor bytes");
  fuzz::Check(again.header()->metadata == header.metadata, "round trip changed the metadata");
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo &a = header.tensors[i], &b = again.header()->tensors[i];
    fuzz::Check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape,
                "round trip changed a tensor's name, dtype or shape");
  }
  return 0;
}
