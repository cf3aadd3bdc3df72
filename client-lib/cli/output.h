// How the ckpt CLI prints: tables for people, JSON for scripts (--json), byte counts and hashes
// shortened for reading.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::cli {

// "1.5 MiB"; bytes below 1 KiB exactly ("512 B").
std::string HumanBytes(uint64_t bytes);
// "41.2x", "-" when nothing is stored.
std::string Ratio(uint64_t raw_bytes, uint64_t stored_bytes);
// The first 12 hex digits of a SHA-256: enough to tell versions apart in a listing.
std::string ShortHash(std::string_view sha256_hex);
// "2026-11-29 17:16" of an ISO 8601 time ("2026-11-29T17:16:31.628Z"), in UTC as given.
std::string ShortTime(std::string_view iso8601);
// A JSON value as it reads in a table cell: strings bare, numbers as JSON writes them, arrays
// and objects as compact JSON.
std::string CellText(const nlohmann::json& value);

// A table printed with each column as wide as its widest cell; columns marked numeric are
// aligned right. Thread-compatible.
class Table {
 public:
  struct Column {
    std::string title;
    bool numeric = false;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // A row of one cell per column (missing cells are empty).
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  bool empty() const { return rows_.empty(); }

  void Print(std::FILE* out = stdout) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// `doc` indented by two spaces, on stdout (what --json prints).
void PrintJson(const nlohmann::json& doc);

}  // namespace ckpt::cli
