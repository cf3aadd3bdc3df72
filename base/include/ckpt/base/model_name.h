// The model-name rule shared by the daemon and its clients.
#pragma once

#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt {

// Model names: [A-Za-z0-9][A-Za-z0-9._-]{0,127}. Returns InvalidArgument explaining the rule.
Status ValidateModelName(std::string_view model);

// The same rule for other names (tags, metric and label names); `what` names the kind in the
// message ("tag", "metric name", ...).
Status ValidateName(std::string_view what, std::string_view name);

}  // namespace ckpt
