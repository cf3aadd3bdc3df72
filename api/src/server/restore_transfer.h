// A stored body streamed from the store to the socket (RequestPlan::kRestore): the answer to
// Range and If-Range, headers first, then the body in pieces, small pieces gathered into one
// write. Internal to api/.
#pragma once

#include "server/server_context.h"

namespace ckpt::api::server {

// Returns whether the connection stays open. Defined for PlainStream and TlsStream.
template <class Stream>
net::awaitable<bool> TransferRestore(const ServerContext& ctx, Stream& stream, Exchange& ex);

}  // namespace ckpt::api::server
