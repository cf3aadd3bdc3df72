// The push session: a safetensors body streamed in, cut into chunks, handed to the encoder
// (push_encoder.h) and committed as one version in one atomic change of the model's metadata.
// Internal to storage/; the protocol is in docs/design.md ("Push").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/storage/checkpoint_store.h"
#include "ckpt/storage/codec_policy.h"
#include "ckpt/storage/retention.h"
#include "context/store_context.h"
#include "records/records.h"
#include "uploads/shard_assembly.h"
#include "write/model_locks.h"
#include "write/model_writer.h"
#include "write/push_target.h"

namespace ckpt {

// Checks what a push carries besides its body (metric and label names and values, tags).
Status ValidatePushOptions(const PushOptions& options);

// Begins a push of `version` of `model`: checks the options and the room for
// `body_size` bytes, takes the model's write lock (Aborted if another writer still holds it
// after `wait`), and reads where the push goes. The front's BeginPush, and the commit of a
// sharded version.
Result<std::unique_ptr<PushSession>> BeginPushSession(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait = {});

// Begins the push of a sharded version that its commit feeds chunk by chunk (some shards coded
// by their ranks): as BeginPushSession. Every chunk record is decoded (whatever
// options.decode_encoded_payloads says): the version's restored digest is computed from them.
Result<std::unique_ptr<ChunkedPush>> BeginChunkedPush(const StoreContext& ctx, ModelWriter& writer,
                                                      const ModelName& model, uint64_t version,
                                                      std::optional<uint64_t> body_size,
                                                      const PushOptions& options,
                                                      std::chrono::milliseconds wait = {});

// A push holding `guard` (the model's write lock) until it is committed or destroyed.
std::unique_ptr<PushSession> NewPushSession(const StoreContext& ctx, ModelLocks::Guard guard,
                                            PushTarget target, std::optional<uint64_t> body_size,
                                            PushOptions options);

}  // namespace ckpt
