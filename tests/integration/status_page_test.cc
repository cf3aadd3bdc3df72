// The status page (GET /) against a daemon holding real pushes: loaded in headless Chromium
// (Debian's chromium; the test is skipped with a message when it is missing), its content
// asserted on the DOM the browser built, and a screenshot saved (CKPT_TEST_OUTPUT_DIR/
// status-page.png; docs/status-page.png is one). Also: the page's security headers, the model
// filter, and Basic authentication for browsers when tokens are configured.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>

#include "ckpt/client/client.h"
#include "daemon_fixture.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DriftingModel;
using testing::RawHttp;
using testing::RawResponse;

constexpr const char* kChromium = "/usr/bin/chromium";

class StatusPageTest : public testing::DaemonFixture {
 protected:
  RawResponse Get(const std::string& target, const std::string& extra_headers = "") {
    RawHttp http(daemon_->port());
    EXPECT_TRUE(http.Send("GET " + target + " HTTP/1.1\r\nHost: x\r\n" + extra_headers + "\r\n"));
    return http.Read();
  }

  // Two models as a training job leaves them: a lossless run with a tag, metrics and retention,
  // and a lossy one with an absolute bound.
  void PushModels() {
    ClientOptions options;
    options.server = daemon_->url();
    auto client = Client::Create(options);
    ASSERT_TRUE(client.ok());
    DriftingModel exact(1, 30000), lossy(2, 30000);
    ASSERT_TRUE(client->SetPolicy("lm-lossy", R"({"mode":"lossy","max_abs_error":0.001})").ok());
    ASSERT_TRUE(client->SetRetention("lm-exact", R"({"keep_last":20,"keep_every":50})").ok());
    for (uint64_t step = 10; step <= 120; step += 10) {
      PushMetadata metadata;
      metadata.metrics["loss"] = 3.0 / static_cast<double>(step);
      ASSERT_TRUE(client->PushBuffer("lm-exact", step, exact.Next(), metadata).ok());
      ASSERT_TRUE(client->PushBuffer("lm-lossy", step, lossy.Next()).ok());
    }
    ASSERT_TRUE(client->SetTag("lm-exact", 60, "best").ok());
  }

  // Runs headless Chromium on the page; returns its stdout (the DOM with --dump-dom).
  std::string Chromium(const std::string& flags, const std::string& url) {
    // Bounded: a browser that hangs fails the test in a minute.
    const std::string command = "timeout 60 " + std::string(kChromium) +
                                " --headless=new --no-sandbox --disable-gpu --hide-scrollbars"
                                " --disable-dev-shm-usage --no-first-run --user-data-dir=" +
                                (dir_.path() / "chromium").string() + " " + flags + " '" + url +
                                "' 2>" + (dir_.path() / "chromium.log").string();
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    char buf[65536];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    const int rc = pclose(pipe);
    EXPECT_EQ(rc, 0) << command << "\n" << ReadFile(dir_.path() / "chromium.log");
    return out;
  }

  static std::string ReadFile(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  static size_t Count(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }
};

TEST_F(StatusPageTest, RendersModelsVersionsChartsAndTagsInChromium) {
  if (!std::filesystem::exists(kChromium)) {
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh --browser installs it)";
  }
  ASSERT_NO_FATAL_FAILURE(StartDaemon("", "info"));  // every request in the log
  ASSERT_NO_FATAL_FAILURE(PushModels());

  const std::string dom = Chromium("--dump-dom", daemon_->url() + "/");
  ASSERT_NE(dom.find("<title>ckptd status</title>"), std::string::npos) << dom.substr(0, 2000);
  // The models table, one row per model, with the totals above it.
  EXPECT_EQ(Count(dom, "<tr class=\"model\""), 2u);
  EXPECT_NE(dom.find("data-model=\"lm-exact\""), std::string::npos);
  EXPECT_NE(dom.find("data-model=\"lm-lossy\""), std::string::npos);
  EXPECT_NE(dom.find("id=\"total-versions\"><div class=\"v\">24<"), std::string::npos);
  EXPECT_NE(dom.find("lossy, |err| ≤ 0.001"), std::string::npos);
  // Policies as lists that wrap, not raw JSON; the model pushed last comes first.
  EXPECT_NE(dom.find("<li><b>keep_every</b>50</li><li><b>keep_last</b>20</li>"), std::string::npos);
  EXPECT_NE(dom.find("<li><b>max_abs_error</b>0.001</li>"), std::string::npos);
  EXPECT_EQ(dom.find("{\"fast_latest\""), std::string::npos) << "policy shown as raw JSON";
  EXPECT_LT(dom.find("<tr class=\"model\" data-model=\"lm-lossy\""),
            dom.find("<tr class=\"model\" data-model=\"lm-exact\""));
  // Per model: two charts, twelve version rows with kind, bound and tags.
  EXPECT_EQ(Count(dom, "<svg"), 4u);
  EXPECT_EQ(Count(dom, "class=\"bar\""), 24u);
  EXPECT_EQ(Count(dom, "class=\"savings\""), 2u);
  EXPECT_EQ(Count(dom, "<tr class=\"version\""), 24u);
  EXPECT_NE(dom.find("<span class=\"kind keyframe\">keyframe</span>"), std::string::npos);
  EXPECT_NE(dom.find("<span class=\"kind delta\">delta</span>"), std::string::npos);
  EXPECT_NE(dom.find("|err| ≤ 0.001</td>"), std::string::npos);
  EXPECT_NE(dom.find("<td>exact</td>"), std::string::npos);
  EXPECT_NE(dom.find("best → v60"), std::string::npos);
  EXPECT_NE(dom.find("loss=0.05 "), std::string::npos);

  // One model only.
  const std::string one = Chromium("--dump-dom", daemon_->url() + "/?model=lm-lossy");
  EXPECT_EQ(Count(one, "<tr class=\"model\""), 1u);
  EXPECT_EQ(Count(one, "<tr class=\"version\""), 12u);

  // The browser asked for nothing but the pages (no favicon, no assets). A request is logged
  // when its response is written, so the second page's line may still be on its way.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Count(daemon_->log(), "GET /?model=lm-lossy status=200") == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log = daemon_->log();
  EXPECT_EQ(Count(log, "GET / status=200"), 1u);
  EXPECT_EQ(Count(log, "GET /?model=lm-lossy status=200"), 1u);
  EXPECT_EQ(std::regex_search(log, std::regex("GET /[a-z]")), false) << log;

  const auto shot = std::filesystem::path(CKPT_TEST_OUTPUT_DIR) / "status-page.png";
  std::filesystem::remove(shot);
  Chromium("--window-size=1280,1700 --screenshot=" + shot.string(), daemon_->url() + "/");
  ASSERT_TRUE(std::filesystem::exists(shot));
  EXPECT_GT(std::filesystem::file_size(shot), 20000u);
  EXPECT_EQ(ReadFile(shot).substr(1, 3), "PNG");
}

TEST_F(StatusPageTest, IsSelfContainedAndFiltersByModel) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_NO_FATAL_FAILURE(PushModels());
  const RawResponse page = Get("/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.headers.at("content-security-policy"),
            "default-src 'none'; style-src 'unsafe-inline'");
  EXPECT_EQ(page.headers.at("cache-control"), "no-store");
  EXPECT_EQ(page.body.find("<script"), std::string::npos);
  EXPECT_EQ(page.body.find("http://"), std::string::npos);
  EXPECT_EQ(page.body.find("https://"), std::string::npos);

  const RawResponse missing = Get("/?model=nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.content_type, "text/html; charset=utf-8");
  EXPECT_NE(missing.body.find("no model &#39;nope&#39;"), std::string::npos) << missing.body;
  EXPECT_NE(missing.body.find("<a href=\"/\">All models</a>"), std::string::npos);
  const RawResponse one = Get("/?model=lm-exact");
  ASSERT_EQ(one.status, 200);
  EXPECT_EQ(Count(one.body, "<tr class=\"model\""), 1u);
  EXPECT_NE(one.body.find("data-model=\"lm-exact\""), std::string::npos);
}

// With more models than the overview charts, the ones pushed to most recently are charted,
// whatever their names; the others are a link away.
TEST_F(StatusPageTest, ChartsTheModelsInUse) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ClientOptions options;
  options.server = daemon_->url();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  DriftingModel drift(4, 1000);
  constexpr size_t kOverviewCharts = 12;  // api/src/status_page.h, kMaxModelSections
  const size_t count = kOverviewCharts + 2;
  for (size_t i = 0; i < count; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "m%02zu", i);
    ASSERT_TRUE(client->PushBuffer(name, 1, drift.Next()).ok());
  }
  ASSERT_TRUE(client->PushBuffer("m00", 2, drift.Next()).ok());  // the one in use
  const RawResponse page = Get("/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(Count(page.body, "<tr class=\"model\""), count);
  EXPECT_EQ(Count(page.body, "<section id=\"model-"), kOverviewCharts);
  EXPECT_NE(page.body.find("<section id=\"model-m00\""), std::string::npos);
  EXPECT_EQ(page.body.find("<section id=\"model-m01\""), std::string::npos);
  EXPECT_NE(page.body.find("<a href=\"/?model=m01\">"), std::string::npos);
  EXPECT_NE(Get("/?model=m01").body.find("<section id=\"model-m01\""), std::string::npos);
}

TEST_F(StatusPageTest, BrowsersAuthenticateWithBasicAndSeeOnlyTheirPrefix) {
  // Tokens "ops-token" (every model) and "team-token" (models "lm-e*").
  const std::string config =
      "[[auth.tokens]]\nname = \"ops\"\nscope = \"write\"\nsha256 = \"" +
      testing::Sha256Hex("ops-token") +
      "\"\n[[auth.tokens]]\nname = \"team\"\nscope = \"read\"\nmodel_prefix = \"lm-e\"\n"
      "sha256 = \"" +
      testing::Sha256Hex("team-token") + "\"\n";
  ASSERT_NO_FATAL_FAILURE(StartDaemon(config));
  ClientOptions options;
  options.server = daemon_->url();
  options.token = "ops-token";
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  DriftingModel drift(3, 1000);
  ASSERT_TRUE(client->PushBuffer("lm-exact", 1, drift.Next()).ok());
  ASSERT_TRUE(client->PushBuffer("other", 1, drift.Next()).ok());

  const RawResponse anonymous = Get("/");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(anonymous.headers.at("www-authenticate"), "Basic realm=\"ckptd\", charset=\"UTF-8\"");
  EXPECT_EQ(Get("/v1/models").headers.at("www-authenticate"), "Bearer realm=\"ckptd\"");

  // "Basic base64(any-user:team-token)", as a browser sends it after the prompt: the page
  // shows the models the token covers.
  const RawResponse team = Get("/", "Authorization: Basic YW55LXVzZXI6dGVhbS10b2tlbg==\r\n");
  ASSERT_EQ(team.status, 200);
  EXPECT_NE(team.body.find("data-model=\"lm-exact\""), std::string::npos);
  EXPECT_EQ(team.body.find("data-model=\"other\""), std::string::npos);
  EXPECT_EQ(Get("/?model=other", "Authorization: Bearer team-token\r\n").status, 403);
  EXPECT_EQ(Get("/", "Authorization: Basic YW55LXVzZXI6d3Jvbmc=\r\n").status, 401);  // "wrong"
  const RawResponse ops = Get("/", "Authorization: Bearer ops-token\r\n");
  ASSERT_EQ(ops.status, 200);
  EXPECT_NE(ops.body.find("data-model=\"other\""), std::string::npos);
}

}  // namespace
}  // namespace ckpt
