// The route table (routes.h) against the reference (docs/api.md): every method of every route
// has a heading, and every heading names a route and a method it answers. Plus what the table
// derives: classification, Allow, plans, redirects and administrative passes.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "ckpt/api/api_handler.h"
#include "ckpt/api/auth.h"
#include "ckpt/api/routes.h"

namespace ckpt::api {
namespace {

using MethodPath = std::pair<std::string, std::string>;

// The (method, path) pairs docs/api.md's endpoint headings name: "`GET|PUT /v1/...`", with
// "{version|latest}" as "{version}", the query left out, and "…/x" relative to the path before.
std::set<MethodPath> DocumentedEndpoints() {
  std::ifstream in(CKPT_API_DOC);
  EXPECT_TRUE(in) << CKPT_API_DOC;
  std::set<MethodPath> found;
  const std::regex span("`([A-Z|]+) ([^` ?]+)[^`]*`");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("### ")) continue;
    std::string previous;
    for (std::sregex_iterator it(line.begin(), line.end(), span), end; it != end; ++it) {
      std::string path = (*it)[2];
      path = std::regex_replace(path, std::regex(R"(\{version\|latest\})"), "{version}");
      if (path.starts_with("…/")) path = previous.substr(0, previous.rfind('/')) + path.substr(3);
      previous = path;
      std::stringstream methods((*it)[1]);
      for (std::string method; std::getline(methods, method, '|');) found.emplace(method, path);
    }
  }
  return found;
}

// Every method a route answers, as the table lists them.
std::set<MethodPath> TableEndpoints() {
  std::set<MethodPath> found;
  for (const RouteSpec& spec : RouteTable()) {
    std::stringstream methods{std::string(spec.methods)};
    for (std::string method; std::getline(methods, method, ',');) {
      if (method.starts_with(' ')) method.erase(0, 1);
      found.emplace(method, std::string(spec.pattern));
    }
  }
  return found;
}

TEST(RouteTable, EveryRouteAndMethodHasItsHeadingInTheApiReference) {
  const std::set<MethodPath> documented = DocumentedEndpoints();
  ASSERT_GT(documented.size(), 15u);
  for (const auto& [method, path] : TableEndpoints()) {
    // HEAD is answered wherever GET is; the reference lists it where it differs (a version).
    if (method == "HEAD") continue;
    EXPECT_TRUE(documented.count({method, path})) << method << " " << path << " has no heading";
  }
}

TEST(RouteTable, EveryHeadingNamesARouteThatAnswersItsMethod) {
  const std::set<MethodPath> table = TableEndpoints();
  for (const auto& [method, path] : DocumentedEndpoints()) {
    EXPECT_TRUE(table.count({method, path})) << "docs/api.md: " << method << " " << path;
  }
}

TEST(RouteTable, EachPatternClassifiesAsItsOwnRow) {
  for (const RouteSpec& spec : RouteTable()) {
    std::string target(spec.pattern);
    for (const char* name : {"{model}", "{version}", "{tag}", "{shard}", "{file}"}) {
      if (const size_t at = target.find(name); at != std::string::npos) {
        target.replace(at, std::string(name).size(), "x1");
      }
    }
    const Route route = ClassifyTarget(target);
    EXPECT_EQ(route.kind, spec.kind) << target;
    EXPECT_EQ(RouteName(route.kind), spec.name) << target;
  }
  EXPECT_EQ(ClassifyTarget("/v1/nothing").kind, RouteKind::kUnknown);
  EXPECT_EQ(ClassifyTarget("/v1/models/m/nothing/here").model, "m");
}

TEST(RouteTable, AllowListsComeFromTheTable) {
  const Route route = ClassifyTarget("/v1/models/m/versions/3/tags/best");
  const ApiResponse r = ApiHandler::MethodNotAllowed("GET", route);
  EXPECT_EQ(r.status, 405);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].second, "PUT, DELETE");
  EXPECT_TRUE(RouteAllows(route, "PUT"));
  EXPECT_FALSE(RouteAllows(route, "PU"));
  EXPECT_FALSE(RouteAllows(route, "GET"));
}

TEST(RouteTable, DryRunsOnlyRead) {
  const Route preview = ClassifyTarget("/v1/models/m/retention:preview");
  const Route apply = ClassifyTarget("/v1/models/m/retention:apply");
  const Route apply_dry = ClassifyTarget("/v1/models/m/retention:apply?dry_run=1");
  EXPECT_TRUE(preview.dry_run);
  EXPECT_FALSE(IsAdminPass(preview));
  EXPECT_FALSE(IsRedirectedWrite("POST", preview));
  EXPECT_TRUE(IsAdminPass(apply));
  EXPECT_TRUE(IsRedirectedWrite("POST", apply));
  EXPECT_FALSE(IsAdminPass(apply_dry));
  EXPECT_EQ(Authorizer::RequirementFor("POST", apply)->scope, Scope::kWrite);
  EXPECT_EQ(Authorizer::RequirementFor("POST", apply_dry)->scope, Scope::kRead);
  EXPECT_FALSE(Authorizer::RequirementFor("GET", ClassifyTarget("/healthz")).has_value());
  EXPECT_TRUE(Authorizer::RequirementFor("GET", ClassifyTarget("/metrics"))->all_models);
}

}  // namespace
}  // namespace ckpt::api
