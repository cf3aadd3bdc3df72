// The status page (GET /): one self-contained HTML document — inline CSS and SVG, no script,
// nothing fetched from elsewhere — rendered from the store on each request. Internal to api/;
// ApiHandler serves it.
//
// It shows every model the caller may see (name prefix), most recently pushed first, with
// versions, raw and stored bytes and ratio, policy, retention and tags; for each model (the
// kMaxModelSections most recent on the overview, or the one named by ?model=, which every
// model's name links to) a chart of stored bytes per version, a chart of cumulative raw against
// stored bytes (the savings), and the newest versions with kind, error bound and tags.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::api {

struct StatusPageOptions {
  std::string model;         // show only this model (?model=); empty: the overview
  std::string model_prefix;  // the caller sees only models whose names start with it
  int64_t now_ms = 0;        // the time printed on the page; 0: now
};

// Models given a section with charts on the overview (the rest are listed with links).
inline constexpr size_t kMaxModelSections = 12;
// Newest versions charted and listed per model: on the overview, and for a single model.
inline constexpr size_t kOverviewVersions = 100;
inline constexpr size_t kSingleModelVersions = 1000;

// NotFound when options.model names no model the caller may see.
Result<std::string> RenderStatusPage(CheckpointStore& store, const StatusPageOptions& options);

// The page answered with 404 for a ?model= that names no model the caller may see: `message`
// and a link to the overview.
std::string RenderNotFoundPage(std::string_view message);

}  // namespace ckpt::api
