#include "output.h"

#include <algorithm>

namespace ckpt::cli {
namespace {

// Columns a UTF-8 string takes on a terminal (one per code point: the CLI prints no wide
// characters).
size_t DisplayWidth(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::string Ratio(uint64_t raw_bytes, uint64_t stored_bytes) {
  if (stored_bytes == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx",
                static_cast<double>(raw_bytes) / static_cast<double>(stored_bytes));
  return buf;
}

std::string ShortHash(std::string_view sha256_hex) { return std::string(sha256_hex.substr(0, 12)); }

std::string ShortTime(std::string_view iso8601) {
  // "YYYY-MM-DDTHH:MM..." -> "YYYY-MM-DD HH:MM"
  if (iso8601.size() < 16 || iso8601[10] != 'T') return std::string(iso8601);
  std::string out(iso8601.substr(0, 16));
  out[10] = ' ';
  return out;
}

std::string CellText(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "-";
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> widths;
  for (const Column& c : columns_) widths.push_back(DisplayWidth(c.title));
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  }
  const auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const std::string cell = i < cells.size() ? cells[i] : std::string();
      const std::string pad(widths[i] - DisplayWidth(cell), ' ');
      if (i > 0) line += "  ";
      const bool last = i + 1 == columns_.size();
      line += columns_[i].numeric ? pad + cell : last ? cell : cell + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
    std::fprintf(out, "%s\n", line.c_str());
  };
  std::vector<std::string> titles;
  for (const Column& c : columns_) titles.push_back(c.title);
  print_row(titles);
  for (const auto& row : rows_) print_row(row);
}

void PrintJson(const nlohmann::json& doc) {
  std::printf("%s\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace ckpt::cli
