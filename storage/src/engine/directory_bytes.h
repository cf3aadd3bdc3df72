// What a data directory's files take. Internal to storage/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckpt {

// Bytes of the regular files under `dir`, subdirectories included (apparent sizes: what the
// files hold). A file removed while the walk passes it (an upload's spool, a compaction's
// input) is skipped; nullopt when the directory cannot be read.
std::optional<uint64_t> DirectoryBytes(const std::string& dir);

}  // namespace ckpt
