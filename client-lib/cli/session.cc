#include "session.h"

namespace ckpt::cli {

Result<Client*> Session::client() {
  if (!client_) {
    auto made = Client::Create(options_);
    if (!made.ok()) return made.status();
    client_.emplace(std::move(made).value());
  }
  return &*client_;
}

}  // namespace ckpt::cli
