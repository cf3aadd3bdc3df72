// The query strings the client sends: escaping, a push's metrics, labels and tags, and the part
// of a version a pull asks for. Internal to client-lib.
#pragma once

#include <string>
#include <string_view>

#include "ckpt/client/client.h"

namespace ckpt {

// Percent-encodes a query parameter value (RFC 3986 unreserved characters stay).
std::string QueryEscape(std::string_view text);

// "?metric.<name>=…&label.<name>=…&tag=…" ("" when there is nothing to send).
std::string PushQuery(const PushMetadata& metadata);

// The query of a pull of part of a version ("" for the whole version).
std::string PullQuery(const PullOptions& part);

}  // namespace ckpt
