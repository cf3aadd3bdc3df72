// An encoded pull of a part of a version (a rank's view, a tensor selection) into a file.
// Internal to client-lib.
#pragma once

#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/client/client.h"

namespace ckpt {

// Writes the part `target` names (".../versions/{v}?rank=..&of=.." and the like), decoded here,
// into `path`.partial and renames it to `path`; removes it on failure. Each chunk is checked by
// its record's checksum (a part has no announced SHA-256).
Result<PullResult> PullEncodedPart(const std::vector<ServerEndpoint>& servers,
                                   const ClientOptions& options, TlsContext* tls,
                                   const std::string& target, const std::string& path, int threads);

}  // namespace ckpt
