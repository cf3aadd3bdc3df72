// The server's TLS context (tls_context.h).
#include "tls_context.h"

#include <boost/system/error_code.hpp>
#include <string>

namespace ckpt::api {

Result<std::unique_ptr<boost::asio::ssl::context>> NewTlsContext(const HttpServerOptions& options) {
  namespace ssl = boost::asio::ssl;
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    return std::unique_ptr<ssl::context>();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return Status::InvalidArgument("TLS needs both a certificate file and a key file");
  }
  auto tls = std::make_unique<ssl::context>(ssl::context::tls_server);
  tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  boost::system::error_code ec;
  tls->use_certificate_chain_file(options.tls_cert_file, ec);
  if (ec) {
    return Status::InvalidArgument("TLS certificate '" + options.tls_cert_file +
                                   "': " + ec.message());
  }
  tls->use_private_key_file(options.tls_key_file, ssl::context::pem, ec);
  if (ec) {
    return Status::InvalidArgument("TLS key '" + options.tls_key_file + "': " + ec.message());
  }
  if (!options.tls_client_ca_file.empty()) {
    tls->load_verify_file(options.tls_client_ca_file, ec);
    if (ec) {
      return Status::InvalidArgument("TLS client CA '" + options.tls_client_ca_file +
                                     "': " + ec.message());
    }
    tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return tls;
}

}  // namespace ckpt::api
