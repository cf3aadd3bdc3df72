// The store's read queries over the metadata families: models, versions, tags and what a
// client sees of them. Internal to storage/. Free functions of a StoreContext and read options
// (pass a snapshot's for a consistent view); safe for concurrent use.
#pragma once

#include <rocksdb/db.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"
#include "records/records.h"

namespace ckpt {

// What a client sees of a version and of a model.
VersionInfo MakeVersionInfo(std::string_view model, uint64_t version, const VersionRecord& r);
ModelInfo MakeModelInfo(std::string_view model, const ModelRecord& r);

// The model's record; NotFound when there is no such model.
Result<ModelRecord> RequireModel(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                 std::string_view model);

// A version and its record (`version` unset: the latest); NotFound when there is none.
Result<std::pair<uint64_t, VersionRecord>> FindVersion(const StoreContext& ctx,
                                                       const rocksdb::ReadOptions& ro,
                                                       std::string_view model,
                                                       std::optional<uint64_t> version);

// The version just older than `version` and its record, if there is one.
Result<std::optional<std::pair<uint64_t, VersionRecord>>> FindVersionBefore(
    const StoreContext& ctx, const rocksdb::ReadOptions& ro, std::string_view model,
    uint64_t version);

// Every tag of `model`, by the version it names (names sorted).
Result<std::map<uint64_t, std::vector<std::string>>> TagsByVersion(const StoreContext& ctx,
                                                                   const rocksdb::ReadOptions& ro,
                                                                   std::string_view model);

// Every version of `model`, oldest first, with its tags.
Result<std::vector<VersionInfo>> ListVersionsAt(const StoreContext& ctx,
                                                const rocksdb::ReadOptions& ro,
                                                std::string_view model);

// Every model (the cluster's index when the backend keeps one).
Result<std::vector<ModelInfo>> ListAllModels(const StoreContext& ctx);

// A version with its tensors' coding (ro must read at `snapshot`).
Result<VersionDetail> VersionDetailAt(const StoreContext& ctx, const rocksdb::ReadOptions& ro,
                                      std::string_view model, std::optional<uint64_t> version);

}  // namespace ckpt
