// The codec policy document: parsing, checking, rendering (codec_policy.h).
#include "ckpt/storage/codec_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/codec/tensor_patterns.h"

namespace ckpt {
namespace {

using nlohmann::json;

constexpr size_t kMaxPatternLength = 256;
constexpr double kMaxZeroBelowMean = 100;

Status Bad(std::string_view field, std::string_view message) {
  return Status::InvalidArgument("policy: '" + std::string(field) + "' " + std::string(message));
}

Status ParsePattern(const json& value, std::string_view field, std::string* out) {
  if (!value.is_string()) return Bad(field, "must be a string (a glob pattern)");
  *out = value.get<std::string>();
  if (out->empty() || out->size() > kMaxPatternLength) {
    return Bad(field, "must be a glob pattern of 1 to " + std::to_string(kMaxPatternLength) +
                          " characters");
  }
  return Status::Ok();
}

Status ParseQuantizer(const json& value, std::string_view field, Quantizer* out) {
  if (!value.is_string()) return Bad(field, "must be a string");
  const auto name = value.get<std::string>();
  auto q = QuantizerFromName(name);
  if (!q) {
    return Bad(field,
               "must be \"auto\", \"uniform\", \"exponent\", \"float\" or \"cosine\" (got \"" +
                   name + "\")");
  }
  *out = *q;
  return Status::Ok();
}

Status ParseBound(const json& value, std::string_view field, ErrorBound::Kind kind,
                  ErrorBound* out) {
  if (!value.is_number()) return Bad(field, "must be a number");
  const double v = value.get<double>();
  const double max = kind == ErrorBound::Kind::kRelative    ? 1.0
                     : kind == ErrorBound::Kind::kPointwise ? 0.5
                                                            : 1e300;
  if (!(v > 0) || !(v <= max) || !std::isfinite(v)) {
    return Bad(field, kind == ErrorBound::Kind::kRelative    ? "must be in (0, 1]"
                      : kind == ErrorBound::Kind::kPointwise ? "must be in (0, 0.5]"
                                                             : "must be a finite number > 0");
  }
  *out = ErrorBound{kind, v};
  return Status::Ok();
}

constexpr std::string_view kBoundFields[] = {"max_abs_error", "max_rel_error",
                                             "max_pointwise_rel_error"};
constexpr ErrorBound::Kind kBoundKinds[] = {
    ErrorBound::Kind::kAbsolute, ErrorBound::Kind::kRelative, ErrorBound::Kind::kPointwise};

bool IsBoundField(std::string_view key) {
  return std::find(std::begin(kBoundFields), std::end(kBoundFields), key) != std::end(kBoundFields);
}

// Reads max_abs_error / max_rel_error / max_pointwise_rel_error from `object` (at most one).
// Sets *out when present. `prefix` names the enclosing object ("" at the top level,
// "overrides[2]." in an override).
Status ParseBoundFields(const json& object, const std::string& prefix,
                        std::optional<ErrorBound>* out) {
  std::optional<size_t> found;
  for (size_t k = 0; k < std::size(kBoundFields); ++k) {
    if (!object.contains(std::string(kBoundFields[k]))) continue;
    if (found) {
      return Status::InvalidArgument("policy: give one of '" + prefix + "max_abs_error', '" +
                                     prefix + "max_rel_error' and '" + prefix +
                                     "max_pointwise_rel_error', not several");
    }
    found = k;
  }
  if (found) {
    ErrorBound b;
    const std::string field(kBoundFields[*found]);
    CKPT_RETURN_IF_ERROR(ParseBound(object[field], prefix + field, kBoundKinds[*found], &b));
    *out = b;
  }
  return Status::Ok();
}

// A pointwise bound is coded by the log quantizer only, and the log quantizer needs one.
Status CheckQuantizerFitsBound(const std::optional<ErrorBound>& bound, Quantizer quantizer,
                               const std::string& where) {
  if (!bound) return Status::Ok();
  const bool pointwise = bound->kind == ErrorBound::Kind::kPointwise;
  if (pointwise && quantizer != Quantizer::kAuto && quantizer != Quantizer::kLog) {
    return Bad(where + "quantizer", "must be \"auto\" or \"log\" with a pointwise bound (got \"" +
                                        std::string(QuantizerName(quantizer)) + "\")");
  }
  if (!pointwise && quantizer == Quantizer::kLog) {
    return Bad(where + "quantizer", "\"log\" needs 'max_pointwise_rel_error'");
  }
  return Status::Ok();
}

Result<TensorOverride> ParseOverride(const json& item, size_t index) {
  const std::string where = "overrides[" + std::to_string(index) + "]";
  if (!item.is_object()) return Bad(where, "must be an object");
  TensorOverride o;
  for (auto it = item.begin(); it != item.end(); ++it) {
    const std::string& key = it.key();
    if (key == "tensors") {
      CKPT_RETURN_IF_ERROR(ParsePattern(*it, where + ".tensors", &o.pattern));
    } else if (key == "lossless") {
      if (!it->is_boolean()) return Bad(where + ".lossless", "must be true or false");
      o.lossless = it->get<bool>();
    } else if (key == "quantizer") {
      Quantizer q;
      CKPT_RETURN_IF_ERROR(ParseQuantizer(*it, where + ".quantizer", &q));
      o.quantizer = q;
    } else if (key == "zero_below_mean") {
      if (!it->is_number()) return Bad(where + ".zero_below_mean", "must be a number");
      const double f = it->get<double>();
      if (!(f > 0 && f <= kMaxZeroBelowMean)) {
        return Bad(where + ".zero_below_mean", "must be in (0, 100]");
      }
      o.zero_below_mean = f;
    } else if (!IsBoundField(key)) {
      return Status::InvalidArgument("policy: unknown field '" + where + "." + key + "'");
    }
  }
  CKPT_RETURN_IF_ERROR(ParseBoundFields(item, where + ".", &o.bound));
  if (o.pattern.empty()) return Bad(where + ".tensors", "is required");
  if (!o.lossless && !o.bound && !o.quantizer && !o.zero_below_mean) {
    return Bad(where,
               "must set 'lossless', 'max_abs_error', 'max_rel_error', "
               "'max_pointwise_rel_error', 'quantizer' or 'zero_below_mean'");
  }
  if (o.lossless.value_or(false) && (o.bound || o.quantizer || o.zero_below_mean)) {
    return Bad(where, "cannot be lossless and set a bound, quantizer or zero_below_mean");
  }
  return o;
}

// "auto" or "E<e>M<m>" (e in 1..8, e + m <= 16); "auto" = E4 with the fewest mantissa bits
// that meet the bound.
Status ParseFloatFormat(const json& value, uint8_t* exponent_bits, uint8_t* mantissa_bits) {
  constexpr std::string_view kField = "float_format";
  if (!value.is_string()) return Bad(kField, "must be a string such as \"E4M3\" or \"auto\"");
  const auto text = value.get<std::string>();
  if (text == "auto") {
    *exponent_bits = 0;
    *mantissa_bits = 0;
    return Status::Ok();
  }
  unsigned e = 0, m = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "E%uM%u%c", &e, &m, &tail) != 2 || e < 1 || e > 8 || e + m > 16) {
    return Bad(kField, "must be \"auto\" or E<e>M<m> with 1 <= e <= 8 and e + m <= 16 (got \"" +
                           text + "\")");
  }
  *exponent_bits = static_cast<uint8_t>(e);
  *mantissa_bits = static_cast<uint8_t>(m);
  return Status::Ok();
}

json BoundJson(const ErrorBound& b, json& object) {
  for (size_t k = 0; k < std::size(kBoundKinds); ++k) {
    if (kBoundKinds[k] == b.kind) object[std::string(kBoundFields[k])] = b.value;
  }
  return object;
}

// The "full-state" preset: weights and every other float tensor within an absolute bound,
// Adam's moments by their own rules, measured by resuming training (docs/benchmarks.md, "The
// whole training state"). The patterns match the moments whatever prefix a trainer gives them.
void ApplyFullStatePreset(CodecPolicy* policy) {
  policy->mode = CodecMode::kLossy;
  policy->bound = ErrorBound{ErrorBound::Kind::kAbsolute, CodecPolicy::kFullStateWeightBound};
  policy->lossless_tensors = std::vector<std::string>{};
  TensorOverride first_moment;
  first_moment.pattern = "*exp_avg";
  first_moment.bound = ErrorBound{ErrorBound::Kind::kPointwise, 0.5};
  first_moment.zero_below_mean = 3;
  TensorOverride second_moment;
  second_moment.pattern = "*exp_avg_sq";
  second_moment.bound = ErrorBound{ErrorBound::Kind::kPointwise, 0.3};
  policy->overrides = {first_moment, second_moment};
}

}  // namespace

Result<CodecPolicy> CodecPolicy::FromJson(std::string_view text, const CodecPolicy& base) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidArgument("policy: body is not valid JSON");
  if (!doc.is_object()) return Status::InvalidArgument("policy: body must be a JSON object");
  CodecPolicy policy = base;
  // A preset sets its fields first; the document's other fields then change them, and its
  // overrides go before the preset's (the first matching override decides).
  std::vector<TensorOverride> preset_overrides;
  if (doc.contains("preset")) {
    const json& preset = doc["preset"];
    if (!preset.is_string() || preset.get<std::string>() != "full-state") {
      return Bad("preset", "must be \"full-state\"");
    }
    ApplyFullStatePreset(&policy);
    preset_overrides = policy.overrides;
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    if (key == "preset") continue;  // applied above
    if (key == "mode") {
      if (!it->is_string()) return Bad("mode", "must be a string");
      const auto mode = it->get<std::string>();
      if (mode == "lossless") {
        policy.mode = CodecMode::kLossless;
      } else if (mode == "lossy") {
        policy.mode = CodecMode::kLossy;
      } else {
        return Bad("mode", "must be \"lossless\" or \"lossy\" (got \"" + mode + "\")");
      }
    } else if (key == "keyframe_every") {
      if (!it->is_number_integer()) return Bad("keyframe_every", "must be an integer");
      const auto n = it->get<int64_t>();
      if (n < 0 || n > kMaxKeyframeEvery) {
        return Bad("keyframe_every", "must be in [1, " + std::to_string(kMaxKeyframeEvery) +
                                         "], or 0 for the mode's default (got " +
                                         std::to_string(n) + ")");
      }
      policy.keyframe_every = static_cast<uint32_t>(n);
    } else if (key == "keyframe_budget") {
      if (!it->is_number()) return Bad("keyframe_budget", "must be a number");
      const double budget = it->get<double>();
      if (!(budget >= 0 && budget <= 1e6)) return Bad("keyframe_budget", "must be in [0, 1e6]");
      policy.keyframe_budget = budget;
    } else if (key == "reclaimable") {
      if (!it->is_boolean()) return Bad("reclaimable", "must be true or false");
      policy.reclaimable = it->get<bool>();
    } else if (key == "low_rank") {
      if (!it->is_boolean()) return Bad("low_rank", "must be true or false");
      policy.low_rank = it->get<bool>();
    } else if (key == "fast_latest") {
      if (it->is_string() && it->get<std::string>() == "auto") {
        policy.fast_latest.reset();
      } else if (it->is_boolean()) {
        policy.fast_latest = it->get<bool>();
      } else {
        return Bad("fast_latest", "must be true, false or \"auto\"");
      }
    } else if (key == "quantizer") {
      CKPT_RETURN_IF_ERROR(ParseQuantizer(*it, "quantizer", &policy.quantizer));
    } else if (key == "float_format") {
      CKPT_RETURN_IF_ERROR(
          ParseFloatFormat(*it, &policy.float_exponent_bits, &policy.float_mantissa_bits));
    } else if (key == "lossless_tensors") {
      if (it->is_null()) {
        policy.lossless_tensors.reset();
        continue;
      }
      if (!it->is_array()) return Bad("lossless_tensors", "must be a list of glob patterns");
      if (it->size() > kMaxPatterns) {
        return Bad("lossless_tensors",
                   "has more than " + std::to_string(kMaxPatterns) + " entries");
      }
      std::vector<std::string> patterns(it->size());
      for (size_t i = 0; i < it->size(); ++i) {
        CKPT_RETURN_IF_ERROR(
            ParsePattern((*it)[i], "lossless_tensors[" + std::to_string(i) + "]", &patterns[i]));
      }
      policy.lossless_tensors = std::move(patterns);
    } else if (key == "overrides") {
      if (!it->is_array()) return Bad("overrides", "must be a list of objects");
      if (it->size() > kMaxPatterns) {
        return Bad("overrides", "has more than " + std::to_string(kMaxPatterns) + " entries");
      }
      policy.overrides.clear();
      for (size_t i = 0; i < it->size(); ++i) {
        CKPT_ASSIGN_OR_RETURN(TensorOverride o, ParseOverride((*it)[i], i));
        policy.overrides.push_back(std::move(o));
      }
      if (policy.overrides.size() + preset_overrides.size() > kMaxPatterns) {
        return Bad("overrides",
                   "has more than " + std::to_string(kMaxPatterns) + " entries with the preset's");
      }
      policy.overrides.insert(policy.overrides.end(), preset_overrides.begin(),
                              preset_overrides.end());
    } else if (!IsBoundField(key)) {
      return Status::InvalidArgument("policy: unknown field '" + key + "'");
    }
  }
  CKPT_RETURN_IF_ERROR(ParseBoundFields(doc, "", &policy.bound));
  if (policy.mode == CodecMode::kLossy && !policy.bound) {
    return Bad("mode",
               "\"lossy\" needs an error bound: set 'max_abs_error', 'max_rel_error' or "
               "'max_pointwise_rel_error'");
  }
  CKPT_RETURN_IF_ERROR(CheckQuantizerFitsBound(policy.bound, policy.quantizer, ""));
  if (policy.fast_latest.value_or(false) && !policy.reclaimable) {
    return Bad("fast_latest",
               "needs \"reclaimable\": true (an additive chain cannot be stored backwards)");
  }
  for (size_t i = 0; i < policy.overrides.size(); ++i) {
    const TensorOverride& o = policy.overrides[i];
    const std::string where = "overrides[" + std::to_string(i) + "]";
    if (!o.lossless.value_or(false) && !o.bound && !policy.bound) {
      return Bad(where, "quantizes tensors but neither it nor the policy sets an error bound");
    }
    if (!o.lossless.value_or(false)) {
      const std::optional<ErrorBound>& bound = o.bound ? o.bound : policy.bound;
      CKPT_RETURN_IF_ERROR(
          CheckQuantizerFitsBound(bound, o.quantizer.value_or(policy.quantizer), where + "."));
      if (o.zero_below_mean && bound->kind != ErrorBound::Kind::kPointwise) {
        return Bad(where + ".zero_below_mean", "needs 'max_pointwise_rel_error'");
      }
    }
  }
  return policy;
}

std::string CodecPolicy::ToJson() const {
  char format[16];  // "E<e>M<m>" (built with snprintf: GCC 12 -O3 misreports "E" + to_string)
  std::snprintf(format, sizeof format, "E%uM%u", unsigned{float_exponent_bits},
                unsigned{float_mantissa_bits});
  json doc = {
      {"mode", mode == CodecMode::kLossy ? "lossy" : "lossless"},
      {"keyframe_every", keyframe_every},
      {"keyframe_budget", keyframe_budget},
      {"reclaimable", reclaimable},
      {"low_rank", low_rank},
      {"fast_latest", fast_latest ? json(*fast_latest) : json("auto")},
      {"quantizer", std::string(QuantizerName(quantizer))},
      {"float_format", float_exponent_bits == 0 ? std::string("auto") : std::string(format)}};
  if (bound) BoundJson(*bound, doc);
  doc["lossless_tensors"] = lossless_tensors ? json(*lossless_tensors) : json(nullptr);
  json list = json::array();
  for (const TensorOverride& o : overrides) {
    json item = {{"tensors", o.pattern}};
    if (o.lossless) item["lossless"] = *o.lossless;
    if (o.bound) BoundJson(*o.bound, item);
    if (o.quantizer) item["quantizer"] = std::string(QuantizerName(*o.quantizer));
    if (o.zero_below_mean) item["zero_below_mean"] = *o.zero_below_mean;
    list.push_back(std::move(item));
  }
  doc["overrides"] = std::move(list);
  return doc.dump();
}

std::vector<std::string> CodecPolicy::Warnings() const {
  std::vector<std::string> out;
  if (mode != CodecMode::kLossless || !bound) return out;
  for (const TensorOverride& o : overrides) {
    if (!o.lossless.value_or(false) && !o.bound) return out;  // this override quantizes with it
  }
  json named;
  BoundJson(*bound, named);
  const std::string field = named.begin().key();
  out.push_back("'" + field + "' (" + named.begin().value().dump() +
                ") does nothing while 'mode' is \"lossless\": no tensor is quantized with it; "
                "set \"mode\":\"lossy\" to quantize float tensors within it");
  return out;
}

TensorCoding CodecPolicy::ForTensor(std::string_view name, DType dtype,
                                    const std::vector<uint64_t>& shape,
                                    bool larger_than_cache) const {
  TensorCoding lossless;
  // "auto" on an additive model (reclaimable false) keeps its coding: only the lattice reverses.
  const bool plain_lattice = fast_latest.value_or(larger_than_cache && reclaimable);
  if (!LossyCodecSupports(dtype)) return lossless;
  auto lossy = [&](const std::optional<ErrorBound>& b, const std::optional<Quantizer>& q,
                   double zero_below_mean) {
    TensorCoding c;
    c.lossy = true;
    c.lossy_options.zero_below_mean = zero_below_mean;
    c.standalone = zero_below_mean > 0;
    c.lossy_options.bound = b ? *b : *bound;
    c.lossy_options.quantizer = q ? *q : quantizer;
    if (c.lossy_options.bound.kind == ErrorBound::Kind::kPointwise) {
      c.lossy_options.quantizer = Quantizer::kLog;  // the only one for pointwise bounds
    }
    c.lossy_options.float_exponent_bits = float_exponent_bits;
    c.lossy_options.float_mantissa_bits = float_mantissa_bits;
    c.lossy_options.reclaimable = reclaimable;
    // The plain lattice: a reconstruction that depends on the pushed value alone, which is what
    // lets storage reverse a chain exactly.
    if (plain_lattice) c.lossy_options.history = false;
    if (low_rank && !plain_lattice && reclaimable && shape.size() == 2 && shape[1] > 0 &&
        shape[1] <= std::numeric_limits<uint32_t>::max()) {
      c.lossy_options.low_rank_columns = static_cast<uint32_t>(shape[1]);
    }
    return c;
  };
  for (const TensorOverride& o : overrides) {
    if (!TensorNameMatches(o.pattern, name)) continue;
    if (o.lossless.value_or(false)) return lossless;
    return lossy(o.bound, o.quantizer, o.zero_below_mean.value_or(0));
  }
  if (mode == CodecMode::kLossless) return lossless;
  if (lossless_tensors) {
    for (const std::string& p : *lossless_tensors) {
      if (TensorNameMatches(p, name)) return lossless;
    }
  } else if (shape.size() <= 1) {
    return lossless;
  }
  return lossy(std::nullopt, std::nullopt, 0);
}

}  // namespace ckpt
