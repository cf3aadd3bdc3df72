// RocksDB's log into the daemon's (engine_logger.h).
#include "engine/engine_logger.h"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>

namespace ckpt {
namespace {

class EngineLogger final : public rocksdb::Logger {
 public:
  EngineLogger(rocksdb::InfoLogLevel level, std::function<void(std::string_view)> sink)
      : rocksdb::Logger(level), sink_(std::move(sink)) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    const int n = std::vsnprintf(line, sizeof line, format, ap);
    if (n < 0) return;
    std::string_view text(line, std::min<size_t>(static_cast<size_t>(n), sizeof line - 1));
    while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
    if (sink_) {
      sink_(text);
    } else {
      std::fprintf(stderr, "rocksdb: %.*s\n", static_cast<int>(text.size()), text.data());
    }
  }

 private:
  const std::function<void(std::string_view)> sink_;
};

}  // namespace

std::shared_ptr<rocksdb::Logger> NewEngineLogger(rocksdb::InfoLogLevel level,
                                                 std::function<void(std::string_view)> sink) {
  return std::make_shared<EngineLogger>(level, std::move(sink));
}

}  // namespace ckpt
