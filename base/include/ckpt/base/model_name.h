// The model-name rule shared by the daemon and its clients.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "ckpt/base/status.h"

namespace ckpt {

// Model names: [A-Za-z0-9][A-Za-z0-9._-]{0,127}. Returns InvalidArgument explaining the rule.
Status ValidateModelName(std::string_view model);

// A model name known to follow the rule: only Parse makes one, so a function that takes a
// ModelName never checks the name again. The store's front parses each name it is given once;
// the layers below it take ModelName. A value; safe to copy and share between threads.
class ModelName {
 public:
  static Result<ModelName> Parse(std::string_view name);

  const std::string& str() const { return name_; }
  // Reads as the name it holds wherever a name is only looked at.
  operator std::string_view() const { return name_; }  // NOLINT: implicit by design

  friend bool operator==(const ModelName&, const ModelName&) = default;

 private:
  explicit ModelName(std::string name) : name_(std::move(name)) {}

  std::string name_;
};

// The same rule for other names (tags, metric and label names); `what` names the kind in the
// message ("tag", "metric name", ...).
Status ValidateName(std::string_view what, std::string_view name);

}  // namespace ckpt
