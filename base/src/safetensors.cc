#include "ckpt/base/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace ckpt {
namespace {

using nlohmann::json;

constexpr size_t kLengthPrefixBytes = 8;
// The JSON schema of safetensors caps integers at 2^48 - 1.
constexpr uint64_t kMaxJsonInteger = (uint64_t{1} << 48) - 1;

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void StoreLittleEndian64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Status Invalid(std::string msg) {
  return Status::InvalidArgument("safetensors: " + std::move(msg));
}

Result<uint64_t> ReadUnsigned(const json& v, const std::string& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return Invalid(what + " must be a non-negative integer");
  }
  uint64_t n = v.get<uint64_t>();
  if (n > kMaxJsonInteger) return Invalid(what + " exceeds 2^48-1");
  return n;
}

Result<TensorInfo> ParseTensorEntry(const std::string& name, const json& entry) {
  const std::string where = "tensor '" + name + "'";
  if (!entry.is_object()) return Invalid(where + ": entry must be a JSON object");
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Invalid(where + ": missing string field 'dtype'");
  }
  auto dtype = DTypeFromName(dtype_it->get<std::string>());
  if (!dtype) return Invalid(where + ": unknown dtype '" + dtype_it->get<std::string>() + "'");
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Invalid(where + ": missing array field 'shape'");
  }
  for (const auto& dim : *shape_it) {
    CKPT_ASSIGN_OR_RETURN(uint64_t d, ReadUnsigned(dim, where + ": shape dimension"));
    info.shape.push_back(d);
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return Invalid(where + ": 'data_offsets' must be an array [begin, end]");
  }
  CKPT_ASSIGN_OR_RETURN(info.begin, ReadUnsigned((*offsets_it)[0], where + ": data_offsets[0]"));
  CKPT_ASSIGN_OR_RETURN(info.end, ReadUnsigned((*offsets_it)[1], where + ": data_offsets[1]"));
  if (info.end < info.begin) {
    return Invalid(where + ": data_offsets end " + std::to_string(info.end) + " < begin " +
                   std::to_string(info.begin));
  }

  uint64_t bytes = DTypeSize(info.dtype);
  for (uint64_t d : info.shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      return Invalid(where + ": shape size overflows");
    }
  }
  if (bytes != info.byte_size()) {
    return Invalid(where + ": shape and dtype " + std::string(DTypeName(info.dtype)) + " need " +
                   std::to_string(bytes) + " bytes but data_offsets span " +
                   std::to_string(info.byte_size()));
  }
  return info;
}

// Tracks the keys of every open JSON object while a SAX pass reads the header, to detect
// duplicates, which nlohmann::json would otherwise silently collapse. (A parse callback could do
// the same, but nlohmann 3.11's callback parser scans the enclosing object at the end of every
// nested one: quadratic in the number of tensors.)
class DuplicateKeyDetector final : public json::json_sax_t {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_objects_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!open_objects_.back().insert(key).second && duplicate_.empty()) duplicate_ = key;
    return true;
  }
  bool end_object() override {
    open_objects_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    error_ = e.what();
    return false;
  }

  const std::string& duplicate() const { return duplicate_; }
  const std::string& error() const { return error_; }

 private:
  std::vector<std::set<std::string>> open_objects_;
  std::string duplicate_;
  std::string error_;
};

}  // namespace

uint64_t TensorInfo::element_count() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view text,
                                                 std::optional<uint64_t> body_size) {
  if (text.empty() || text.front() != '{') {
    return Invalid("header JSON must start with '{'");
  }
  DuplicateKeyDetector detector;
  if (!json::sax_parse(text.begin(), text.end(), &detector)) {
    return Invalid("invalid header JSON: " + detector.error());
  }
  if (!detector.duplicate().empty()) {
    return Invalid("duplicate key '" + detector.duplicate() + "' in header");
  }
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // the SAX pass accepted it: not expected
    return Invalid(std::string("invalid header JSON: ") + e.what());
  }
  if (!doc.is_object()) return Invalid("header must be a JSON object");

  SafetensorsHeader header;
  header.json_size = text.size();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid("'__metadata__' must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Invalid("'__metadata__' value for key '" + m.key() + "' is not a string");
        }
        header.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(it.key(), *it));
    header.tensors.push_back(std::move(info));
  }

  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t expected = 0;
  const TensorInfo* previous = nullptr;
  for (const auto& t : header.tensors) {
    if (t.begin < expected) {
      return Invalid("tensor '" + t.name + "' at [" + std::to_string(t.begin) + ", " +
                     std::to_string(t.end) + ") overlaps tensor '" + previous->name + "'");
    }
    if (t.begin > expected) {
      return Invalid("hole in data buffer at [" + std::to_string(expected) + ", " +
                     std::to_string(t.begin) + ") before tensor '" + t.name + "'");
    }
    expected = t.end;
    previous = &t;
  }
  header.data_size = expected;

  if (body_size) {
    if (header.total_size() > *body_size) {
      return Invalid("tensor data runs past the end of the body: header describes " +
                     std::to_string(header.total_size()) + " bytes, body has " +
                     std::to_string(*body_size));
    }
    if (header.total_size() < *body_size) {
      return Invalid("body has " + std::to_string(*body_size - header.total_size()) +
                     " trailing bytes after the last tensor");
    }
  }
  return header;
}

SafetensorsStreamParser::SafetensorsStreamParser(SafetensorsSink* sink,
                                                 std::optional<uint64_t> body_size,
                                                 uint64_t max_header_bytes)
    : sink_(sink), body_size_(body_size), max_header_bytes_(max_header_bytes) {}

Status SafetensorsStreamParser::Feed(std::span<const uint8_t> bytes) {
  if (!failed_.ok()) return failed_;
  Status s;
  while (s.ok() && !bytes.empty()) {
    s = header_ ? FeedData(bytes) : FeedHeader(bytes);
  }
  if (!s.ok()) failed_ = s;
  return s;
}

Status SafetensorsStreamParser::FeedHeader(std::span<const uint8_t>& bytes) {
  size_t want = kLengthPrefixBytes;
  if (raw_header_.size() >= kLengthPrefixBytes) {
    want += LoadLittleEndian64(raw_header_.data());
  }
  size_t take = std::min(bytes.size(), want - raw_header_.size());
  raw_header_.append(reinterpret_cast<const char*>(bytes.data()), take);
  bytes = bytes.subspan(take);
  consumed_ += take;

  if (raw_header_.size() == kLengthPrefixBytes) {
    uint64_t n = LoadLittleEndian64(raw_header_.data());
    if (n > max_header_bytes_) {
      return Invalid("header length " + std::to_string(n) + " exceeds the limit of " +
                     std::to_string(max_header_bytes_) + " bytes");
    }
    if (body_size_ && kLengthPrefixBytes + n > *body_size_) {
      return Invalid("header length " + std::to_string(n) + " is larger than the body (" +
                     std::to_string(*body_size_) + " bytes)");
    }
    if (n == 0) return Invalid("header JSON must start with '{'");
    raw_header_.reserve(kLengthPrefixBytes + n);
    return Status::Ok();
  }
  if (raw_header_.size() < kLengthPrefixBytes ||
      raw_header_.size() < kLengthPrefixBytes + LoadLittleEndian64(raw_header_.data())) {
    return Status::Ok();
  }
  std::string_view json_text(raw_header_);
  json_text.remove_prefix(kLengthPrefixBytes);
  CKPT_ASSIGN_OR_RETURN(header_, ParseSafetensorsHeader(json_text, body_size_));
  CKPT_RETURN_IF_ERROR(sink_->OnHeader(*header_, raw_header_));
  std::string().swap(raw_header_);
  return EmitEmptyTensorsFrom(0);
}

Status SafetensorsStreamParser::EmitEmptyTensorsFrom(size_t index) {
  tensor_index_ = index;
  tensor_offset_ = 0;
  while (tensor_index_ < header_->tensors.size() &&
         header_->tensors[tensor_index_].byte_size() == 0) {
    CKPT_RETURN_IF_ERROR(sink_->OnTensorEnd(tensor_index_));
    ++tensor_index_;
  }
  return Status::Ok();
}

Status SafetensorsStreamParser::FeedData(std::span<const uint8_t>& bytes) {
  if (tensor_index_ >= header_->tensors.size()) {
    return Invalid("body has trailing bytes after the last tensor (" +
                   std::to_string(header_->total_size()) + " bytes expected)");
  }
  const TensorInfo& t = header_->tensors[tensor_index_];
  uint64_t take = std::min<uint64_t>(bytes.size(), t.byte_size() - tensor_offset_);
  CKPT_RETURN_IF_ERROR(sink_->OnTensorData(tensor_index_, bytes.first(take)));
  bytes = bytes.subspan(take);
  consumed_ += take;
  tensor_offset_ += take;
  if (tensor_offset_ == t.byte_size()) {
    CKPT_RETURN_IF_ERROR(sink_->OnTensorEnd(tensor_index_));
    return EmitEmptyTensorsFrom(tensor_index_ + 1);
  }
  return Status::Ok();
}

Status SafetensorsStreamParser::Finish() {
  if (!failed_.ok()) return failed_;
  if (!header_) {
    failed_ = Invalid("body truncated inside the header (" + std::to_string(consumed_) +
                      " bytes received)");
    return failed_;
  }
  if (tensor_index_ < header_->tensors.size()) {
    failed_ = Invalid("body truncated: " + std::to_string(consumed_) + " of " +
                      std::to_string(header_->total_size()) + " bytes received, tensor '" +
                      header_->tensors[tensor_index_].name + "' incomplete");
    return failed_;
  }
  return Status::Ok();
}

Result<std::string> WriteSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  json doc = json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return Status::InvalidArgument("safetensors writer: duplicate or reserved name '" + t.name +
                                     "'");
    }
    uint64_t bytes = DTypeSize(t.dtype);
    for (uint64_t d : t.shape) bytes *= d;
    doc[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(kLengthPrefixBytes, '\0');
  StoreLittleEndian64(text.size(), out.data());
  out += text;
  return out;
}

Result<std::string> WriteSafetensors(const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = DTypeSize(t.dtype);
    for (uint64_t d : t.shape) bytes *= d;
    if (bytes != t.data.size()) {
      return Status::InvalidArgument("safetensors writer: tensor '" + t.name + "' needs " +
                                     std::to_string(bytes) + " bytes, got " +
                                     std::to_string(t.data.size()));
    }
    data_bytes += bytes;
  }
  CKPT_ASSIGN_OR_RETURN(std::string out, WriteSafetensorsHeader(tensors, metadata));
  out.reserve(out.size() + data_bytes);
  for (const auto& t : tensors) out.append(t.data);
  return out;
}

Result<SafetensorsHeader> ParseRawSafetensorsHeader(std::string_view raw_header) {
  if (raw_header.size() < 8) {
    return Status::InvalidArgument("safetensors header: " + std::to_string(raw_header.size()) +
                                   " bytes, shorter than its 8-byte length prefix");
  }
  uint64_t json_size = 0;
  for (int i = 7; i >= 0; --i) {
    json_size = (json_size << 8) | static_cast<uint8_t>(raw_header[static_cast<size_t>(i)]);
  }
  if (json_size != raw_header.size() - 8) {
    return Status::InvalidArgument("safetensors header: its length prefix says " +
                                   std::to_string(json_size) + " bytes of JSON, " +
                                   std::to_string(raw_header.size() - 8) + " follow");
  }
  return ParseSafetensorsHeader(raw_header.substr(8), std::nullopt);
}

}  // namespace ckpt
