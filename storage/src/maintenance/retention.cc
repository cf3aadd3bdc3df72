#include "ckpt/storage/retention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/codec/tensor_patterns.h"

namespace ckpt {
namespace {

using nlohmann::json;

Status Bad(std::string_view field, std::string_view message) {
  return Status::InvalidArgument("retention: '" + std::string(field) + "' " + std::string(message));
}

Status ParseCount(const json& value, std::string_view field, uint64_t* out) {
  if (!value.is_number_integer() || value.get<int64_t>() < 1) {
    return Bad(field, "must be an integer >= 1");
  }
  *out = value.get<uint64_t>();
  return Status::Ok();
}

std::string FormatDuration(int64_t ms) {
  struct Unit {
    const char* suffix;
    int64_t ms;
  };
  for (const Unit& u : {Unit{"w", 604800000}, Unit{"d", 86400000}, Unit{"h", 3600000},
                        Unit{"m", 60000}, Unit{"s", 1000}}) {
    if (ms % u.ms == 0) return std::to_string(ms / u.ms) + u.suffix;
  }
  return std::to_string(ms / 1000) + "s";
}

Status ParseWithin(const json& value, std::string_view field, int64_t* out) {
  if (!value.is_string()) return Bad(field, "must be a duration string such as \"72h\"");
  auto ms = ParseDurationMs(value.get<std::string>());
  if (!ms.ok()) return Bad(field, ms.status().message());
  *out = *ms;
  return Status::Ok();
}

Status ParseTensorRules(const json& value, std::vector<RetentionPolicy::TensorRule>* out) {
  if (!value.is_array() || value.empty() || value.size() > RetentionPolicy::kMaxTensorRules) {
    return Bad("tensor_rules", "must be a list of 1 to " +
                                   std::to_string(RetentionPolicy::kMaxTensorRules) +
                                   " objects {\"tensors\": GLOBS, \"keep_last\": N, ...}");
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string where = "tensor_rules[" + std::to_string(i) + "]";
    const json& item = value[i];
    if (!item.is_object()) return Bad(where, "must be an object");
    RetentionPolicy::TensorRule rule;
    for (auto f = item.begin(); f != item.end(); ++f) {
      const std::string field = where + "." + f.key();
      if (f.key() == "tensors") {
        const json list = f.value().is_string() ? json::array({f.value()}) : f.value();
        if (!list.is_array() || list.empty() || list.size() > 16) {
          return Bad(field, "must be a glob or a list of 1 to 16 globs");
        }
        for (const json& g : list) {
          if (!g.is_string() || g.get<std::string>().empty() || g.get<std::string>().size() > 256) {
            return Bad(field, "must hold globs of 1 to 256 characters");
          }
          rule.patterns.push_back(g.get<std::string>());
        }
      } else if (f.key() == "keep_last") {
        CKPT_RETURN_IF_ERROR(ParseCount(f.value(), field, &rule.keep_last.emplace()));
      } else if (f.key() == "keep_every") {
        CKPT_RETURN_IF_ERROR(ParseCount(f.value(), field, &rule.keep_every.emplace()));
      } else if (f.key() == "keep_within") {
        CKPT_RETURN_IF_ERROR(ParseWithin(f.value(), field, &rule.keep_within_ms.emplace()));
      } else {
        return Bad(field, "is not a known field (tensors, keep_last, keep_every, keep_within)");
      }
    }
    if (rule.patterns.empty()) return Bad(where + ".tensors", "is required");
    if (!rule.keep_last && !rule.keep_every && !rule.keep_within_ms) {
      return Bad(where, "needs keep_last, keep_every or keep_within");
    }
    out->push_back(std::move(rule));
  }
  return Status::Ok();
}

}  // namespace

Result<int64_t> ParseDurationMs(std::string_view text) {
  if (text.size() < 2) {
    return Status::InvalidArgument("duration '" + std::string(text) +
                                   "' must be a number followed by s, m, h, d or w");
  }
  int64_t unit_ms = 0;
  switch (text.back()) {
    case 's':
      unit_ms = 1000;
      break;
    case 'm':
      unit_ms = 60'000;
      break;
    case 'h':
      unit_ms = 3'600'000;
      break;
    case 'd':
      unit_ms = 86'400'000;
      break;
    case 'w':
      unit_ms = 604'800'000;
      break;
    default:
      return Status::InvalidArgument("duration '" + std::string(text) +
                                     "' must end with s, m, h, d or w");
  }
  const std::string_view digits = text.substr(0, text.size() - 1);
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      return Status::InvalidArgument("duration '" + std::string(text) +
                                     "' must be a whole number followed by s, m, h, d or w");
    }
    if (n > std::numeric_limits<int64_t>::max() / 10 / unit_ms) {
      return Status::InvalidArgument("duration '" + std::string(text) + "' is too long");
    }
    n = n * 10 + (c - '0');
  }
  if (n == 0) return Status::InvalidArgument("duration '" + std::string(text) + "' must be > 0");
  return n * unit_ms;
}

Result<RetentionPolicy> RetentionPolicy::FromJson(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument("retention: body must be a JSON object");
  }
  RetentionPolicy p;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    const json& value = it.value();
    if (key == "keep_last") {
      CKPT_RETURN_IF_ERROR(ParseCount(value, key, &p.keep_last.emplace()));
    } else if (key == "keep_every") {
      CKPT_RETURN_IF_ERROR(ParseCount(value, key, &p.keep_every.emplace()));
    } else if (key == "max_bytes") {
      CKPT_RETURN_IF_ERROR(ParseCount(value, key, &p.max_bytes.emplace()));
    } else if (key == "keep_within") {
      CKPT_RETURN_IF_ERROR(ParseWithin(value, key, &p.keep_within_ms.emplace()));
    } else if (key == "keep_best") {
      if (!value.is_object()) {
        return Bad(key,
                   "must be an object {\"count\": N, \"metric\": NAME, \"mode\": "
                   "\"min\"|\"max\"}");
      }
      KeepBest best;
      for (auto f = value.begin(); f != value.end(); ++f) {
        const std::string field = "keep_best." + f.key();
        if (f.key() == "count") {
          CKPT_RETURN_IF_ERROR(ParseCount(f.value(), field, &best.count));
        } else if (f.key() == "metric") {
          if (!f.value().is_string() || f.value().get<std::string>().empty() ||
              f.value().get<std::string>().size() > 128) {
            return Bad(field, "must be a metric name of 1 to 128 characters");
          }
          best.metric = f.value().get<std::string>();
        } else if (f.key() == "mode") {
          if (f.value() == "min") {
            best.maximize = false;
          } else if (f.value() == "max") {
            best.maximize = true;
          } else {
            return Bad(field, "must be \"min\" or \"max\"");
          }
        } else {
          return Bad(field, "is not a known field (count, metric, mode)");
        }
      }
      if (best.count == 0) return Bad("keep_best.count", "is required");
      if (best.metric.empty()) return Bad("keep_best.metric", "is required");
      p.keep_best = best;
    } else if (key == "tensor_rules") {
      CKPT_RETURN_IF_ERROR(ParseTensorRules(value, &p.tensor_rules));
    } else {
      return Bad(key,
                 "is not a known field (keep_last, keep_every, keep_within, keep_best, "
                 "max_bytes, tensor_rules)");
    }
  }
  return p;
}

std::string RetentionPolicy::ToJson() const {
  json doc = json::object();
  if (keep_last) doc["keep_last"] = *keep_last;
  if (keep_every) doc["keep_every"] = *keep_every;
  if (keep_within_ms) doc["keep_within"] = FormatDuration(*keep_within_ms);
  if (keep_best) {
    doc["keep_best"] = {{"count", keep_best->count},
                        {"metric", keep_best->metric},
                        {"mode", keep_best->maximize ? "max" : "min"}};
  }
  if (max_bytes) doc["max_bytes"] = *max_bytes;
  if (!tensor_rules.empty()) {
    json rules = json::array();
    for (const TensorRule& r : tensor_rules) {
      json item = {{"tensors", r.patterns}};
      if (r.keep_last) item["keep_last"] = *r.keep_last;
      if (r.keep_every) item["keep_every"] = *r.keep_every;
      if (r.keep_within_ms) item["keep_within"] = FormatDuration(*r.keep_within_ms);
      rules.push_back(std::move(item));
    }
    doc["tensor_rules"] = std::move(rules);
  }
  return doc.dump();
}

std::optional<size_t> RetentionPolicy::RuleFor(std::string_view name) const {
  for (size_t i = 0; i < tensor_rules.size(); ++i) {
    if (FirstMatchingPattern(tensor_rules[i].patterns, name) >= 0) return i;
  }
  return std::nullopt;
}

bool RetentionPolicy::DropsTensor(const RetentionDecision& decision, std::string_view name) const {
  const std::optional<size_t> rule = RuleFor(name);
  return rule && std::find(decision.dropping_rules.begin(), decision.dropping_rules.end(), *rule) !=
                     decision.dropping_rules.end();
}

std::optional<uint64_t> RetentionPolicy::ChainLimitFor(std::string_view name) const {
  const std::optional<size_t> rule = RuleFor(name);
  return rule ? tensor_rules[*rule].keep_last : std::nullopt;
}

bool RetentionPolicy::KeepsEverything() const {
  return !keep_last && !keep_every && !keep_within_ms && !keep_best && !max_bytes;
}

std::vector<RetentionDecision> RetentionPolicy::Evaluate(std::vector<RetentionCandidate> versions,
                                                         int64_t now_ms) const {
  std::sort(versions.begin(), versions.end(),
            [](const auto& a, const auto& b) { return a.version < b.version; });
  std::vector<RetentionDecision> out(versions.size());
  for (size_t i = 0; i < versions.size(); ++i) out[i].version = versions[i].version;
  if (versions.empty()) return out;
  auto keep = [&](size_t i, std::string reason) { out[i].kept_by.push_back(std::move(reason)); };

  keep(versions.size() - 1, "latest");
  for (size_t i = 0; i < versions.size(); ++i) {
    for (const std::string& tag : versions[i].tags) keep(i, "tag:" + tag);
  }
  if (KeepsEverything()) {
    for (auto& d : out) {
      if (d.kept_by.empty()) d.kept_by.push_back("no_policy");
    }
    DecideTensorRules(versions, now_ms, out);
    return out;
  }
  if (keep_last) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(*keep_last, versions.size()));
    for (size_t i = versions.size() - n; i < versions.size(); ++i) keep(i, "keep_last");
  }
  if (keep_every) {
    for (size_t i = 0; i < versions.size(); ++i) {
      if (versions[i].version % *keep_every == 0) keep(i, "keep_every");
    }
  }
  if (keep_within_ms) {
    for (size_t i = 0; i < versions.size(); ++i) {
      if (versions[i].created_at_ms >= now_ms - *keep_within_ms) keep(i, "keep_within");
    }
  }
  if (keep_best) {
    std::vector<std::pair<double, size_t>> scored;
    for (size_t i = 0; i < versions.size(); ++i) {
      auto m = versions[i].metrics.find(keep_best->metric);
      if (m == versions[i].metrics.end() || std::isnan(m->second)) continue;
      scored.emplace_back(keep_best->maximize ? -m->second : m->second, i);
    }
    // Ties go to the newer version: it is the one a resumed run would rather have.
    std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    for (size_t k = 0; k < scored.size() && k < keep_best->count; ++k) {
      keep(scored[k].second, "keep_best");
    }
  }
  if (max_bytes) {
    uint64_t used = 0;
    for (size_t i = 0; i < versions.size(); ++i) {
      if (!out[i].kept_by.empty()) used += versions[i].stored_bytes;
    }
    for (size_t i = versions.size(); i-- > 0;) {
      if (!out[i].kept_by.empty()) continue;
      if (used + versions[i].stored_bytes > *max_bytes) break;  // older ones go first
      used += versions[i].stored_bytes;
      keep(i, "max_bytes");
    }
  }
  for (auto& d : out) d.keep = !d.kept_by.empty();
  DecideTensorRules(versions, now_ms, out);
  return out;
}

void RetentionPolicy::DecideTensorRules(const std::vector<RetentionCandidate>& versions,
                                        int64_t now_ms, std::vector<RetentionDecision>& out) const {
  for (size_t r = 0; r < tensor_rules.size(); ++r) {
    const TensorRule& rule = tensor_rules[r];
    const size_t newest =
        rule.keep_last ? static_cast<size_t>(std::min<uint64_t>(*rule.keep_last, versions.size()))
                       : 0;
    for (size_t i = 0; i < versions.size(); ++i) {
      if (!out[i].keep) continue;
      const bool kept =
          i + 1 == versions.size() || !versions[i].tags.empty() || i + newest >= versions.size() ||
          (rule.keep_every && versions[i].version % *rule.keep_every == 0) ||
          (rule.keep_within_ms && versions[i].created_at_ms >= now_ms - *rule.keep_within_ms);
      if (!kept) out[i].dropping_rules.push_back(r);
    }
  }
}

}  // namespace ckpt
