// Server URLs and redirect targets (server_url.h).
#include "server_url.h"

namespace ckpt {

Result<ServerUrl> ParseServerUrl(std::string_view url, bool with_target) {
  const std::string text(url);
  constexpr std::string_view kHttp = "http://", kHttps = "https://";
  ServerUrl out;
  out.https = url.substr(0, kHttps.size()) == kHttps;
  if (!out.https && url.substr(0, kHttp.size()) != kHttp) {
    return Status::InvalidArgument("server URL '" + text + "' must start with http:// or https://");
  }
  url.remove_prefix(out.https ? kHttps.size() : kHttp.size());
  if (with_target) {
    const size_t slash = url.find('/');
    out.target = slash == std::string_view::npos ? "/" : std::string(url.substr(slash));
    url = url.substr(0, slash);
  }
  while (!url.empty() && url.back() == '/') url.remove_suffix(1);
  if (url.find('/') != std::string_view::npos) {
    return Status::InvalidArgument("server URL '" + text + "' must not have a path");
  }
  out.host = std::string(url);
  out.port = out.https ? "443" : "80";
  const size_t colon = url.rfind(':');
  if (colon != std::string_view::npos && url.find(']', colon) == std::string_view::npos) {
    out.host = std::string(url.substr(0, colon));
    out.port = std::string(url.substr(colon + 1));
  }
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  if (out.host.empty() || out.port.empty() ||
      out.port.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("server URL '" + text + "' must be http://HOST:PORT");
  }
  return out;
}

Result<ServerUrl> RedirectTarget(bool https, std::string_view location,
                                 const std::string& requested_target) {
  CKPT_ASSIGN_OR_RETURN(ServerUrl to, ParseServerUrl(location, true));
  if (to.https != https) {
    return Status::FailedPrecondition("server redirected to '" + std::string(location) +
                                      "', which changes the scheme; not followed");
  }
  if (to.target != requested_target) {
    return Status::FailedPrecondition("server redirected to '" + std::string(location) +
                                      "', another resource; not followed");
  }
  return to;
}

}  // namespace ckpt
