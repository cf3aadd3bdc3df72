// Server URLs as the client takes them (http(s)://HOST[:PORT]) and the targets of the redirects
// it follows. Internal to client-lib.
#pragma once

#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt {

struct ServerUrl {
  bool https = false;
  std::string host;
  std::string port;
  std::string target;  // with `with_target`: the path and query ("/" if none)
};

// http(s)://HOST[:PORT] (a server URL), or with `with_target` also a path: an absolute URL as a
// redirect's Location names it.
Result<ServerUrl> ParseServerUrl(std::string_view url, bool with_target);

// Writes to a model go through the daemon holding its lease (a cluster of daemons): others
// answer 307 with its URL, before any body is sent. Redirects are followed this many times.
inline constexpr int kMaxRedirects = 4;

// The endpoint a 307/308 response points to. Only the same scheme is followed (the TLS settings
// belong to it); the target must be the one requested.
Result<ServerUrl> RedirectTarget(bool https, std::string_view location,
                                 const std::string& requested_target);

}  // namespace ckpt
