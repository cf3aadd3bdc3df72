#include "ckpt/base/model_name.h"

#include <string>

namespace ckpt {

Status ValidateModelName(std::string_view model) { return ValidateName("model name", model); }

Result<ModelName> ModelName::Parse(std::string_view name) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(name));
  return ModelName(std::string(name));
}

Status ValidateName(std::string_view what, std::string_view model) {
  auto valid_char = [](char c, bool first) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    return alnum || (!first && (c == '.' || c == '_' || c == '-'));
  };
  bool ok = !model.empty() && model.size() <= 128;
  for (size_t i = 0; ok && i < model.size(); ++i) ok = valid_char(model[i], i == 0);
  if (!ok) {
    return Status::InvalidArgument("invalid " + std::string(what) + " '" +
                                   std::string(model.substr(0, 160)) +
                                   "': must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  }
  return Status::Ok();
}

}  // namespace ckpt
