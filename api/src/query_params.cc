// The query parameters of pushes, restores and the Hugging Face view, and the parsing they
// share (query_params.h, api_handler.h).
#include "query_params.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/api/api_handler.h"

namespace ckpt::api {

Result<std::string> PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] != '%') {
      out.push_back(text[i]);
    } else if (i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
      i += 2;
    } else {
      return Status::InvalidArgument("malformed percent-escape in '" +
                                     std::string(text.substr(0, 200)) + "'");
    }
  }
  return out;
}

bool QueryFlag(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == key) {
      const std::string_view value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
      return value == "1" || value == "true";
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

namespace {

// ParsePushQuery, handing parameters it does not know to `extra` (which returns false for
// those it does not know either).
Result<PushOptions> ParsePushParams(
    std::string_view query,
    const std::function<Result<bool>(const std::string&, const std::string&)>& extra,
    std::string_view allowed) {
  PushOptions options;
  CKPT_RETURN_IF_ERROR(
      ForEachQueryParam(query, [&](const std::string& key, const std::string& value) -> Status {
        if (key.starts_with("metric.")) {
          char* end = nullptr;
          const double number = std::strtod(value.c_str(), &end);
          if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(number)) {
            return Status::InvalidArgument("query parameter '" + key +
                                           "' must be a finite number, got '" + value + "'");
          }
          options.metrics[key.substr(7)] = number;
        } else if (key.starts_with("label.")) {
          options.labels[key.substr(6)] = value;
        } else if (key == "tag") {
          options.tags.push_back(value);
        } else {
          bool known = false;
          if (extra) {
            CKPT_ASSIGN_OR_RETURN(known, extra(key, value));
          }
          if (!known) {
            return Status::InvalidArgument("unknown query parameter '" + key + "' on a push " +
                                           "(allowed: " + std::string(allowed) + ")");
          }
        }
        return Status::Ok();
      }));
  return options;
}

// A decimal u32 query value.
Result<uint32_t> ParseU32Param(const std::string& key, const std::string& value) {
  auto number = ParseVersionNumber(value);
  if (!number.ok() || *number > UINT32_MAX) {
    return Status::InvalidArgument("query parameter '" + key +
                                   "' must be a decimal 32-bit unsigned integer, got '" + value +
                                   "'");
  }
  return static_cast<uint32_t>(*number);
}

// Comma-separated decimal dimensions ("0,128"); empty text is a rank-0 list.
Result<std::vector<uint64_t>> ParseDims(const std::string& key, const std::string& value) {
  std::vector<uint64_t> dims;
  std::string_view rest = value;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    auto number = ParseVersionNumber(rest.substr(0, comma));
    if (!number.ok()) {
      return Status::InvalidArgument("query parameter '" + key +
                                     "' must be comma-separated decimal integers, got '" + value +
                                     "'");
    }
    dims.push_back(*number);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return dims;
}

}  // namespace

Result<PushOptions> ParsePushQuery(std::string_view query) {
  return ParsePushParams(query, nullptr, "metric.<name>, label.<name>, tag");
}

Result<std::pair<uint32_t, PushOptions>> ParseShardQuery(std::string_view query) {
  std::optional<uint32_t> of;
  CKPT_ASSIGN_OR_RETURN(PushOptions options,
                        ParsePushParams(
                            query,
                            [&](const std::string& key, const std::string& value) -> Result<bool> {
                              if (key != "of") return false;
                              CKPT_ASSIGN_OR_RETURN(of, ParseU32Param(key, value));
                              return true;
                            },
                            "of, metric.<name>, label.<name>, tag"));
  if (!of) {
    return Status::InvalidArgument(
        "a shard push needs the shard count: PUT .../shards/{shard}?of=<N>");
  }
  return std::make_pair(*of, std::move(options));
}

Result<uint64_t> ParseHfQuery(std::string_view query, uint64_t default_bytes) {
  uint64_t max_file_bytes = default_bytes;
  CKPT_RETURN_IF_ERROR(
      ForEachQueryParam(query, [&](const std::string& key, const std::string& value) -> Status {
        if (key != "max_shard_bytes") {
          return Status::InvalidArgument("unknown query parameter '" + key +
                                         "' on the Hugging Face view (allowed: max_shard_bytes)");
        }
        auto n = ParseVersionNumber(value);
        if (!n.ok() || *n == 0) {
          return Status::InvalidArgument("max_shard_bytes must be a positive decimal integer");
        }
        max_file_bytes = *n;
        return Status::Ok();
      }));
  return max_file_bytes;
}

Result<RestoreSelection> ParseRestoreQuery(std::string_view query, std::optional<uint64_t>* since) {
  RestoreSelection selection;
  std::optional<uint32_t> rank, ranks;
  std::optional<std::string> tensor;
  std::optional<std::vector<uint64_t>> offsets, shape;
  CKPT_RETURN_IF_ERROR(
      ForEachQueryParam(query, [&](const std::string& key, const std::string& value) -> Status {
        if (key == "tensors") {
          std::string_view rest = value;
          while (true) {
            const size_t comma = rest.find(',');
            if (comma != 0 && !rest.substr(0, comma).empty()) {
              selection.tensors.emplace_back(rest.substr(0, comma));
            }
            if (comma == std::string_view::npos) break;
            rest.remove_prefix(comma + 1);
          }
        } else if (key == "rank") {
          CKPT_ASSIGN_OR_RETURN(rank, ParseU32Param(key, value));
        } else if (key == "of") {
          CKPT_ASSIGN_OR_RETURN(ranks, ParseU32Param(key, value));
        } else if (key == "tensor") {
          tensor = value;
        } else if (key == "offsets") {
          CKPT_ASSIGN_OR_RETURN(offsets, ParseDims(key, value));
        } else if (key == "shape") {
          CKPT_ASSIGN_OR_RETURN(shape, ParseDims(key, value));
        } else if (key == "since" && since != nullptr) {
          CKPT_ASSIGN_OR_RETURN(*since, ParseVersionNumber(value));
        } else if (key != "detail" && key != "layout") {
          return Status::InvalidArgument(
              "unknown query parameter '" + key.substr(0, 40) +
              "' on a restore (allowed: tensors, rank and of, tensor with offsets and shape, " +
              (since != nullptr ? "since" : "detail, layout") + ")");
        }
        return Status::Ok();
      }));
  if (rank.has_value() != ranks.has_value()) {
    return Status::InvalidArgument("a resharded restore needs both rank=<i> and of=<M>");
  }
  if (ranks) {
    if (*ranks == 0 || *rank >= *ranks) {
      return Status::InvalidArgument("rank " + std::to_string(*rank) +
                                     " is out of range for of=" + std::to_string(*ranks));
    }
    selection.rank = *rank;
    selection.ranks = *ranks;
  }
  if (tensor || offsets || shape) {
    if (!tensor || !offsets || !shape) {
      return Status::InvalidArgument(
          "a slice restore needs tensor=<name>, offsets=<a,b,...> and shape=<c,d,...>");
    }
    if (ranks || !selection.tensors.empty()) {
      return Status::InvalidArgument(
          "a slice restore (tensor=) cannot be combined with tensors= or rank=/of=");
    }
    selection.box = std::make_pair(*tensor, TensorBox{*offsets, *shape});
  }
  return selection;
}

Result<uint64_t> ParseVersionNumber(std::string_view text) {
  if (text.empty() || text.size() > 20) {
    return Status::InvalidArgument("version must be a decimal unsigned 64-bit integer");
  }
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9' || __builtin_mul_overflow(v, 10, &v) ||
        __builtin_add_overflow(v, c - '0', &v)) {
      return Status::InvalidArgument("version '" + std::string(text) +
                                     "' is not a decimal unsigned 64-bit integer");
    }
  }
  return v;
}

}  // namespace ckpt::api
