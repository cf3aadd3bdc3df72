// A session: one connection's request loop, as in Beast's advanced server. Reads each
// request's header, authorizes it, redirects a cluster's writes, and hands it on by its plan:
// a push (push_transfer.h), a restore (restore_transfer.h), or a small body answered by
// ApiHandler::Handle (an administrative pass on the admin thread). Internal to api/.
#pragma once

#include <string>

#include "server/server_context.h"

namespace ckpt::api::server {

// Serves requests on `stream` until the client closes, a request ends the connection, it idles
// past options.idle_timeout, or the server stops. Defined for PlainStream and TlsStream.
template <class Stream>
net::awaitable<void> Serve(const ServerContext& ctx, Stream& stream, const std::string& remote);

}  // namespace ckpt::api::server
