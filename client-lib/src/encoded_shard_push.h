// What coding one shard of a sharded version on the client came to (Client::PushShardEncoded),
// and where its reference is kept. Internal to client-lib.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/client/client.h"

namespace ckpt {

struct ShardCoding {
  nlohmann::json answer;  // the shard PUT's answer
  bool encoded = false;   // coded here (else sent for the server to code)
  uint64_t sent_bytes = 0;
  // How the reference came: "" (none needed), "held", "pulled"; or why the server coded it.
  std::string reference;
};

// The name a rank's reference is kept under in a reference directory: its part of the model's
// last version, for `index` of `count` ranks (as the Python client names it).
std::string ShardReferenceName(std::string_view model, uint32_t index, uint32_t count);

}  // namespace ckpt
