// HTTPS end to end: certificates made at test time with the openssl command (a private CA, a
// server certificate for localhost and 127.0.0.1, a client certificate), the real ckptd serving
// TLS, the client library and the CLI speaking it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iostream>

#include "ckpt/client/client.h"
#include "daemon_fixture.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::DriftingModel;
using testing::TempDir;

int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class TlsTest : public testing::DaemonFixture {
 protected:
  void SetUp() override {
    const std::string d = dir_.path().string();
    // A CA, a server certificate (SAN localhost, 127.0.0.1) and a client certificate.
    const std::string script =
        "cd " + d +
        " && exec > openssl.log 2>&1 && "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
        "  -keyout ca.key -out ca.crt && "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
        "  -out server.csr && "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "  -extfile san.ext -out server.crt && "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=trainer -keyout client.key "
        "  -out client.csr && "
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "  -out client.crt && "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
        "  -keyout other.key -out other.crt";
    ASSERT_EQ(Shell(script), 0) << "openssl failed: see " << d << "/openssl.log";
  }

  void StartTlsDaemon(bool require_client_cert) {
    std::string config = "[server]\ntls_cert_file = \"" + Path("server.crt") +
                         "\"\ntls_key_file = \"" + Path("server.key") + "\"\n";
    if (require_client_cert) config += "tls_client_ca_file = \"" + Path("ca.crt") + "\"\n";
    ASSERT_NO_FATAL_FAILURE(StartDaemon(config));
  }

  std::string Path(const std::string& name) const { return (dir_.path() / name).string(); }
  std::string HttpsUrl(const std::string& host = "localhost") const {
    return "https://" + host + ":" + std::to_string(daemon_->port());
  }

  Result<Client> ClientFor(const std::string& url, const std::string& ca,
                           const std::string& cert = "", const std::string& key = "") {
    ClientOptions options;
    options.server = url;
    options.ca_file = ca;
    options.client_cert_file = cert;
    options.client_key_file = key;
    return Client::Create(options);
  }
};

TEST_F(TlsTest, PushAndPullOverHttpsAndWhatIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartTlsDaemon(false));
  DriftingModel drift(80, 50000);
  const std::string v1 = drift.Next(), v2 = drift.Next();
  for (const std::string host : {"localhost", "127.0.0.1"}) {
    auto client = ClientFor(HttpsUrl(host), Path("ca.crt"));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const uint64_t version = host == "localhost" ? 1 : 2;
    auto pushed = client->PushBuffer("m", version, version == 1 ? v1 : v2);
    ASSERT_TRUE(pushed.ok()) << host << ": " << pushed.status().ToString();
    auto pulled = client->PullToBuffer("m", "latest");
    ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
    EXPECT_EQ(*pulled, version == 1 ? v1 : v2);
  }
  // A server certificate from a CA the client does not trust, or plain HTTP to the TLS port,
  // gets nowhere.
  auto untrusted = ClientFor(HttpsUrl(), Path("other.crt"));
  ASSERT_TRUE(untrusted.ok());
  EXPECT_FALSE(untrusted->ListModels().ok());
  auto plain = ClientFor(daemon_->url(), "");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->ListModels().ok());
  // The server keeps serving after the failed handshakes.
  auto again = ClientFor(HttpsUrl(), Path("ca.crt"));
  ASSERT_TRUE(again.ok());
  auto models = again->ListModels();
  ASSERT_TRUE(models.ok()) << models.status().ToString();
  EXPECT_EQ(models->size(), 1u);

  // The CLI: --cacert, or $CKPT_CACERT.
  const std::string file = Path("v.safetensors");
  std::ofstream(file, std::ios::binary) << drift.Next();
  const std::string cli = std::string(CKPT_CLI_BINARY) + " --server " + HttpsUrl();
  EXPECT_EQ(Shell(cli + " --cacert " + Path("ca.crt") + " push m 3 " + file + " > " +
                  Path("cli.log") + " 2>&1"),
            0);
  EXPECT_EQ(Shell("CKPT_CACERT=" + Path("ca.crt") + " " + cli + " pull m 3 -o " +
                  Path("out.safetensors") + " >> " + Path("cli.log") + " 2>&1"),
            0);
  EXPECT_NE(Shell(cli + " ls >> " + Path("cli.log") + " 2>&1"), 0) << "untrusted by default";
}

TEST_F(TlsTest, ClientCertificatesAreRequiredWhenConfigured) {
  ASSERT_NO_FATAL_FAILURE(StartTlsDaemon(true));
  auto without = ClientFor(HttpsUrl(), Path("ca.crt"));
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(without->ListModels().ok());
  auto with = ClientFor(HttpsUrl(), Path("ca.crt"), Path("client.crt"), Path("client.key"));
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  auto models = with->ListModels();
  EXPECT_TRUE(models.ok()) << models.status().ToString();
}

TEST(TlsConfig, BadFilesStopTheDaemonWithAClearMessage) {
  TempDir dir;
  const auto config = dir.path() / "bad.toml";
  std::ofstream(config) << "[server]\ntls_cert_file = \"/nonexistent.crt\"\n"
                           "tls_key_file = \"/nonexistent.key\"\n";
  DaemonProcess daemon(CKPTD_BINARY, dir.path(), {"--config", config.string()});
  EXPECT_FALSE(daemon.Start());
  EXPECT_NE(daemon.log().find("/nonexistent.crt"), std::string::npos) << daemon.log();
  ClientOptions ftp;
  ftp.server = "ftp://x:1";
  EXPECT_FALSE(Client::Create(ftp).ok());
  ClientOptions plain_with_ca;
  plain_with_ca.server = "http://127.0.0.1:1";
  plain_with_ca.ca_file = "/etc/ssl/certs/ca-certificates.crt";
  EXPECT_FALSE(Client::Create(plain_with_ca).ok());
}

}  // namespace
}  // namespace ckpt
