// Escaping text into HTML or XML (the status page, the S3 API's request bodies).
#pragma once

#include <string>
#include <string_view>

namespace ckpt {

// `text` as HTML or XML character data or a quoted attribute value: & < > " ' escaped.
std::string EscapeMarkup(std::string_view text);

}  // namespace ckpt
