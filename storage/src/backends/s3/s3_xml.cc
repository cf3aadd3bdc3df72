// The S3 API's XML through expat (s3_xml.h).
#include "backends/s3/s3_xml.h"

#include <expat.h>

#include <charconv>
#include <functional>
#include <memory>

#include "ckpt/base/markup.h"

namespace ckpt::s3_xml {
namespace {

// Calls `on_end(path, text)` at the end of every element: `path` the names from the root down to
// it ("ListBucketResult/Contents/Key"), `text` its character data.
using EndHandler = std::function<void(const std::string& path, const std::string& text)>;

Status Walk(std::string_view xml, const EndHandler& on_end) {
  struct State {
    std::string path;
    std::vector<size_t> starts;  // where each open element's name begins in path
    std::string text;
    const EndHandler* on_end;
  } state{{}, {}, {}, &on_end};
  std::unique_ptr<XML_ParserStruct, decltype(&XML_ParserFree)> parser(XML_ParserCreate(nullptr),
                                                                      &XML_ParserFree);
  if (!parser) return Status::ResourceExhausted("s3: cannot create an XML parser");
  XML_SetUserData(parser.get(), &state);
  XML_SetElementHandler(
      parser.get(),
      [](void* data, const XML_Char* name, const XML_Char**) {
        auto* s = static_cast<State*>(data);
        s->starts.push_back(s->path.size());
        if (!s->path.empty()) s->path += '/';
        s->path += name;
        s->text.clear();
      },
      [](void* data, const XML_Char*) {
        auto* s = static_cast<State*>(data);
        (*s->on_end)(s->path, s->text);
        s->path.resize(s->starts.back());
        s->starts.pop_back();
        s->text.clear();
      });
  XML_SetCharacterDataHandler(parser.get(), [](void* data, const XML_Char* chars, int len) {
    static_cast<State*>(data)->text.append(chars, static_cast<size_t>(len));
  });
  if (XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE) !=
      XML_STATUS_OK) {
    return Status::DataLoss(std::string("s3: malformed XML answer: ") +
                            XML_ErrorString(XML_GetErrorCode(parser.get())));
  }
  return Status::Ok();
}

std::string Unquote(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return etag;
}

}  // namespace

Result<ListPage> ParseListPage(std::string_view xml) {
  ListPage page;
  ListedObject current;
  bool size_ok = true;
  CKPT_RETURN_IF_ERROR(Walk(xml, [&](const std::string& path, const std::string& text) {
    if (path == "ListBucketResult/Contents/Key") {
      current.key = text;
    } else if (path == "ListBucketResult/Contents/Size") {
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current.size);
      size_ok = size_ok && ec == std::errc() && end == text.data() + text.size();
    } else if (path == "ListBucketResult/Contents/ETag") {
      current.etag = Unquote(text);
    } else if (path == "ListBucketResult/Contents") {
      page.objects.push_back(std::move(current));
      current = ListedObject();
    } else if (path == "ListBucketResult/CommonPrefixes/Prefix") {
      page.common_prefixes.push_back(text);
    } else if (path == "ListBucketResult/IsTruncated") {
      page.truncated = text == "true";
    } else if (path == "ListBucketResult/NextContinuationToken") {
      page.next_continuation_token = text;
    }
  }));
  if (!size_ok) return Status::DataLoss("s3: a listing holds a malformed object size");
  if (page.truncated && page.next_continuation_token.empty()) {
    return Status::DataLoss("s3: a truncated listing without a continuation token");
  }
  return page;
}

ErrorBody ParseError(std::string_view xml) {
  ErrorBody error;
  (void)Walk(xml, [&](const std::string& path, const std::string& text) {
    if (path == "Error/Code") error.code = text;
    if (path == "Error/Message") error.message = text;
  });
  return error;
}

Result<std::string> ParseUploadId(std::string_view xml) {
  std::string id;
  CKPT_RETURN_IF_ERROR(Walk(xml, [&](const std::string& path, const std::string& text) {
    if (path == "InitiateMultipartUploadResult/UploadId") id = text;
  }));
  if (id.empty()) return Status::DataLoss("s3: a multipart upload began without an UploadId");
  return id;
}

std::string ParseCompletedEtag(std::string_view xml) {
  std::string etag;
  (void)Walk(xml, [&](const std::string& path, const std::string& text) {
    if (path == "CompleteMultipartUploadResult/ETag") etag = Unquote(text);
  });
  return etag;
}

std::string CompleteMultipartBody(const std::vector<std::string>& etags) {
  std::string out = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    out += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>\"" +
           EscapeMarkup(etags[i]) + "\"</ETag></Part>";
  }
  return out + "</CompleteMultipartUpload>";
}

std::string DeleteBody(const std::vector<std::string>& keys) {
  std::string out = "<Delete><Quiet>true</Quiet>";
  for (const std::string& key : keys)
    out += "<Object><Key>" + EscapeMarkup(key) + "</Key></Object>";
  return out + "</Delete>";
}

Result<std::vector<std::pair<std::string, std::string>>> ParseDeleteErrors(std::string_view xml) {
  std::vector<std::pair<std::string, std::string>> errors;
  std::pair<std::string, std::string> current;
  CKPT_RETURN_IF_ERROR(Walk(xml, [&](const std::string& path, const std::string& text) {
    if (path == "DeleteResult/Error/Key") current.first = text;
    if (path == "DeleteResult/Error/Code") current.second = text;
    if (path == "DeleteResult/Error") errors.push_back(std::exchange(current, {}));
  }));
  return errors;
}

}  // namespace ckpt::s3_xml
