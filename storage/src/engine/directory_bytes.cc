// What a data directory's files take (directory_bytes.h).
#include "engine/directory_bytes.h"

#include <filesystem>
#include <system_error>

namespace ckpt {

std::optional<uint64_t> DirectoryBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(
      dir, std::filesystem::directory_options::skip_permission_denied, ec);
  for (; !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const uint64_t size = it->file_size(size_ec);
    if (!size_ec) bytes += size;
  }
  if (ec) return std::nullopt;
  return bytes;
}

}  // namespace ckpt
