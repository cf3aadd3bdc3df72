// Query strings (query_strings.h).
#include "query_strings.h"

#include <cctype>
#include <cstdio>

namespace ckpt {

std::string QueryEscape(std::string_view text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string PushQuery(const PushMetadata& metadata) {
  std::string query;
  auto add = [&](const std::string& item) { query += (query.empty() ? "?" : "&") + item; };
  for (const auto& [name, value] : metadata.metrics) {
    char number[64];
    std::snprintf(number, sizeof number, "%.17g", value);
    add("metric." + QueryEscape(name) + "=" + number);
  }
  for (const auto& [name, value] : metadata.labels) {
    add("label." + QueryEscape(name) + "=" + QueryEscape(value));
  }
  for (const auto& tag : metadata.tags) add("tag=" + QueryEscape(tag));
  return query;
}

std::string PullQuery(const PullOptions& part) {
  std::string query;
  auto add = [&](const std::string& item) { query += (query.empty() ? "?" : "&") + item; };
  if (!part.tensors.empty()) {
    std::string list;
    for (const std::string& t : part.tensors) list += (list.empty() ? "" : ",") + t;
    add("tensors=" + QueryEscape(list));
  }
  if (part.ranks > 0) {
    add("rank=" + std::to_string(part.rank));
    add("of=" + std::to_string(part.ranks));
  }
  return query;
}

}  // namespace ckpt
