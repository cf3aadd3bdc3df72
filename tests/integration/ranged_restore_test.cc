// Restores by byte range through the real daemon: a download cut off and resumed with
// Range/If-Range ends with the whole body and its SHA-256; unsatisfiable ranges are 416;
// an If-Range naming another body gets the whole body.
#include <gtest/gtest.h>

#include "daemon_process.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::RawHttp;
using testing::RawResponse;
using testing::TempDir;

RawResponse Get(uint16_t port, const std::string& target, const std::string& extra_headers) {
  RawHttp http(port);
  EXPECT_TRUE(
      http.Send("GET " + target + " HTTP/1.1\r\nHost: localhost\r\n" + extra_headers + "\r\n"));
  return http.Read();
}

TEST(RangedRestoreTest, ADownloadCutOffResumesWithRangeAndEndsWithTheWholeBody) {
  TempDir dir;
  DaemonProcess daemon(CKPTD_BINARY, dir.path());
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  testing::DriftingModel drift(5, 300000);
  std::string body;
  for (int v = 1; v <= 3; ++v) {  // a chain: the range reads deltas too
    body = drift.Next();
    ASSERT_EQ(
        testing::Request(daemon.port(), "PUT", "/v1/models/m/versions/" + std::to_string(v), body)
            .status,
        201);
  }
  const RawResponse whole = Get(daemon.port(), "/v1/models/m/versions/3", "");
  ASSERT_EQ(whole.status, 200);
  EXPECT_EQ(whole.headers.at("accept-ranges"), "bytes");
  const std::string etag = whole.headers.at("etag");
  ASSERT_TRUE(whole.body == body);

  // The first third arrived before the connection broke; the rest is asked for.
  const size_t cut = body.size() / 3;
  const RawResponse rest =
      Get(daemon.port(), "/v1/models/m/versions/3",
          "Range: bytes=" + std::to_string(cut) + "-\r\nIf-Range: " + etag + "\r\n");
  ASSERT_EQ(rest.status, 206) << rest.body;
  EXPECT_EQ(rest.headers.at("content-range"), "bytes " + std::to_string(cut) + "-" +
                                                  std::to_string(body.size() - 1) + "/" +
                                                  std::to_string(body.size()));
  const std::string resumed = body.substr(0, cut) + rest.body;
  EXPECT_TRUE(resumed == body);
  EXPECT_EQ("\"" + testing::Sha256Hex(resumed) + "\"", etag);

  for (auto [range, first, last] : {std::tuple<std::string, size_t, size_t>{"bytes=0-0", 0, 0},
                                    {"bytes=5-12", 5, 12},
                                    {"bytes=-100", body.size() - 100, body.size() - 1},
                                    {"bytes=100-99999999999", 100, body.size() - 1}}) {
    const RawResponse part =
        Get(daemon.port(), "/v1/models/m/versions/latest", "Range: " + range + "\r\n");
    ASSERT_EQ(part.status, 206) << range;
    EXPECT_TRUE(part.body == body.substr(first, last - first + 1)) << range;
  }
  const RawResponse past = Get(daemon.port(), "/v1/models/m/versions/3",
                               "Range: bytes=" + std::to_string(body.size()) + "-\r\n");
  EXPECT_EQ(past.status, 416);
  EXPECT_EQ(past.headers.at("content-range"), "bytes */" + std::to_string(body.size()));
  // Another version's ETag, several ranges, other units: the whole body.
  for (const std::string& headers :
       {std::string("Range: bytes=0-9\r\nIf-Range: \"0000\"\r\n"),
        std::string("Range: bytes=0-9,20-29\r\n"), std::string("Range: items=0-9\r\n")}) {
    const RawResponse full = Get(daemon.port(), "/v1/models/m/versions/3", headers);
    EXPECT_EQ(full.status, 200) << headers;
    EXPECT_TRUE(full.body == body) << headers;
  }
  // An older version of the chain, by range.
  const RawResponse older = Get(daemon.port(), "/v1/models/m/versions/1", "Range: bytes=64-\r\n");
  EXPECT_EQ(older.status, 206);
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace ckpt
