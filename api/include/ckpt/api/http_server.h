// HttpServer: the ckptd HTTP/1.1 listener and sessions, on Boost.Beast with C++20 coroutines.
//
// Each connection is one coroutine on its own strand; the io_context runs on `threads` threads.
// With a certificate and key configured the listener speaks HTTPS only (Beast ssl_stream).
// Request handling itself is delegated to ApiHandler; this layer only moves bytes, enforces
// limits and timeouts, honours `Expect: 100-continue`, and logs one line per request.
//
// Thread safety: Start/Shutdown/port may be called from any one thread; the server's internals
// are synchronized.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/api/api_handler.h"
#include "ckpt/api/auth.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::api {

struct HttpServerOptions {
  // Address to listen on. Default: 127.0.0.1.
  std::string address = "127.0.0.1";
  // TCP port; 0 picks an ephemeral port (see HttpServer::port()). Default: 8420.
  uint16_t port = 8420;
  // Threads running the io_context. Request handling (codec, RocksDB) runs on them too, so this
  // bounds how many requests make progress at once. Default: 4.
  int threads = 4;
  // Largest accepted request body (a pushed checkpoint); larger ones get 413 — before the body
  // is read when Content-Length announces it. Default: 64 GiB.
  uint64_t max_body_bytes = 64ull << 30;
  // Largest accepted request line + headers; larger get 431. Default: 64 KiB.
  uint32_t max_header_bytes = 64 << 10;
  // Largest body of the small JSON endpoints (policy). Default: 1 MiB.
  uint64_t max_json_body_bytes = 1 << 20;
  // A read or write that makes no progress for this long drops the connection (a slow or stuck
  // client cannot hold a session forever). Default: 60 s.
  std::chrono::seconds io_timeout{60};
  // How long an idle keep-alive connection is kept. Default: 30 s.
  std::chrono::seconds idle_timeout{30};
  // On shutdown, in-flight requests get this long to finish before connections are cut.
  // Default: 30 s.
  std::chrono::seconds shutdown_grace{30};
  // A push to a model that is already receiving one waits (without holding a thread) up to this
  // long for its turn, then gets 409. Default: 30 s.
  std::chrono::seconds push_wait{30};
  // Open connections beyond this are answered 503 (plain HTTP) or closed (TLS) at once.
  // 0: no limit. Default: 1024.
  size_t max_connections = 1024;
  // Size of the per-connection buffer body bytes are read into. Default: 1 MiB.
  size_t io_buffer_bytes = 1 << 20;
  // Called with the model's name after each committed push and each deleted version (on a
  // network thread: must not block). Default: none.
  VersionsChangedHook on_versions_changed;
  // HTTPS: PEM certificate chain and private key files (TLS 1.2 or later); both empty: plain
  // HTTP. Default: none.
  std::string tls_cert_file;
  std::string tls_key_file;
  // With HTTPS, also require a client certificate signed by a CA in this PEM file. Default:
  // none (clients are not asked for certificates).
  std::string tls_client_ca_file;
  // Log each request as a JSON object (request_id, remote, principal, method, target, status,
  // bytes_in, bytes_out, ms) instead of a text line; the daemon's JSON log formatter turns it
  // into the line's fields. Default: false.
  bool json_logs = false;
  // Encoded pushes (docs/api.md, "plan"): each payload is decoded against the store's reference
  // and must restore to the bytes its client reconstructed. false: writers are trusted, and
  // payloads are checked by checksum and structure only (less CPU per pushed byte; a client
  // whose reference drifted then stores versions whose restores fail their checksums).
  // Default: true.
  bool decode_encoded_payloads = true;
  // Bearer-token authorization of every request (auth.h); null or without tokens: every
  // request is allowed. Default: none.
  std::shared_ptr<const Authorizer> authorizer;
};

class HttpServer {
 public:
  // Binds, listens and starts serving `store` (which must outlive the server).
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                   CheckpointStore* store);
  virtual ~HttpServer() = default;

  // The bound port (useful with port 0).
  virtual uint16_t port() const = 0;
  // Stops accepting, closes idle connections, waits up to shutdown_grace for in-flight requests,
  // then cuts the rest and joins the threads. Idempotent; blocks.
  virtual void Shutdown() = 0;
};

}  // namespace ckpt::api
