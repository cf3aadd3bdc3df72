// A push's body streamed from the socket into the store (RequestPlan::kPush): refusals known
// from the headers before any body, the wait for the model's turn, 100 Continue once the push
// holds the model, the body in io_buffer_bytes pieces, and the commit off the network thread.
// Internal to api/.
#pragma once

#include "server/server_context.h"

namespace ckpt::api::server {

// Returns whether the connection stays open. Defined for PlainStream and TlsStream.
template <class Stream>
net::awaitable<bool> TransferPush(const ServerContext& ctx, Stream& stream, Exchange& ex);

}  // namespace ckpt::api::server
