// The helpers every command of the ckpt CLI uses to end: errors on one line, JSON answers.
#include "command.h"

#include <iostream>

namespace ckpt::cli {

int Fail(const Status& status) {
  std::cerr << "ckpt: " << status.message() << " (" << StatusCodeName(status.code()) << ")\n";
  return kExitFailed;
}

int Usage(const std::string& message) {
  std::cerr << "ckpt: " << message << " (--help says more)\n";
  return kExitUsage;
}

Result<nlohmann::json> ParseJsonAnswer(const Result<std::string>& text) {
  if (!text.ok()) return text.status();
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  if (doc.is_discarded()) return Status::DataLoss("the server's answer is not JSON");
  return doc;
}

}  // namespace ckpt::cli
