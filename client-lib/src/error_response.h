// How the client reads ckptd's error answers. Internal to client-lib.
#pragma once

#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt {

// A non-2xx response as a Status: the code named in the body's error.code (the daemon's one
// Status-to-HTTP mapping writes it), else one guessed from the HTTP status (a proxy's answer);
// the body's error.message, else "HTTP <status>".
Status ErrorFromResponse(unsigned http_status, std::string_view body);

}  // namespace ckpt
