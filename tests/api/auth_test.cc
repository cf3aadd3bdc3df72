// Authorizer: every scope and prefix against every kind of route.
#include "ckpt/api/auth.h"

#include <gtest/gtest.h>

namespace ckpt::api {
namespace {

Authorizer MakeAuthorizer() {
  std::vector<TokenGrant> grants = {
      {"reader", Authorizer::TokenDigestHex("r-token"), Scope::kRead, ""},
      {"writer", Authorizer::TokenDigestHex("w-token"), Scope::kWrite, ""},
      {"admin", Authorizer::TokenDigestHex("a-token"), Scope::kAdmin, ""},
      {"team-writer", Authorizer::TokenDigestHex("tw-token"), Scope::kWrite, "team-"},
      {"team-admin", Authorizer::TokenDigestHex("ta-token"), Scope::kAdmin, "team-"},
  };
  auto a = Authorizer::Create(grants);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(a).value();
}

StatusCode CodeFor(const Authorizer& a, std::string_view token, std::string_view method,
                   std::string_view target) {
  const std::string header = token.empty() ? "" : "Bearer " + std::string(token);
  return a.Authorize(header, method, ClassifyTarget(target)).status().code();
}

TEST(Authorizer, EveryScopeAndPrefixAgainstEveryRouteKind) {
  const Authorizer a = MakeAuthorizer();
  struct Case {
    const char* method;
    const char* target;
    Scope needs;
    bool all_models;
  };
  const Case cases[] = {
      {"GET", "/v1/models", Scope::kRead, false},
      {"GET", "/v1/models/team-m", Scope::kRead, false},
      {"DELETE", "/v1/models/team-m", Scope::kWrite, false},
      {"GET", "/v1/models/team-m/versions", Scope::kRead, false},
      {"GET", "/v1/models/team-m/versions/latest", Scope::kRead, false},
      {"HEAD", "/v1/models/team-m/versions/3", Scope::kRead, false},
      {"PUT", "/v1/models/team-m/versions/3", Scope::kWrite, false},
      {"DELETE", "/v1/models/team-m/versions/3", Scope::kWrite, false},
      {"GET", "/v1/models/team-m/policy", Scope::kRead, false},
      {"PUT", "/v1/models/team-m/policy", Scope::kWrite, false},
      {"PUT", "/v1/models/team-m/versions/3/tags/best", Scope::kWrite, false},
      {"GET", "/v1/models/team-m/retention", Scope::kRead, false},
      {"PUT", "/v1/models/team-m/retention", Scope::kWrite, false},
      {"POST", "/v1/models/team-m/retention:preview", Scope::kRead, false},
      {"POST", "/v1/models/team-m/retention:apply", Scope::kWrite, false},
      {"POST", "/v1/admin/gc", Scope::kAdmin, true},
      {"POST", "/v1/admin/scrub", Scope::kAdmin, true},
      {"POST", "/v1/admin/backup", Scope::kAdmin, true},
      {"GET", "/metrics", Scope::kRead, true},
      {"GET", "/", Scope::kRead, false},  // the status page: models within the prefix
      {"GET", "/?model=team-m", Scope::kRead, false},
  };
  struct Token {
    const char* token;
    Scope scope;
    bool prefixed;
  };
  const Token tokens[] = {{"r-token", Scope::kRead, false},
                          {"w-token", Scope::kWrite, false},
                          {"a-token", Scope::kAdmin, false},
                          {"tw-token", Scope::kWrite, true},
                          {"ta-token", Scope::kAdmin, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.method) + " " + c.target);
    EXPECT_EQ(CodeFor(a, "", c.method, c.target), StatusCode::kUnauthenticated);
    EXPECT_EQ(CodeFor(a, "wrong-token", c.method, c.target), StatusCode::kUnauthenticated);
    for (const Token& t : tokens) {
      SCOPED_TRACE(t.token);
      const bool allowed = t.scope >= c.needs && !(t.prefixed && c.all_models);
      EXPECT_EQ(CodeFor(a, t.token, c.method, c.target),
                allowed ? StatusCode::kOk : StatusCode::kPermissionDenied);
    }
  }
  // Outside its prefix a prefixed token is refused even with the right scope.
  EXPECT_EQ(CodeFor(a, "tw-token", "GET", "/v1/models/other/versions/latest"),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeFor(a, "tw-token", "PUT", "/v1/models/teammate/versions/1"),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeFor(a, "w-token", "PUT", "/v1/models/other/versions/1"), StatusCode::kOk);
  // Health needs nothing; unknown paths need a valid token first (then 404 from the handler).
  EXPECT_EQ(CodeFor(a, "", "GET", "/healthz"), StatusCode::kOk);
  EXPECT_EQ(CodeFor(a, "", "GET", "/nope"), StatusCode::kUnauthenticated);
  EXPECT_EQ(CodeFor(a, "r-token", "GET", "/nope"), StatusCode::kOk);
}

TEST(Authorizer, ThePrincipalCarriesTheNameAndPrefix) {
  const Authorizer a = MakeAuthorizer();
  auto p = a.Authorize("Bearer tw-token", "GET", ClassifyTarget("/v1/models"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, "team-writer");
  EXPECT_EQ(p->model_prefix, "team-");
  // The scheme is case-insensitive. Basic carries the token as its password (any user name), as
  // browsers send it for the status page; anything else is refused.
  EXPECT_TRUE(a.Authorize("bearer a-token", "POST", ClassifyTarget("/v1/admin/gc")).ok());
  EXPECT_TRUE(a.Authorize("Basic dTpyLXRva2Vu", "GET", ClassifyTarget("/")).ok());
  auto basic = a.Authorize("basic OnR3LXRva2Vu", "GET", ClassifyTarget("/"));  // ":tw-token"
  ASSERT_TRUE(basic.ok());
  EXPECT_EQ(basic->name, "team-writer");
  for (const char* bad : {"Basic YTpi", "Basic ci10b2tlbg==", "Basic dTpyLXRva2Vu=", "Basic !!!!",
                          "Basic ", "Token r-token"}) {
    EXPECT_EQ(a.Authorize(bad, "GET", ClassifyTarget("/")).status().code(),
              StatusCode::kUnauthenticated)
        << bad;
  }
  EXPECT_EQ(Authorizer::Challenge(ClassifyTarget("/")), "Basic realm=\"ckptd\", charset=\"UTF-8\"");
  EXPECT_EQ(Authorizer::Challenge(ClassifyTarget("/v1/models")), "Bearer realm=\"ckptd\"");
  EXPECT_EQ(a.Authorize("Bearer ", "GET", ClassifyTarget("/v1/models")).status().code(),
            StatusCode::kUnauthenticated);
  // The error names the token and what was missing, never the token itself.
  auto denied = a.Authorize("Bearer r-token", "PUT", ClassifyTarget("/v1/models/m/policy"));
  EXPECT_NE(denied.status().message().find("'reader' has scope read"), std::string::npos);
  EXPECT_EQ(denied.status().message().find("r-token"), std::string::npos);
}

TEST(Authorizer, WithoutTokensEverythingIsAllowed) {
  auto a = Authorizer::Create({});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->enabled());
  EXPECT_TRUE(a->Authorize("", "POST", ClassifyTarget("/v1/admin/gc")).ok());
}

TEST(Authorizer, BadGrantsAreRefusedNamingThem) {
  const std::string digest = Authorizer::TokenDigestHex("t");
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_FALSE(Authorizer::Create({{"", digest, Scope::kRead, ""}}).ok());
  auto short_digest = Authorizer::Create({{"x", "abc", Scope::kRead, ""}});
  EXPECT_NE(short_digest.status().message().find("'x'"), std::string::npos);
  EXPECT_FALSE(Authorizer::Create({{"x", std::string(64, 'g'), Scope::kRead, ""}}).ok());
  EXPECT_FALSE(
      Authorizer::Create({{"x", digest, Scope::kRead, ""}, {"x", digest + "", Scope::kRead, ""}})
          .ok());
  EXPECT_FALSE(
      Authorizer::Create({{"x", digest, Scope::kRead, ""}, {"y", digest, Scope::kWrite, ""}}).ok());
  EXPECT_EQ(ScopeFromName("admin"), Scope::kAdmin);
  EXPECT_FALSE(ScopeFromName("root").has_value());
}

}  // namespace
}  // namespace ckpt::api
