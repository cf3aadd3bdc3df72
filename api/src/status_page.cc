#include "status_page.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "ckpt/base/markup.h"
#include "ckpt/version.h"

namespace ckpt::api {
namespace {

constexpr std::string_view kStyle = R"css(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f4f6f9}
header{background:#1d2330;color:#fff;padding:14px 28px;display:flex;align-items:baseline;gap:18px}
header h1{font-size:20px;margin:0}header .sub{color:#aab3c5;font-size:13px}
main{padding:18px 28px;max-width:1180px}
.totals{display:flex;gap:14px;flex-wrap:wrap;margin-bottom:18px}
.tile{background:#fff;border-radius:8px;padding:10px 16px;box-shadow:0 1px 2px #0002;min-width:120px}
.tile .v{font-size:22px;font-weight:600}.tile .k{color:#667085;font-size:12px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 2px #0002;padding:14px 18px;margin-bottom:18px}
h2{font-size:17px;margin:0 0 8px}h3{font-size:14px;margin:12px 0 6px;color:#475467}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e4e7ec;white-space:nowrap}
th{color:#475467;font-weight:600;background:#f9fafb}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,monospace;background:#f2f4f7;padding:1px 4px;border-radius:3px;white-space:pre-wrap}
.kind{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;color:#fff}
.keyframe{background:#d9822b}.delta{background:#3b7dd8}.mixed{background:#8e6bbf}
.tag{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;background:#e8f0fe;color:#1a56db;margin-right:3px}
.charts{display:flex;gap:18px;flex-wrap:wrap}.chart{flex:1;min-width:360px}
.fields{display:flex;flex-wrap:wrap;gap:2px 14px;margin:2px 0 6px;padding:0;list-style:none;white-space:normal}
.fields li{font-size:12px;overflow-wrap:anywhere}.fields b{color:#475467;font-weight:600;margin-right:4px}
td .fields{margin:0;max-width:340px}
.note{color:#667085;font-size:12px}.warning{background:#fdecea;border:1px solid #f5c2c7;color:#842029;padding:10px 14px;border-radius:6px;margin:0 0 16px}a{color:#1a56db;text-decoration:none}
svg text{font:11px system-ui,sans-serif;fill:#475467}
)css";

std::string Format(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? std::to_string(bytes) + " B"
                   : Format(value < 10    ? "%.2f"
                            : value < 100 ? "%.1f"
                                          : "%.0f",
                            value) +
                         " " + kUnits[unit];
}

// Bytes as text with the exact count as a tooltip.
std::string BytesCell(uint64_t bytes) {
  return "<td class=\"n\" title=\"" + std::to_string(bytes) + " bytes\">" + HumanBytes(bytes) +
         "</td>";
}

std::string Ratio(uint64_t raw, uint64_t stored) {
  if (stored == 0) return raw == 0 ? "–" : "∞";
  const double ratio = static_cast<double>(raw) / static_cast<double>(stored);
  return Format(ratio < 10 ? "%.2fx" : ratio < 100 ? "%.1fx" : "%.0fx", ratio);
}

std::string TimeText(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string ModelLink(const std::string& model) {
  std::string query;
  for (unsigned char c : model) {  // model names are [A-Za-z0-9._-]; escape anything else
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      query.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      query += hex;
    }
  }
  return "<a href=\"/?model=" + query + "\">" + EscapeMarkup(model) + "</a>";
}

std::string TagsHtml(const std::vector<std::string>& tags) {
  std::string out;
  for (const std::string& tag : tags) out += "<span class=\"tag\">" + EscapeMarkup(tag) + "</span>";
  return out;
}

// The error bound a version was stored with: "exact", or the largest absolute bound over its
// quantized tensors (and the pointwise-relative one where the log quantizer coded a tensor).
std::string BoundText(CheckpointStore& store, const VersionInfo& v) {
  if (!v.lossy) return "exact";
  auto detail = store.GetVersionDetail(v.model, v.version);
  if (!detail.ok()) return "lossy";
  double absolute = 0, pointwise = 0;
  for (const TensorDetail& t : detail->tensors) {
    if (t.codec != "lossy") continue;
    double& bound = t.quantizer == "log" ? pointwise : absolute;
    bound = std::max(bound, t.bound);
  }
  std::string out;
  if (absolute > 0) out = "|err| ≤ " + Format("%.3g", absolute);
  if (pointwise > 0)
    out += std::string(out.empty() ? "" : ", ") + "rel ≤ " + Format("%.3g", pointwise);
  return out.empty() ? "lossy" : out;
}

// An SVG chart frame: plot area [kLeft, kWidth - kRight] x [kTop, kHeight - kBottom].
constexpr double kWidth = 540, kHeight = 190, kLeft = 62, kRight = 10, kTop = 10, kBottom = 26;
constexpr double kPlotWidth = kWidth - kLeft - kRight, kPlotHeight = kHeight - kTop - kBottom;

std::string SvgOpen(std::string_view label) {
  return "<svg role=\"img\" aria-label=\"" + std::string(label) + "\" viewBox=\"0 0 " +
         Format("%.0f", kWidth) + " " + Format("%.0f", kHeight) +
         "\" width=\"100%\" preserveAspectRatio=\"xMinYMin meet\">";
}

// Axes with the y range [0, y_max] labelled in bytes and the x range labelled by the first and
// last version.
std::string Axes(uint64_t y_max, uint64_t first_version, uint64_t last_version) {
  std::string out;
  for (int i = 0; i <= 2; ++i) {
    const double y = kTop + kPlotHeight * (1 - i / 2.0);
    out += "<line x1=\"" + Format("%.1f", kLeft) + "\" x2=\"" + Format("%.1f", kWidth - kRight) +
           "\" y1=\"" + Format("%.1f", y) + "\" y2=\"" + Format("%.1f", y) +
           "\" stroke=\"#e4e7ec\"/>";
    out += "<text x=\"" + Format("%.1f", kLeft - 6) + "\" y=\"" + Format("%.1f", y + 4) +
           "\" text-anchor=\"end\">" +
           HumanBytes(static_cast<uint64_t>(static_cast<double>(y_max) * i / 2.0)) + "</text>";
  }
  const std::string base = Format("%.1f", kHeight - 8);
  out += "<text x=\"" + Format("%.1f", kLeft) + "\" y=\"" + base + "\">v" +
         std::to_string(first_version) + "</text>";
  out += "<text x=\"" + Format("%.1f", kWidth - kRight) + "\" y=\"" + base +
         "\" text-anchor=\"end\">v" + std::to_string(last_version) + "</text>";
  return out;
}

std::string StoredBytesChart(std::span<const VersionInfo> versions) {
  uint64_t y_max = 1;
  for (const VersionInfo& v : versions) y_max = std::max(y_max, v.stored_bytes);
  std::string svg = SvgOpen("stored bytes per version") +
                    Axes(y_max, versions.front().version, versions.back().version);
  const double slot = kPlotWidth / static_cast<double>(versions.size());
  const double bar = std::max(1.0, slot * 0.8);
  for (size_t i = 0; i < versions.size(); ++i) {
    const VersionInfo& v = versions[i];
    const double h = kPlotHeight * static_cast<double>(v.stored_bytes) / static_cast<double>(y_max);
    const char* color = v.kind == "keyframe" ? "#d9822b"
                        : v.kind == "delta"  ? "#3b7dd8"
                                             : "#8e6bbf";
    svg += "<rect class=\"bar\" x=\"" + Format("%.2f", kLeft + slot * static_cast<double>(i)) +
           "\" y=\"" + Format("%.2f", kTop + kPlotHeight - h) + "\" width=\"" +
           Format("%.2f", bar) + "\" height=\"" + Format("%.2f", std::max(h, 0.5)) + "\" fill=\"" +
           color + "\"><title>v" + std::to_string(v.version) + " " + v.kind + ": " +
           HumanBytes(v.stored_bytes) + " stored of " + HumanBytes(v.raw_bytes) + "</title></rect>";
  }
  return svg + "</svg>";
}

std::string SavingsChart(std::span<const VersionInfo> versions) {
  uint64_t raw = 0, stored = 0;
  std::vector<std::pair<uint64_t, uint64_t>> cumulative;
  for (const VersionInfo& v : versions) {
    raw += v.raw_bytes;
    stored += v.stored_bytes;
    cumulative.emplace_back(raw, stored);
  }
  const uint64_t y_max = std::max<uint64_t>(raw, 1);
  const double step =
      versions.size() > 1 ? kPlotWidth / static_cast<double>(versions.size() - 1) : 0;
  auto point = [&](size_t i, uint64_t value) {
    const double x = kLeft + step * static_cast<double>(i);
    const double y =
        kTop + kPlotHeight * (1 - static_cast<double>(value) / static_cast<double>(y_max));
    return Format("%.2f", x) + "," + Format("%.2f", y) + " ";
  };
  std::string raw_line, stored_line, savings;
  for (size_t i = 0; i < cumulative.size(); ++i) {
    raw_line += point(i, cumulative[i].first);
    stored_line += point(i, cumulative[i].second);
  }
  savings = raw_line;  // the area between the two lines: raw forwards, stored backwards
  for (size_t i = cumulative.size(); i-- > 0;) savings += point(i, cumulative[i].second);
  std::string svg = SvgOpen("cumulative raw and stored bytes") +
                    Axes(y_max, versions.front().version, versions.back().version);
  svg +=
      "<polygon class=\"savings\" points=\"" + savings + "\" fill=\"#12b76a\" opacity=\"0.18\"/>";
  svg +=
      "<polyline points=\"" + raw_line + "\" fill=\"none\" stroke=\"#98a2b3\" stroke-width=\"2\"/>";
  svg += "<polyline points=\"" + stored_line +
         "\" fill=\"none\" stroke=\"#3b7dd8\" stroke-width=\"2\"/>";
  svg += "<text x=\"" + Format("%.1f", kLeft + 8) + "\" y=\"" + Format("%.1f", kTop + 14) +
         "\">raw " + HumanBytes(raw) + " · stored " + HumanBytes(stored) + " · saved " +
         HumanBytes(raw - std::min(raw, stored)) + "</text>";
  return svg + "</svg>";
}

// "lossless", or "lossy" with its bound, for the models table.
std::string PolicySummary(CheckpointStore& store, const std::string& model) {
  auto policy = store.GetPolicy(model);
  if (!policy.ok()) return "?";
  if (policy->mode == CodecMode::kLossless || !policy->bound) {
    return policy->overrides.empty() ? "lossless" : "lossless + overrides";
  }
  const ErrorBound& b = *policy->bound;
  const char* what = b.kind == ErrorBound::Kind::kAbsolute   ? "|err| ≤ "
                     : b.kind == ErrorBound::Kind::kRelative ? "|err| ≤ range × "
                                                             : "|err| ≤ |x| × ";
  return "lossy, " + std::string(what) + Format("%.3g", b.value);
}

// A policy document as a list of "field value" items that wraps to the width it is given; each
// entry of a list of objects (overrides, tensor_rules) an item of its own, its fields inline.
std::string FieldsHtml(const std::string& json_text) {
  const nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, false);
  if (!doc.is_object()) return "<code>" + EscapeMarkup(json_text) + "</code>";
  const auto text = [](const nlohmann::json& value) {
    if (value.is_string()) return value.get<std::string>();
    if (!value.is_object()) return value.dump();
    std::string out;
    for (const auto& [key, item] : value.items()) {
      out += (out.empty() ? "" : ", ") + key + " " +
             (item.is_string() ? item.get<std::string>() : item.dump());
    }
    return out;
  };
  std::string items;
  for (const auto& [field, value] : doc.items()) {
    if (value.is_array() && !value.empty() && value[0].is_object()) {
      for (size_t i = 0; i < value.size(); ++i) {
        items += "<li><b>" + EscapeMarkup(field) + "[" + std::to_string(i) + "]</b>" +
                 EscapeMarkup(text(value[i])) + "</li>";
      }
    } else {
      items += "<li><b>" + EscapeMarkup(field) + "</b>" + EscapeMarkup(text(value)) + "</li>";
    }
  }
  return "<ul class=\"fields\">" + items + "</ul>";
}

std::string PolicyHtml(CheckpointStore& store, const std::string& model) {
  auto policy = store.GetPolicy(model);
  return policy.ok() ? FieldsHtml(policy->ToJson()) : EscapeMarkup(policy.status().ToString());
}

std::string RetentionHtml(CheckpointStore& store, const std::string& model) {
  auto retention = store.GetRetentionPolicy(model);
  if (!retention.ok()) return EscapeMarkup(retention.status().ToString());
  const std::string json = retention->ToJson();
  return json == "{}" ? "<span class=\"note\">keep every version</span>" : FieldsHtml(json);
}

// When the model last changed: its newest version's push, else its creation.
int64_t LastActivityMs(CheckpointStore& store, const ModelInfo& model) {
  if (model.latest_version) {
    if (auto latest = store.GetVersion(model.name, *model.latest_version); latest.ok()) {
      return latest->created_at_ms;
    }
  }
  return model.created_at_ms;
}

Result<std::string> ModelSection(CheckpointStore& store, const ModelInfo& model,
                                 size_t max_versions) {
  CKPT_ASSIGN_OR_RETURN(std::vector<VersionInfo> all, store.ListVersions(model.name));
  const size_t shown = std::min(all.size(), max_versions);
  const std::span<const VersionInfo> versions(all.data() + all.size() - shown, shown);
  std::string html = "<section id=\"model-" + EscapeMarkup(model.name) + "\" data-model=\"" +
                     EscapeMarkup(model.name) + "\"><h2>" + ModelLink(model.name) + "</h2>";
  html += "<h3>Codec policy</h3>" + PolicyHtml(store, model.name) + "<h3>Retention</h3>" +
          RetentionHtml(store, model.name);
  std::string tags;
  for (const VersionInfo& v : all) {
    for (const std::string& tag : v.tags) {
      tags += "<span class=\"tag\">" + EscapeMarkup(tag) + " → v" + std::to_string(v.version) +
              "</span>";
    }
  }
  html += "<h3>Tags</h3><div>" +
          (tags.empty() ? std::string("<span class=\"note\">none</span>") : tags) + "</div>";
  if (versions.empty()) return html + "<p class=\"note\">No versions.</p></section>";
  if (shown < all.size()) {
    html += "<p class=\"note\">The newest " + std::to_string(shown) + " of " +
            std::to_string(all.size()) + " versions.</p>";
  }
  html +=
      "<div class=\"charts\"><div class=\"chart\"><h3>Stored bytes per version "
      "(<span class=\"kind keyframe\">keyframe</span> <span class=\"kind delta\">delta</span> "
      "<span class=\"kind mixed\">mixed</span>)</h3>" +
      StoredBytesChart(versions) +
      "</div><div class=\"chart\"><h3>Cumulative raw vs stored bytes (shaded: saved)</h3>" +
      SavingsChart(versions) + "</div></div>";
  html +=
      "<h3>Versions</h3><table class=\"versions\"><tr><th class=\"n\">version</th><th>pushed</th>"
      "<th>kind</th><th class=\"n\">raw</th><th class=\"n\">stored</th><th class=\"n\">ratio</th>"
      "<th>error bound</th><th>tags</th><th>metrics</th></tr>";
  for (size_t i = versions.size(); i-- > 0;) {  // newest first
    const VersionInfo& v = versions[i];
    std::string metrics;
    for (const auto& [name, value] : v.metrics) {
      metrics += EscapeMarkup(name) + "=" + Format("%.6g", value) + " ";
    }
    html += "<tr class=\"version\" data-version=\"" + std::to_string(v.version) +
            "\"><td class=\"n\">" + std::to_string(v.version) + "</td><td>" +
            TimeText(v.created_at_ms) + "</td><td><span class=\"kind " + EscapeMarkup(v.kind) +
            "\">" + EscapeMarkup(v.kind) + "</span></td>" + BytesCell(v.raw_bytes) +
            BytesCell(v.stored_bytes) + "<td class=\"n\">" + Ratio(v.raw_bytes, v.stored_bytes) +
            "</td><td>" + EscapeMarkup(BoundText(store, v)) + "</td><td>" + TagsHtml(v.tags) +
            "</td><td>" + metrics + "</td></tr>";
  }
  return html + "</table></section>";
}

}  // namespace

std::string RenderNotFoundPage(std::string_view message) {
  return "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
         "<title>ckptd: not found</title><link rel=\"icon\" href=\"data:,\"><style>" +
         std::string(kStyle) + "</style></head><body><header><h1>ckptd</h1><span class=\"sub\">" +
         std::string(kVersionString) + "</span></header><main><section id=\"not-found\"><h2>" +
         "Not found</h2><p>" + EscapeMarkup(message) +
         "</p><p><a href=\"/\">All models</a></p></section></main></body></html>\n";
}

Result<std::string> RenderStatusPage(CheckpointStore& store, const StatusPageOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::vector<ModelInfo> all, store.ListModels());
  std::vector<ModelInfo> models;
  for (ModelInfo& m : all) {
    if (!m.name.starts_with(options.model_prefix)) continue;
    if (!options.model.empty() && m.name != options.model) continue;
    models.push_back(std::move(m));
  }
  if (!options.model.empty() && models.empty()) {
    return Status::NotFound("no model '" + options.model + "'");
  }
  // The models in use first: the newest push (or creation) leads, so the overview's charts are
  // of the models being trained now.
  std::map<std::string, int64_t> activity;
  for (const ModelInfo& m : models) activity[m.name] = LastActivityMs(store, m);
  std::stable_sort(models.begin(), models.end(), [&](const ModelInfo& a, const ModelInfo& b) {
    return activity[a.name] > activity[b.name];
  });
  const int64_t now_ms = options.now_ms != 0
                             ? options.now_ms
                             : std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
  uint64_t versions = 0, raw = 0, stored = 0;
  for (const ModelInfo& m : models) {
    versions += m.version_count;
    raw += m.raw_bytes;
    stored += m.stored_bytes;
  }

  std::string html =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
      "<title>ckptd status</title><link rel=\"icon\" href=\"data:,\"><style>" +
      std::string(kStyle) + "</style></head><body><header><h1>ckptd</h1><span class=\"sub\">" +
      std::string(kVersionString) + " · " + TimeText(now_ms) +
      (options.model.empty() ? std::string()
                             : " · <a href=\"/\" style=\"color:#aab3c5\">all models</a>") +
      "</span></header><main>";
  // Writes refused: the first thing an operator must see.
  if (const StoreHealthReport health = store.Health();
      health.state != StoreHealthReport::State::kWritable) {
    html += "<div class=\"warning\" id=\"storage-warning\" data-state=\"" +
            std::string(StoreHealthStateName(health.state)) + "\"><b>Writes refused</b> · " +
            EscapeMarkup(health.reason) + " · " + HumanBytes(health.free_bytes) + " free, " +
            HumanBytes(health.reserved_bytes) + " reserved</div>";
  }
  auto tile = [](std::string_view id, const std::string& value, std::string_view label) {
    return "<div class=\"tile\" id=\"" + std::string(id) + "\"><div class=\"v\">" + value +
           "</div><div class=\"k\">" + std::string(label) + "</div></div>";
  };
  html += "<div class=\"totals\">" + tile("total-models", std::to_string(models.size()), "models") +
          tile("total-versions", std::to_string(versions), "versions") +
          tile("total-raw", HumanBytes(raw), "raw bytes (pushed)") +
          tile("total-stored", HumanBytes(stored), "stored bytes") +
          tile("total-ratio", Ratio(raw, stored), "compression ratio") + "</div>";

  html +=
      "<section><h2>Models</h2><table class=\"models\"><tr><th>model</th><th class=\"n\">"
      "versions</th><th class=\"n\">latest</th><th class=\"n\">raw</th><th class=\"n\">stored"
      "</th><th class=\"n\">ratio</th><th>codec</th><th>retention</th><th>last push</th></tr>";
  for (const ModelInfo& m : models) {
    html += "<tr class=\"model\" data-model=\"" + EscapeMarkup(m.name) + "\"><td>" +
            ModelLink(m.name) + "</td><td class=\"n\">" + std::to_string(m.version_count) +
            "</td><td class=\"n\">" +
            (m.latest_version ? std::to_string(*m.latest_version) : std::string("–")) + "</td>" +
            BytesCell(m.raw_bytes) + BytesCell(m.stored_bytes) + "<td class=\"n\">" +
            Ratio(m.raw_bytes, m.stored_bytes) + "</td><td>" +
            EscapeMarkup(PolicySummary(store, m.name)) + "</td><td>" +
            RetentionHtml(store, m.name) + "</td><td>" + TimeText(activity[m.name]) + "</td></tr>";
  }
  if (models.empty()) html += "<tr><td colspan=\"9\" class=\"note\">No models yet.</td></tr>";
  html += "</table>";
  if (options.model.empty() && models.size() > kMaxModelSections) {
    html += "<p class=\"note\">Charts below for the " + std::to_string(kMaxModelSections) +
            " most recently pushed models; each model's link opens its own page with its "
            "charts and versions.</p>";
  }
  html += "</section>";

  // Sharded versions still missing shards: a rank that died shows here until it expires.
  if (auto uploads = store.ListUploads(); uploads.ok()) {
    std::string rows;
    for (const ShardUploadInfo& u : *uploads) {
      if (!u.model.starts_with(options.model_prefix) ||
          (!options.model.empty() && u.model != options.model)) {
        continue;
      }
      rows += "<tr class=\"upload\" data-model=\"" + EscapeMarkup(u.model) + "\"><td>" +
              ModelLink(u.model) + "</td><td class=\"n\">" + std::to_string(u.version) +
              "</td><td class=\"n\">" + std::to_string(u.received.size()) + " of " +
              std::to_string(u.shard_count) + "</td>" + BytesCell(u.received_bytes) + "<td>" +
              TimeText(u.created_at_ms) + "</td><td>" + TimeText(u.expires_at_ms) + "</td></tr>";
    }
    if (!rows.empty()) {
      html +=
          "<section id=\"uploads\"><h2>Sharded uploads in progress</h2><table><tr><th>model"
          "</th><th class=\"n\">version</th><th class=\"n\">shards</th><th class=\"n\">"
          "received</th><th>started</th><th>expires</th></tr>" +
          rows + "</table></section>";
    }
  }

  const size_t sections = options.model.empty() ? kMaxModelSections : 1;
  const size_t max_versions = options.model.empty() ? kOverviewVersions : kSingleModelVersions;
  for (size_t i = 0; i < models.size() && i < sections; ++i) {
    auto section = ModelSection(store, models[i], max_versions);
    if (!section.ok()) {
      if (section.status().code() == StatusCode::kNotFound) continue;  // deleted meanwhile
      return section.status();
    }
    html += *section;
  }
  return html + "</main></body></html>\n";
}

}  // namespace ckpt::api
