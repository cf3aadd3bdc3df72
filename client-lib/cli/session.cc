#include <iostream>

#include "command.h"

namespace ckpt::cli {

Result<Client*> Session::client() {
  if (!client_) {
    auto made = Client::Create(options_);
    if (!made.ok()) return made.status();
    client_.emplace(std::move(made).value());
  }
  return &*client_;
}

int Fail(const Status& status) {
  std::cerr << "ckpt: " << status.message() << " (" << StatusCodeName(status.code()) << ")\n";
  return kExitFailed;
}

}  // namespace ckpt::cli

namespace ckpt::cli {

Result<nlohmann::json> ParseJsonAnswer(const Result<std::string>& text) {
  if (!text.ok()) return text.status();
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  if (doc.is_discarded()) return Status::DataLoss("the server's answer is not JSON");
  return doc;
}

}  // namespace ckpt::cli
