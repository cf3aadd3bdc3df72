// Fuzzes the JSON documents clients send: codec policies (PUT .../policy) and retention
// policies (PUT .../retention). Invariants: errors are InvalidArgument, and an accepted policy
// survives a ToJson/FromJson round trip unchanged (what GET returns can be PUT back).
//
// Input: one selector byte (0: codec policy over the default, 1: codec policy over a lossy
// base, 2: retention policy; taken modulo 3), then the JSON document.
#include <string>

#include "ckpt/storage/codec_policy.h"
#include "ckpt/storage/retention.h"
#include "fuzz_support.h"

using namespace ckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::InputReader in(data, size);
  const int selector = in.Byte() % 3;
  const std::string_view json = fuzz::AsText(in.Rest());

  if (selector == 2) {
    auto policy = RetentionPolicy::FromJson(json);
    fuzz::CheckStatusIn(policy.status(), {StatusCode::kInvalidArgument}, "RetentionPolicy");
    if (!policy.ok()) return 0;
    const std::string text = policy->ToJson();
    auto again = RetentionPolicy::FromJson(text);
    fuzz::Check(again.ok(), "a rendered retention policy does not parse");
    fuzz::Check(again->ToJson() == text, "retention policy round trip changed it");
    return 0;
  }

  CodecPolicy base;
  if (selector == 1) {
    auto lossy = CodecPolicy::FromJson(R"({"mode": "lossy", "max_abs_error": 0.001})", base);
    fuzz::Check(lossy.ok(), "the lossy base policy does not parse");
    base = *lossy;
  }
  auto policy = CodecPolicy::FromJson(json, base);
  fuzz::CheckStatusIn(policy.status(), {StatusCode::kInvalidArgument}, "CodecPolicy");
  if (!policy.ok()) return 0;
  const std::string text = policy->ToJson();
  auto again = CodecPolicy::FromJson(text, CodecPolicy());
  fuzz::Check(again.ok(), "a rendered codec policy does not parse");
  fuzz::Check(again->ToJson() == text, "codec policy round trip changed it");
  return 0;
}
