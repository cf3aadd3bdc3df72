// The route table and what is derived from it (routes.h).
#include "ckpt/api/routes.h"

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "hf_view.h"
#include "query_params.h"

namespace ckpt::api {
namespace {

using A = RouteAccess;
using K = RouteKind;

// clang-format off
constexpr std::array<RouteSpec, 22> kRoutes = {{
  // kind              name             pattern                                              methods                    access                admin  redir  in     out
  {K::kVersion,      "version",       "/v1/models/{model}/versions/{version}",              "PUT, GET, HEAD, DELETE", A::kByMethod,          false, true,  true,  true},
  {K::kPlan,         "plan",          "/v1/models/{model}/versions/{version}/plan",         "POST",                   A::kByMethod,          false, true,  false, false},
  {K::kShard,        "shard",         "/v1/models/{model}/versions/{version}/shards/{shard}", "PUT",                  A::kByMethod,          false, false, true,  false},
  {K::kShardPlan,    "shard_plan",    "/v1/models/{model}/versions/{version}/shards/{shard}/plan", "POST",             A::kByMethod,          false, false, false, false},
  {K::kUpload,       "upload",        "/v1/models/{model}/versions/{version}/shards",       "GET, DELETE",            A::kByMethod,          false, true,  false, false},
  {K::kUploadCommit, "upload_commit", "/v1/models/{model}/versions/{version}/shards:commit", "POST",                 A::kByMethod,          false, true,  false, false},
  {K::kHfFile,       "hf",            "/v1/models/{model}/versions/{version}/hf/{file}",    "GET, HEAD",              A::kByMethod,          false, false, false, true},
  {K::kVersionTag,   "version_tag",   "/v1/models/{model}/versions/{version}/tags/{tag}",   "PUT, DELETE",            A::kByMethod,          false, true,  false, false},
  {K::kRetention,    "retention",     "/v1/models/{model}/retention",                       "GET, PUT",               A::kByMethod,          false, true,  false, false},
  {K::kRetentionRun, "retention_run", "/v1/models/{model}/retention:preview",               "POST",                   A::kWriteUnlessDryRun, true,  true,  false, false},
  {K::kRetentionRun, "retention_run", "/v1/models/{model}/retention:apply",                 "POST",                   A::kWriteUnlessDryRun, true,  true,  false, false},
  {K::kAdminGc,      "admin_gc",      "/v1/admin/gc",                                       "POST",                   A::kAdmin,             true,  false, false, false},
  {K::kListModels,   "list_models",   "/v1/models",                                         "GET",                    A::kByMethod,          false, false, false, false},
  {K::kModel,        "model",         "/v1/models/{model}",                                 "GET, DELETE",            A::kByMethod,          false, true,  false, false},
  {K::kListVersions, "list_versions", "/v1/models/{model}/versions",                        "GET",                    A::kByMethod,          false, false, false, false},
  {K::kPolicy,       "policy",        "/v1/models/{model}/policy",                          "GET, PUT",               A::kByMethod,          false, true,  false, false},
  {K::kAdminScrub,   "admin_scrub",   "/v1/admin/scrub",                                    "POST",                   A::kAdmin,             true,  false, false, false},
  {K::kAdminBackup,  "admin_backup",  "/v1/admin/backup",                                   "POST",                   A::kAdmin,             true,  false, false, false},
  {K::kMetrics,      "metrics",       "/metrics",                                           "GET, HEAD",              A::kReadEveryModel,    false, false, false, false},
  {K::kHealth,       "health",        "/healthz",                                           "GET, HEAD",              A::kOpen,              false, false, false, false},
  {K::kStoreStatus,  "status",        "/v1/status",                                         "GET, HEAD",              A::kReadEveryModel,    false, false, false, false},
  {K::kStatusPage,   "status_page",   "/",                                                  "GET, HEAD",              A::kByMethod,          false, false, false, false},
}};
// clang-format on

constexpr RouteSpec kUnknownSpec = {K::kUnknown, "unknown", "",    "",   A::kByMethod,
                                    false,       false,     false, false};

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

// Whether `parts` match `pattern`'s segments, filling the route's captured segments.
bool Match(std::string_view pattern, const std::vector<std::string_view>& parts, Route& route) {
  const std::vector<std::string_view> want = SplitPath(pattern);
  if (want.size() != parts.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!want[i].starts_with('{') && want[i] != parts[i]) return false;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string value(parts[i]);
    if (want[i] == "{model}") route.model = value;
    if (want[i] == "{version}") route.version = value;
    if (want[i] == "{tag}") route.tag = value;
    if (want[i] == "{shard}") route.shard = value;
    if (want[i] == "{file}") route.file = value;
  }
  return true;
}

// What a route reads from its query beyond the table's pattern.
void ReadRouteQuery(const RouteSpec& spec, Route& route) {
  switch (spec.kind) {
    case K::kStatusPage:
      // The model filter; a malformed query shows the overview (the page takes no other input).
      (void)ForEachQueryParam(route.query, [&](const std::string& key, const std::string& value) {
        if (key == "model") route.model = value;
        return Status::Ok();
      });
      break;
    case K::kHealth:
      route.detail = QueryFlag(route.query, "detail");
      break;
    case K::kVersion: {
      auto decoded = PercentDecode(route.version);  // "tag%3Abest" is "tag:best"
      if (decoded.ok()) route.version = *decoded;
      route.detail = QueryFlag(route.query, "detail");
      route.layout = QueryFlag(route.query, "layout");
      break;
    }
    case K::kRetentionRun:
      route.dry_run = spec.pattern.ends_with(":preview") || QueryFlag(route.query, "dry_run");
      break;
    default:
      break;
  }
}

}  // namespace

std::span<const RouteSpec> RouteTable() { return kRoutes; }

const RouteSpec& SpecOf(RouteKind kind) {
  for (const RouteSpec& spec : kRoutes) {
    if (spec.kind == kind) return spec;
  }
  return kUnknownSpec;
}

Route ClassifyTarget(std::string_view target) {
  const size_t query = target.find('?');
  const auto parts = SplitPath(target.substr(0, query));
  Route route;
  if (query != std::string_view::npos) route.query = std::string(target.substr(query + 1));
  for (const RouteSpec& spec : kRoutes) {
    if (!Match(spec.pattern, parts, route)) continue;
    route.kind = spec.kind;
    ReadRouteQuery(spec, route);
    return route;
  }
  // An unknown path under a model still names it: a token limited to other models is refused
  // (403) before the path is found missing (404).
  if (parts.size() > 3 && parts[0] == "v1" && parts[1] == "models") {
    route.model = std::string(parts[2]);
  }
  return route;
}

std::string_view RouteName(RouteKind kind) { return SpecOf(kind).name; }

bool RouteAllows(const Route& route, std::string_view method) {
  std::string_view methods = SpecOf(route.kind).methods;
  while (!methods.empty()) {
    const size_t comma = methods.find(", ");
    if (methods.substr(0, comma) == method) return true;
    if (comma == std::string_view::npos) break;
    methods.remove_prefix(comma + 2);
  }
  return false;
}

RequestPlan PlanOf(std::string_view method, const Route& route) {
  const RouteSpec& spec = SpecOf(route.kind);
  if (spec.put_streams_in && method == "PUT") return RequestPlan::kPush;
  // JSON about the stored body instead of the body: a version's detail or layout (GET), the
  // Hugging Face view's index.
  const bool asks_json =
      route.file == kHfIndexName || (method == "GET" && (route.detail || route.layout));
  if (spec.get_streams_out && (method == "GET" || method == "HEAD") && !asks_json) {
    return RequestPlan::kRestore;
  }
  return RequestPlan::kSimple;
}

bool IsAdminPass(const Route& route) { return SpecOf(route.kind).admin_pass && !route.dry_run; }

bool IsRedirectedWrite(std::string_view method, const Route& route) {
  if (method == "GET" || method == "HEAD" || route.model.empty() || route.dry_run) return false;
  return SpecOf(route.kind).writes_redirected;
}

}  // namespace ckpt::api
