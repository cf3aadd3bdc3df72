// ModelWriter: every change of a model's metadata apart from a push's commit — deleting
// versions and models, tags, codec and retention policies, retention runs, garbage collection,
// the rearrangement of the newest versions —
// each under the model's write lock, and the write preamble a push starts with. Internal to
// storage/.
//
// Thread safety: safe for concurrent use (the model locks and StoreContext::tags_mu serialize
// what must be).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>

#include "chains/model_chains.h"
#include "ckpt/base/model_name.h"
#include "ckpt/storage/checkpoint_store.h"
#include "ckpt/storage/retention.h"
#include "context/store_context.h"
#include "maintenance/maintenance.h"
#include "records/records.h"
#include "write/model_locks.h"

namespace ckpt {

class ModelWriter {
 public:
  ModelWriter(const StoreContext& ctx, StoreMaintenance* maintenance)
      : ctx_(ctx), maintenance_(maintenance) {}

  // The write preamble: the engine taking writes, the model's lock (Aborted while another writer
  // holds it, after waiting up to `wait`) and, on a shared backend, the right to write the model.
  Result<ModelLocks::Guard> LockForWrite(const ModelName& model,
                                         std::chrono::milliseconds wait = {});
  // LockForWrite for a push of `incoming_bytes`, which must also fit beside the volume's
  // reserve.
  Result<ModelLocks::Guard> LockForPush(const ModelName& model, uint64_t incoming_bytes,
                                        std::chrono::milliseconds wait);
  // ModelLocks::CallOnRelease of the model's lock.
  bool CallOnRelease(std::string_view model, std::function<void()> on_release) {
    return locks_.CallOnRelease(model, std::move(on_release));
  }

  // FailedPrecondition when the store already holds storage.max_models models.
  Status CheckModelLimit();
  // The model's retention policy (the server default when it has none of its own).
  Result<RetentionPolicy> RetentionOf(const ModelRecord& record) const;

  Status DeleteVersion(const ModelName& model, uint64_t version);
  Status DeleteModel(const ModelName& model);
  Status SetTag(const ModelName& model, std::string_view tag, uint64_t version);
  Status RemoveTag(const ModelName& model, std::string_view tag);
  Result<uint64_t> ResolveTag(const ModelName& model, std::string_view tag);
  // Applies `change` to the model's record under its lock, creating the model (without
  // versions) if needed.
  Status UpdateModelRecord(const ModelName& model, std::string_view what,
                           const std::function<void(ModelRecord&)>& change);
  Result<RetentionReport> ApplyRetention(const ModelName& model, const RetentionRun& run);
  Result<GcReport> CollectGarbage(const ModelName& model, const GcOptions& options);
  // CheckpointStore::RearrangeLatest, then the reclaiming of the space it freed.
  Result<RearrangeReport> RearrangeLatest(const ModelName& model,
                                          const std::function<bool()>& cancelled);

 private:
  // The model's lock, waiting up to `wait` for it.
  Result<ModelLocks::Guard> Lock(const ModelName& model, std::chrono::milliseconds wait);
  // The write preamble with `check_health` (run before the wait and again after one: the writer
  // waited for may have failed or filled the volume).
  Result<ModelLocks::Guard> LockChecked(const ModelName& model, std::chrono::milliseconds wait,
                                        const std::function<Status()>& check_health);
  // The tensors (manifest indices) that `report`'s tensor rules drop from each kept version,
  // also listed by name in report.tensors_dropped.
  static Result<std::map<uint64_t, std::vector<uint32_t>>> TensorsToDrop(const ModelChains& chains,
                                                                         RetentionReport& report);
  // Drops them, one committed version at a time; `chains` follows, and `report` loses the
  // versions that keep their tensors after all (tagged meanwhile, or not restorable: problems).
  Status DropTensors(ModelChains& chains, const std::map<uint64_t, std::vector<uint32_t>>& drops,
                     RetentionReport& report);

  const StoreContext& ctx_;
  StoreMaintenance* const maintenance_;
  ModelLocks locks_;
};

}  // namespace ckpt
