#include "ckpt/codec/policy.h"

#include <nlohmann/json.hpp>

namespace ckpt {

Result<CodecPolicy> CodecPolicy::FromJson(std::string_view text, const CodecPolicy& base) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidArgument("policy: body is not valid JSON");
  if (!doc.is_object()) return Status::InvalidArgument("policy: body must be a JSON object");
  CodecPolicy policy = base;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    if (key == "mode") {
      if (!it->is_string()) return Status::InvalidArgument("policy: 'mode' must be a string");
      const auto mode = it->get<std::string>();
      if (mode == "lossless") {
        policy.mode = CodecMode::kLossless;
      } else {
        return Status::InvalidArgument("policy: 'mode' must be \"lossless\" (got \"" + mode +
                                       "\")");
      }
    } else if (key == "keyframe_every") {
      if (!it->is_number_integer()) {
        return Status::InvalidArgument("policy: 'keyframe_every' must be an integer");
      }
      const auto n = it->get<int64_t>();
      if (n < 1 || n > kMaxKeyframeEvery) {
        return Status::InvalidArgument("policy: 'keyframe_every' must be in [1, " +
                                       std::to_string(kMaxKeyframeEvery) + "] (got " +
                                       std::to_string(n) + ")");
      }
      policy.keyframe_every = static_cast<uint32_t>(n);
    } else {
      return Status::InvalidArgument("policy: unknown field '" + key + "'");
    }
  }
  return policy;
}

std::string CodecPolicy::ToJson() const {
  nlohmann::json doc = {{"mode", "lossless"}, {"keyframe_every", keyframe_every}};
  return doc.dump();
}

}  // namespace ckpt
