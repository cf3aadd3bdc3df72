// Authorization end to end: the real ckptd with tokens in its config file, driven through the
// client library and raw HTTP.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ckpt/client/client.h"
#include "daemon_fixture.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DriftingModel;
using testing::RawHttp;
using testing::Sha256Hex;
using testing::TempDir;

class AuthTest : public testing::DaemonFixture {
 protected:
  void SetUp() override {
    std::string config;
    auto token = [&](const char* name, const char* secret, const char* scope, const char* prefix) {
      config += "[[auth.tokens]]\nname = \"" + std::string(name) + "\"\nsha256 = \"" +
                Sha256Hex(secret) + "\"\nscope = \"" + scope + "\"\nmodel_prefix = \"" + prefix +
                "\"\n";
    };
    token("reader", "read-secret", "read", "");
    token("team-writer", "team-secret", "write", "team-");
    token("ops", "admin-secret", "admin", "");
    ASSERT_NO_FATAL_FAILURE(StartDaemon(config));
  }

  Client ClientWith(const std::string& token) {
    ClientOptions options;
    options.server = daemon_->url();
    options.token = token;
    return std::move(Client::Create(options)).value();
  }

  // A request with an optional Authorization header; returns the status and headers.
  std::pair<int, std::string> Raw(std::string_view method, std::string_view target,
                                  std::string_view authorization = {}) {
    RawHttp http(daemon_->port());
    std::string head = std::string(method) + " " + std::string(target) +
                       " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n";
    if (!authorization.empty()) head += "Authorization: " + std::string(authorization) + "\r\n";
    EXPECT_TRUE(http.Send(head + "\r\n"));
    auto r = http.Read();
    return {r.status, r.body};
  }
};

TEST_F(AuthTest, TokensScopesAndPrefixesAreEnforcedOverHttp) {
  DriftingModel drift(70, 2000);
  const std::string body = drift.Next();
  // Without a token only /healthz answers.
  EXPECT_EQ(Raw("GET", "/healthz").first, 200);
  auto [status, error] = Raw("GET", "/v1/models");
  EXPECT_EQ(status, 401);
  EXPECT_NE(error.find("UNAUTHENTICATED"), std::string::npos) << error;
  EXPECT_EQ(Raw("GET", "/v1/models", "Bearer guessed").first, 401);
  EXPECT_EQ(Raw("POST", "/v1/admin/gc", "Bearer read-secret").first, 403);

  Client team = ClientWith("team-secret");
  Client reader = ClientWith("read-secret");
  Client ops = ClientWith("admin-secret");
  Client anonymous = ClientWith("");
  ASSERT_TRUE(team.PushBuffer("team-a", 1, body).ok());
  EXPECT_EQ(anonymous.PushBuffer("team-a", 2, body).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reader.PushBuffer("team-a", 2, body).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(team.PushBuffer("other", 1, body).status().code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(ops.PushBuffer("other", 1, body).ok());
  // Refused pushes changed nothing.
  auto versions = ops.ListVersions("team-a");
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->size(), 1u);
  EXPECT_EQ(ops.ListVersions("other")->size(), 1u);

  auto pulled = reader.PullToBuffer("team-a", "latest");
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(*pulled, body);
  EXPECT_EQ(team.PullToBuffer("other", "latest").status().code(), StatusCode::kPermissionDenied);
  // Listings show what the token may see.
  auto all = reader.ListModels();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
  auto mine = team.ListModels();
  ASSERT_TRUE(mine.ok());
  ASSERT_EQ(mine->size(), 1u);
  EXPECT_EQ((*mine)[0].name, "team-a");
  // Admin endpoints need admin scope and no prefix.
  EXPECT_EQ(team.CollectGarbage().status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(ops.CollectGarbage().ok());
  EXPECT_TRUE(ops.Scrub().ok());
  // The log names the token, never the secret.
  const std::string log = daemon_->log();
  EXPECT_EQ(log.find("team-secret"), std::string::npos);
}

TEST(AuthStartup, ANonLoopbackListenerWithoutTokensRefusesToStart) {
  TempDir dir;
  const auto log = dir.path() / "ckptd.log";
  const std::string command = std::string(CKPTD_BINARY) + " --listen 0.0.0.0:0 --data-dir " +
                              (dir.path() / "data").string() + " > " + log.string() + " 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  std::ifstream in(log);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  EXPECT_NE(text.find("without authentication"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "data")) << "nothing was created";
}

}  // namespace
}  // namespace ckpt
