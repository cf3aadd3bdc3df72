// NewTlsContext: the server's TLS context from HttpServerOptions. Internal to api/.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>

#include "ckpt/api/http_server.h"
#include "ckpt/base/status.h"

namespace ckpt::api {

// TLS 1.2 or later with the configured certificate chain and key; client certificates are
// required and verified against tls_client_ca_file when it is set. Null when HTTPS is not
// configured; InvalidArgument naming the file that cannot be used.
Result<std::unique_ptr<boost::asio::ssl::context>> NewTlsContext(const HttpServerOptions& options);

}  // namespace ckpt::api
