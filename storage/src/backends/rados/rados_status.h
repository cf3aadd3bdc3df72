// FromRados: a librados return code (a negative errno) as a Status. Internal to storage/.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <system_error>

#include "ckpt/base/status.h"

namespace ckpt {

inline Status FromRados(int r, std::string_view what) {
  if (r >= 0) return Status::Ok();
  std::string message =
      "rados: " + std::string(what) + ": " + std::error_code(-r, std::generic_category()).message();
  if (r == -ENOENT) return Status::NotFound(std::move(message));
  return Status::IoError(std::move(message));
}

}  // namespace ckpt
