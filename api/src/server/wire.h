// Writing answers and reading small bodies on a session's stream: the one place for a complete
// answer (WriteResponse), a refusal that ends the connection (RefuseAndClose), 100 Continue
// (SendContinue) and the body of a non-streaming request (ReadSmallBody). Internal to api/.
//
// Defined for PlainStream and TlsStream (wire.cc); each call runs on its session's strand.
#pragma once

#include <string>

#include "server/server_context.h"

namespace ckpt::api::server {

// Writes `r` (headers only for a HEAD), with `keep_alive`, and records it in the exchange's log.
// False if the client is gone.
template <class Stream>
net::awaitable<bool> WriteResponse(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                   const ApiResponse& r, bool keep_alive, bool head = false);

// Answers `r` before (or instead of) taking the body — a refusal, or a cluster's redirect — and
// ends the exchange: a body the client is still sending is drained (bounded in bytes and time)
// so that it reads the answer instead of a reset. The connection stays open only when
// `keep_alive` and no body is left unread; returns whether it does.
template <class Stream>
net::awaitable<bool> RefuseAndClose(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                    const ApiResponse& r, bool keep_alive = false);

// Tells a client that sent Expect: 100-continue to send its body (once). Unavailable if it
// cannot be told.
template <class Stream>
net::awaitable<Status> SendContinue(const ServerContext& ctx, Stream& stream, Exchange& ex);

// The whole body of a non-streaming request into `body` (at most options.max_json_body_bytes).
template <class Stream>
net::awaitable<Status> ReadSmallBody(const ServerContext& ctx, Stream& stream, Exchange& ex,
                                     std::string& body);

}  // namespace ckpt::api::server
