// Whole-store maintenance passes (ckpt/storage/maintenance_service.h).
#include "ckpt/storage/maintenance_service.h"

#include <algorithm>

namespace ckpt {

size_t GcPassReport::failures() const {
  return static_cast<size_t>(
      std::count_if(models.begin(), models.end(), [](const Model& m) { return !m.status.ok(); }));
}

bool ScrubPassReport::clean() const {
  return std::all_of(models.begin(), models.end(), [](const ScrubReport& r) { return r.clean(); });
}

Result<GcPassReport> MaintenanceService::CollectAll(std::chrono::milliseconds lock_wait) {
  CKPT_ASSIGN_OR_RETURN(const std::vector<ModelInfo> models, store_->ListModels());
  GcPassReport pass;
  RetentionRun run;
  run.lock_wait = lock_wait;
  for (const ModelInfo& m : models) {
    GcPassReport::Model& entry = pass.models.emplace_back();
    entry.name = m.name;
    auto report = store_->ApplyRetention(m.name, run);
    if (!report.ok()) {
      entry.status = report.status();
      continue;
    }
    pass.deleted_versions += report->deleted.size();
    pass.bytes_freed += report->gc.bytes_freed;
    pass.bytes_reclaimed += report->gc.bytes_reclaimed;
    entry.report = std::move(*report);
  }
  return pass;
}

Result<ScrubPassReport> MaintenanceService::ScrubAll() {
  CKPT_ASSIGN_OR_RETURN(const std::vector<ModelInfo> models, store_->ListModels());
  ScrubPassReport pass;
  for (const ModelInfo& m : models) {
    auto report = store_->Scrub(m.name);
    if (!report.ok()) {
      if (report.status().code() == StatusCode::kNotFound) continue;  // deleted meanwhile
      return report.status();
    }
    pass.models.push_back(std::move(*report));
  }
  return pass;
}

}  // namespace ckpt
