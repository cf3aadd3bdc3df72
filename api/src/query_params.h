// Query strings: percent-decoding and iteration over key=value parameters. Internal to api/.
#pragma once

#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::api {

// Decodes %XX escapes and '+' (a space, as HTML forms and curl -G --data-urlencode send it).
Result<std::string> PercentDecode(std::string_view text);

// Calls `fn(key, value)` for each key=value of a query string, percent-decoded; stops at the
// first error `fn` returns.
template <typename Fn>
Status ForEachQueryParam(std::string_view query, Fn&& fn) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      CKPT_ASSIGN_OR_RETURN(std::string key, PercentDecode(item.substr(0, eq)));
      CKPT_ASSIGN_OR_RETURN(std::string value,
                            PercentDecode(eq == std::string_view::npos ? "" : item.substr(eq + 1)));
      CKPT_RETURN_IF_ERROR(fn(key, value));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return Status::Ok();
}

// True when the query string (after '?') has `key` set to 1 or true.
bool QueryFlag(std::string_view query, std::string_view key);

}  // namespace ckpt::api
