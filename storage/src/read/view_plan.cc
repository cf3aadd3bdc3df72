// What a restore of part of a version sends (view_plan.h).
#include "read/view_plan.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/codec/tensor_patterns.h"
#include "uploads/shard_assembly.h"

namespace ckpt {
namespace {

using nlohmann::json;

// The dimension a tensor was pushed split along, per the version's layout: the one dimension
// in which its slices differ (-1 when it was pushed whole or split in several dimensions).
int SplitDimension(const json& layout, const std::string& name, size_t rank) {
  if (!layout.is_object() || !layout.contains("tensors")) return -1;
  const json& tensors = layout["tensors"];
  auto it = tensors.find(name);
  if (it == tensors.end() || !it->contains("slices")) return -1;
  int dim = -1;
  std::vector<std::vector<uint64_t>> seen;
  for (const json& slice : (*it)["slices"]) {
    const auto offsets = slice.value("offsets", std::vector<uint64_t>{});
    if (offsets.size() != rank) return -1;
    if (std::find(seen.begin(), seen.end(), offsets) != seen.end()) continue;  // a replica
    seen.push_back(offsets);
    for (size_t d = 0; d < rank; ++d) {
      if (offsets[d] == 0) continue;
      if (dim >= 0 && dim != static_cast<int>(d)) return -1;
      dim = static_cast<int>(d);
    }
  }
  return seen.size() > 1 ? dim : -1;
}

bool MatchesAny(const std::vector<std::string>& patterns, const std::string& name) {
  if (patterns.empty()) return true;
  return FirstMatchingPattern(patterns, name) >= 0;
}

// Whether `selection` (tensor patterns, exact names) admits tensor `name`.
bool Selected(const RestoreSelection& selection, const std::string& name) {
  if (selection.tensors.empty() && selection.names.empty()) return true;
  if (std::find(selection.names.begin(), selection.names.end(), name) != selection.names.end()) {
    return true;
  }
  return !selection.tensors.empty() && MatchesAny(selection.tensors, name);
}

}  // namespace

Result<SafetensorsHeader> StoredHeaderOf(const VersionRecord& record) {
  if (record.raw_header.size() < 8) return Status::DataLoss("stored header is too short");
  return ParseSafetensorsHeader(std::string_view(record.raw_header).substr(8), std::nullopt);
}

Result<ViewPlan> PlanView(const ManifestRecord& manifest, const VersionRecord& record,
                          uint64_t version, const RestoreSelection& selection) {
  if (selection.ranks > 0 && selection.rank >= selection.ranks) {
    return Status::InvalidArgument("rank " + std::to_string(selection.rank) +
                                   " is not below the rank count " +
                                   std::to_string(selection.ranks));
  }
  ViewPlan plan;
  CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, StoredHeaderOf(record));
  json layout;
  if (auto it = header.metadata.find(std::string(kLayoutMetadataKey));
      it != header.metadata.end()) {
    layout = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  }
  std::map<std::string, SliceDeclaration> slices;
  std::vector<TensorSpec> specs;
  size_t dropped_matches = 0;  // tensors the selection names that retention dropped
  for (uint32_t i = 0; i < manifest.tensors.size(); ++i) {
    const ManifestTensor& t = manifest.tensors[i];
    if (record.Dropped(i)) {  // not in the version any more
      const bool named =
          selection.box ? selection.box->first == t.name : Selected(selection, t.name);
      if (named) ++dropped_matches;
      continue;
    }
    ViewTensor v;
    v.tensor = i;
    v.box.offsets.assign(t.shape.size(), 0);
    v.box.shape = t.shape;
    if (selection.box) {
      if (selection.box->first != t.name) continue;
      v.box = selection.box->second;
      CKPT_RETURN_IF_ERROR(CheckBoxWithin(t.name, v.box, t.shape));
    } else if (!Selected(selection, t.name)) {
      continue;
    } else if (selection.ranks > 0) {
      const int dim = SplitDimension(layout, t.name, t.shape.size());
      if (dim >= 0) {
        auto [offset, length] = SplitExtent(t.shape[dim], selection.rank, selection.ranks);
        v.box.offsets[dim] = offset;
        v.box.shape[dim] = length;
      }
    }
    v.whole = v.box.shape == t.shape;
    if (!v.whole) slices[t.name] = SliceDeclaration{t.shape, v.box.offsets};
    specs.push_back(TensorSpec{t.name, t.dtype, v.box.shape, {}});
    plan.body_bytes += v.box.element_count() * DTypeSize(t.dtype);
    plan.tensors.push_back(std::move(v));
  }
  if (plan.tensors.empty() && dropped_matches > 0) {
    return Status::NotFound(
        "version " + std::to_string(version) + " no longer holds " +
        (selection.box
             ? "tensor '" + selection.box->first + "'"
             : "the " + std::to_string(dropped_matches) + " tensor(s) the selection names") +
        ": retention's tensor rules dropped them (the latest and tagged versions keep every "
        "tensor; GET .../versions/" +
        std::to_string(version) + "?detail=1 marks what was dropped)");
  }
  if (plan.tensors.empty()) {
    return selection.box
               ? Status::NotFound("version " + std::to_string(version) + " has no tensor '" +
                                  selection.box->first + "'")
               : Status::InvalidArgument("no tensor of version " + std::to_string(version) +
                                         " matches the selection");
  }
  std::map<std::string, std::string> metadata = header.metadata;
  metadata.erase(std::string(kLayoutMetadataKey));
  if (!slices.empty()) {
    metadata[std::string(kSlicesMetadataKey)] = SliceDeclarationsJson(slices);
  }
  CKPT_ASSIGN_OR_RETURN(plan.raw_header, WriteSafetensorsHeader(specs, metadata));
  plan.body_bytes += plan.raw_header.size();
  return plan;
}

}  // namespace ckpt
