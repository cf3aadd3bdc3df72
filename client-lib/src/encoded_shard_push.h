// What coding one shard of a sharded version on the client came to (Client::PushShardEncoded),
// and where its reference is kept. Internal to client-lib.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/client/client.h"
#include "ckpt/codec/edge_encoder.h"
#include "put_stream.h"

namespace ckpt {

struct ShardCoding {
  nlohmann::json answer;  // the shard PUT's answer
  bool encoded = false;   // coded here (else sent for the server to code)
  uint64_t sent_bytes = 0;
  // How the reference came: "" (none needed, or coded by the server), "held", "pulled"; and in
  // words why the server coded the shard, or that its part could not be kept as a reference.
  std::string reference;
  std::string reference_note;
};

// One shard as a push reads it: its tensors where they lie (in the mapped source file, not
// copied), and its whole body for the server to code when it is not coded here.
struct ShardInput {
  const CheckpointView& view;
  std::function<PutBody()> plain_body;  // each call: a reader from the body's first byte
};

// The name a rank's reference is kept under in a reference directory: its part of the model's
// last version, for `index` of `count` ranks (as the Python client names it).
std::string ShardReferenceName(std::string_view model, uint32_t index, uint32_t count);

// Removes from `dir` the rank references of `model` kept for another rank count than `count`
// (their files and sidecars): once a version of `count` shards is committed they hold parts of
// older versions, which no push codes against. A reference another process holds is left.
// Best effort: returns how many were removed.
size_t ForgetOtherRankCounts(const std::string& dir, std::string_view model, uint32_t count);

}  // namespace ckpt
