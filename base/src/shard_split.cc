#include "ckpt/base/shard_split.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "ckpt/base/tensor_slices.h"

namespace ckpt {
namespace {

// A part of a source tensor given to one shard: rows [row_begin, row_end) of it (all rows when
// whole).
struct Part {
  size_t tensor = 0;  // index in header.tensors
  uint64_t row_begin = 0;
  uint64_t row_end = 0;
  bool cut = false;
};

}  // namespace

Result<std::vector<ShardBodyPlan>> SplitIntoShards(const SafetensorsHeader& header,
                                                   uint32_t count) {
  if (count == 0 || count > 65536) {
    return Status::InvalidArgument("a push is split into 1 to 65536 shards, not " +
                                   std::to_string(count));
  }
  CKPT_ASSIGN_OR_RETURN(auto declared, ParseSliceDeclarations(header.metadata));
  const std::vector<TensorInfo>& tensors = header.tensors;
  const double share = static_cast<double>(header.data_size) / count;

  std::vector<size_t> by_size(tensors.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
    return tensors[a].byte_size() > tensors[b].byte_size();
  });
  std::vector<std::vector<Part>> parts(count);
  std::vector<uint64_t> loads(count, 0);
  for (size_t t : by_size) {
    const TensorInfo& info = tensors[t];
    const uint64_t rows = info.shape.empty() ? 0 : info.shape[0];
    if (static_cast<double>(info.byte_size()) > share && count > 1 && rows >= count) {
      const uint64_t row_bytes = info.byte_size() / rows;
      uint64_t row = 0;
      for (uint32_t i = 0; i < count; ++i) {
        const uint64_t extent = rows / count + (i < rows % count ? 1 : 0);
        parts[i].push_back({t, row, row + extent, true});
        loads[i] += extent * row_bytes;
        row += extent;
      }
    } else {
      const size_t i =
          static_cast<size_t>(std::min_element(loads.begin(), loads.end()) - loads.begin());
      parts[i].push_back({t, 0, rows, false});
      loads[i] += info.byte_size();
    }
  }

  const uint64_t data_start = 8 + header.json_size;
  std::vector<ShardBodyPlan> plans(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::sort(parts[i].begin(), parts[i].end(),
              [](const Part& a, const Part& b) { return a.tensor < b.tensor; });
    std::vector<TensorSpec> specs;
    std::map<std::string, SliceDeclaration> slices;
    ShardBodyPlan& plan = plans[i];
    for (const Part& part : parts[i]) {
      const TensorInfo& info = tensors[part.tensor];
      TensorSpec spec{info.name, info.dtype, info.shape, {}};
      uint64_t begin = info.begin, end = info.end;
      auto own = declared.find(info.name);
      if (part.cut) {
        const uint64_t row_bytes = info.byte_size() / info.shape[0];
        begin = info.begin + part.row_begin * row_bytes;
        end = info.begin + part.row_end * row_bytes;
        spec.shape[0] = part.row_end - part.row_begin;
        SliceDeclaration slice;
        if (own != declared.end()) {
          slice = own->second;
          if (!slice.offsets.empty()) slice.offsets[0] += part.row_begin;
        } else {
          slice.global_shape = info.shape;
          slice.offsets.assign(info.shape.size(), 0);
          slice.offsets[0] = part.row_begin;
        }
        slices[info.name] = std::move(slice);
      } else if (own != declared.end()) {
        slices[info.name] = own->second;
      }
      specs.push_back(std::move(spec));
      if (end > begin) plan.ranges.push_back({data_start + begin, data_start + end});
    }
    std::map<std::string, std::string> metadata;
    if (i == 0) metadata = header.metadata;
    metadata.erase(std::string(kSlicesMetadataKey));
    if (!slices.empty()) metadata[std::string(kSlicesMetadataKey)] = SliceDeclarationsJson(slices);
    CKPT_ASSIGN_OR_RETURN(plan.header, WriteSafetensorsHeader(specs, metadata));
    plan.size = plan.header.size();
    for (const BodyRange& r : plan.ranges) plan.size += r.end - r.begin;
  }
  return plans;
}

}  // namespace ckpt
