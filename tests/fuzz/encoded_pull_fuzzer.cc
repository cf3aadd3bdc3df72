// Fuzzes the client's decoder of encoded pull bodies (EncodedPullDecoder): what a server sends is
// untrusted input to the client. Any body must end in InvalidArgument (malformed), DataLoss (a
// record that does not decode to the bytes it names, a digest that differs) or
// FailedPrecondition (a link from a reconstruction not held), never a crash or another error;
// a body accepted writes exactly the body its header describes.
//
// Input: flags (1 byte: bit 0 a held reconstruction follows, bit 1 decode on 2 threads, bits
// 2-7 the size of the pieces fed: 0 one byte at a time, else that many times 512), then when held a
// u32 length and the held safetensors body, then the pull body (the rest).
#include <cstring>
#include <optional>
#include <string>

#include "ckpt/base/safetensors.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_pull.h"
#include "fuzz_support.h"

using namespace ckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const uint8_t flags = in.Byte();
  std::optional<CheckpointView> held;
  if (flags & 1) {
    const uint32_t low = in.U16();
    const uint32_t length = low | uint32_t{in.U16()} << 16;
    const auto bytes = in.Take(length);
    auto parsed = CheckpointView::Parse(bytes);
    if (parsed.ok()) held.emplace(std::move(parsed).value());
  }
  const size_t piece = (flags >> 2) == 0 ? 1 : (flags >> 2) * 512;
  const auto body = in.Rest();

  uint64_t written = 0;
  std::string header;
  EncodedPullDecoder decoder(
      held ? &*held : nullptr,
      [&](std::string_view bytes) {
        if (written == 0) header.assign(bytes);  // the header comes first, in one piece
        written += bytes.size();
        return Status::Ok();
      },
      flags & 2 ? 2 : 1);
  const std::initializer_list<StatusCode> allowed = {
      StatusCode::kInvalidArgument, StatusCode::kDataLoss, StatusCode::kFailedPrecondition};
  for (size_t at = 0; at < body.size(); at += piece) {
    const Status fed = decoder.Feed(body.subspan(at, std::min(piece, body.size() - at)));
    fuzz::CheckStatusIn(fed, allowed, "Feed");
    if (!fed.ok()) return 0;
  }
  const Status finished = decoder.Finish();
  fuzz::CheckStatusIn(finished, allowed, "Finish");
  if (!finished.ok()) return 0;
  auto parsed = ParseRawSafetensorsHeader(header);
  fuzz::Check(parsed.ok(), "an accepted body's header does not parse");
  fuzz::Check(written == header.size() + parsed->data_size,
              "an accepted body wrote other than its header's size");
  fuzz::Check(decoder.restored_bytes() == written, "restored_bytes differs from what was written");
  return 0;
}
