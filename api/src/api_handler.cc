#include "ckpt/api/api_handler.h"

#include <ctime>
#include <nlohmann/json.hpp>

namespace ckpt::api {
namespace {

using nlohmann::json;

std::string Iso8601(int64_t ms) {
  std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[40];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

json VersionJson(const VersionInfo& v) {
  return {{"version", v.version},
          {"kind", v.kind},
          {"raw_bytes", v.raw_bytes},
          {"stored_bytes", v.stored_bytes},
          {"created_at", Iso8601(v.created_at_ms)},
          {"sha256", v.sha256},
          {"pushed_sha256", v.pushed_sha256},
          {"lossy", v.lossy},
          {"tensor_count", v.tensor_count}};
}

json DetailJson(const VersionDetail& d) {
  json out = VersionJson(d.info);
  json tensors = json::array();
  for (const TensorDetail& t : d.tensors) {
    json item = {{"name", t.name},
                 {"dtype", t.dtype},
                 {"shape", t.shape},
                 {"kind", t.kind},
                 {"codec", t.codec},
                 {"chain_length", t.chain_length},
                 {"raw_bytes", t.raw_bytes},
                 {"stored_bytes", t.stored_bytes},
                 {"bits_per_element", t.bits_per_element}};
    if (t.codec == "lossy") {
      item["quantizer"] = t.quantizer;
      // The log quantizer codes pointwise-relative bounds; every other one absolute bounds.
      item[t.quantizer == "log" ? "max_pointwise_rel_error" : "max_abs_error"] = t.bound;
      item["exact_elements"] = t.exact_elements;
      item["entropy_bits_per_element"] = t.entropy_bits_per_element;
    }
    tensors.push_back(std::move(item));
  }
  out["tensors"] = std::move(tensors);
  return out;
}

// True when the query string (after '?') has `key` set to 1 or true.
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

json ModelJson(const ModelInfo& m) {
  return {{"name", m.name},
          {"latest_version", m.latest_version ? json(*m.latest_version) : json(nullptr)},
          {"version_count", m.version_count},
          {"raw_bytes", m.raw_bytes},
          {"stored_bytes", m.stored_bytes},
          {"created_at", Iso8601(m.created_at_ms)}};
}

ApiResponse JsonResponse(int status, const json& body) {
  ApiResponse r;
  r.status = status;
  r.body = body.dump();
  r.body.push_back('\n');
  return r;
}

ApiResponse NoContent() {
  ApiResponse r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> parts;
  if (path.empty() || path.front() != '/') return parts;
  path.remove_prefix(1);
  while (true) {
    size_t slash = path.find('/');
    parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

}  // namespace

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

Route ApiHandler::Classify(std::string_view target) {
  const size_t query = target.find('?');
  const auto parts = SplitPath(target.substr(0, query));
  Route route;
  if (parts.size() == 1 && parts[0] == "healthz") {
    route.kind = RouteKind::kHealth;
  } else if (parts.size() >= 2 && parts[0] == "v1" && parts[1] == "models") {
    if (parts.size() == 2) {
      route.kind = RouteKind::kListModels;
    } else {
      route.model = std::string(parts[2]);
      if (parts.size() == 3) {
        route.kind = RouteKind::kModel;
      } else if (parts.size() == 4 && parts[3] == "versions") {
        route.kind = RouteKind::kListVersions;
      } else if (parts.size() == 4 && parts[3] == "policy") {
        route.kind = RouteKind::kPolicy;
      } else if (parts.size() == 5 && parts[3] == "versions") {
        route.kind = RouteKind::kVersion;
        route.version = std::string(parts[4]);
        route.detail =
            query != std::string_view::npos && QueryFlag(target.substr(query + 1), "detail");
      }
    }
  }
  return route;
}

RequestPlan ApiHandler::Plan(std::string_view method, const Route& route) {
  if (route.kind == RouteKind::kVersion) {
    if (method == "PUT") return RequestPlan::kPush;
    if ((method == "GET" && !route.detail) || method == "HEAD") return RequestPlan::kRestore;
  }
  return RequestPlan::kSimple;
}

int ApiHandler::HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
    case StatusCode::kIoError:
      return 500;
  }
  return 500;
}

ApiResponse ApiHandler::ErrorResponse(const Status& status) {
  return JsonResponse(
      HttpStatusFor(status.code()),
      {{"error",
        {{"code", std::string(StatusCodeName(status.code()))}, {"message", status.message()}}}});
}

ApiResponse ApiHandler::MethodNotAllowed(std::string_view method, std::string_view allowed) {
  ApiResponse r = JsonResponse(
      405, {{"error",
             {{"code", "METHOD_NOT_ALLOWED"},
              {"message", "method " + std::string(method) +
                              " is not allowed here; allowed: " + std::string(allowed)}}}});
  r.headers.emplace_back("Allow", std::string(allowed));
  return r;
}

ApiResponse ApiHandler::Handle(std::string_view method, const Route& route, std::string_view body) {
  switch (route.kind) {
    case RouteKind::kUnknown:
      return ErrorResponse(Status::NotFound("no such endpoint"));
    case RouteKind::kHealth:
      if (method != "GET" && method != "HEAD") return MethodNotAllowed(method, "GET, HEAD");
      return JsonResponse(200, {{"status", "ok"}});
    case RouteKind::kListModels: {
      if (method != "GET") return MethodNotAllowed(method, "GET");
      auto models = store_->ListModels();
      if (!models.ok()) return ErrorResponse(models.status());
      json list = json::array();
      for (const auto& m : *models) list.push_back(ModelJson(m));
      return JsonResponse(200, {{"models", list}});
    }
    case RouteKind::kModel: {
      if (method == "GET") {
        auto model = store_->GetModel(route.model);
        if (!model.ok()) return ErrorResponse(model.status());
        return JsonResponse(200, ModelJson(*model));
      }
      if (method == "DELETE") {
        Status s = store_->DeleteModel(route.model);
        return s.ok() ? NoContent() : ErrorResponse(s);
      }
      return MethodNotAllowed(method, "GET, DELETE");
    }
    case RouteKind::kListVersions: {
      if (method != "GET") return MethodNotAllowed(method, "GET");
      auto versions = store_->ListVersions(route.model);
      if (!versions.ok()) return ErrorResponse(versions.status());
      json list = json::array();
      for (const auto& v : *versions) list.push_back(VersionJson(v));
      return JsonResponse(200, {{"model", route.model}, {"versions", list}});
    }
    case RouteKind::kVersion: {
      if (method == "GET" && route.detail) {
        std::optional<uint64_t> number;
        if (route.version != "latest") {
          auto parsed = ParseVersionNumber(route.version);
          if (!parsed.ok()) return ErrorResponse(parsed.status());
          number = *parsed;
        }
        auto detail = store_->GetVersionDetail(route.model, number);
        if (!detail.ok()) return ErrorResponse(detail.status());
        return JsonResponse(200, DetailJson(*detail));
      }
      if (method != "DELETE") return MethodNotAllowed(method, "PUT, GET, HEAD, DELETE");
      auto version = ParseVersionNumber(route.version);
      if (!version.ok()) return ErrorResponse(version.status());
      Status s = store_->DeleteVersion(route.model, *version);
      return s.ok() ? NoContent() : ErrorResponse(s);
    }
    case RouteKind::kPolicy: {
      if (method == "GET") {
        auto policy = store_->GetPolicy(route.model);
        if (!policy.ok()) return ErrorResponse(policy.status());
        return JsonResponse(200, json::parse(policy->ToJson()));
      }
      if (method == "PUT") {
        Status name = ValidateModelName(route.model);
        if (!name.ok()) return ErrorResponse(name);
        auto current = store_->GetPolicy(route.model);
        CodecPolicy base;
        if (current.ok()) {
          base = *current;
        } else if (current.status().code() != StatusCode::kNotFound) {
          return ErrorResponse(current.status());
        }
        auto policy = CodecPolicy::FromJson(body, base);
        if (!policy.ok()) return ErrorResponse(policy.status());
        Status s = store_->SetPolicy(route.model, *policy);
        if (!s.ok()) return ErrorResponse(s);
        return JsonResponse(200, json::parse(policy->ToJson()));
      }
      return MethodNotAllowed(method, "GET, PUT");
    }
  }
  return ErrorResponse(Status::Internal("unhandled route"));
}

Result<std::unique_ptr<PushSession>> ApiHandler::BeginPush(const Route& route,
                                                           std::optional<uint64_t> content_length) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(route.model));
  if (route.version == "latest") {
    return Status::InvalidArgument("'latest' cannot be pushed; PUT needs a version number");
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t version, ParseVersionNumber(route.version));
  return store_->BeginPush(route.model, version, content_length);
}

ApiResponse ApiHandler::FinishPush(PushSession& session) {
  auto info = session.Commit();
  if (!info.ok()) return ErrorResponse(info.status());
  json body = VersionJson(*info);
  body["model"] = info->model;
  ApiResponse r = JsonResponse(201, body);
  r.headers.emplace_back(
      "Location", "/v1/models/" + info->model + "/versions/" + std::to_string(info->version));
  return r;
}

Result<std::unique_ptr<RestoreStream>> ApiHandler::OpenRestore(const Route& route) {
  CKPT_RETURN_IF_ERROR(ValidateModelName(route.model));
  std::optional<uint64_t> version;
  if (route.version != "latest") {
    CKPT_ASSIGN_OR_RETURN(version, ParseVersionNumber(route.version));
  }
  return store_->OpenRestore(route.model, version);
}

std::vector<std::pair<std::string, std::string>> ApiHandler::RestoreHeaders(
    const VersionInfo& info) {
  return {{"X-Ckpt-Model", info.model},
          {"X-Ckpt-Version", std::to_string(info.version)},
          {"X-Ckpt-Sha256", info.sha256},
          {"ETag", "\"" + info.sha256 + "\""}};
}

}  // namespace ckpt::api
