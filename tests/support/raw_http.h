// RawHttp: byte-level HTTP over a loopback socket, for tests that need malformed, truncated,
// chunked or 100-continue requests the client library would never send.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <string>

namespace ckpt::testing {

struct RawResponse {
  int status = 0;
  std::string body;
  std::string error;  // network error, if the connection failed before a response
  uint64_t content_length = 0;
  std::string sha256;      // X-Ckpt-Sha256
  std::string request_id;  // X-Request-Id
  std::string content_type;
  std::map<std::string, std::string> headers;  // every header, names in lowercase
};

class RawHttp {
 public:
  explicit RawHttp(uint16_t port) : stream_(ioc_) {
    boost::system::error_code ec;
    stream_.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  }

  bool Send(std::string_view bytes) {
    boost::system::error_code ec;
    boost::asio::write(stream_.socket(), boost::asio::buffer(bytes.data(), bytes.size()), ec);
    return !ec;
  }

  void CloseSend() {
    boost::system::error_code ec;
    stream_.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ec);
  }

  // Reads the response to a HEAD request: headers only, whatever Content-Length says.
  RawResponse ReadHead() {
    namespace http = boost::beast::http;
    RawResponse r;
    http::response_parser<http::empty_body> parser;
    parser.skip(true);
    boost::system::error_code ec;
    http::read(stream_, buffer_, parser, ec);
    if (ec) {
      r.error = ec.message();
      return r;
    }
    r.status = parser.get().result_int();
    r.content_length = parser.content_length().value_or(0);
    r.sha256 = std::string(parser.get()["X-Ckpt-Sha256"]);
    return r;
  }

  // Reads one response (an interim 100 Continue counts as one).
  RawResponse Read() {
    namespace http = boost::beast::http;
    RawResponse r;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    boost::system::error_code ec;
    http::read_header(stream_, buffer_, parser, ec);
    if (ec) {
      r.error = ec.message();
      return r;
    }
    r.status = parser.get().result_int();
    r.request_id = std::string(parser.get()["X-Request-Id"]);
    r.content_type = std::string(parser.get()[http::field::content_type]);
    for (const auto& field : parser.get()) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(field.value());
    }
    if (r.status != 100) {
      http::read(stream_, buffer_, parser, ec);
      if (ec) r.error = ec.message();
      r.body = parser.get().body();
    }
    return r;
  }

 private:
  boost::asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
};

// Sends one request with a (possibly empty) body on a new connection and reads the answer.
inline RawResponse Request(uint16_t port, std::string_view method, std::string_view target,
                           std::string_view body = {}) {
  RawHttp http(port);
  std::string head =
      std::string(method) + " " + std::string(target) +
      " HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  if (!http.Send(head) || !http.Send(body)) {
    RawResponse failed;
    failed.error = "send failed";
    return failed;
  }
  return http.Read();
}

inline std::string PutHeader(std::string_view target, uint64_t content_length,
                             bool expect_continue = false) {
  std::string h = "PUT " + std::string(target) + " HTTP/1.1\r\nHost: localhost\r\n";
  h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  if (expect_continue) h += "Expect: 100-continue\r\n";
  return h + "\r\n";
}

inline std::string Chunked(std::string_view body, size_t piece) {
  std::string out;
  char hex[32];
  for (size_t off = 0; off < body.size(); off += piece) {
    auto part = body.substr(off, piece);
    std::snprintf(hex, sizeof hex, "%zx\r\n", part.size());
    out += hex;
    out += part;
    out += "\r\n";
  }
  return out + "0\r\n\r\n";
}

}  // namespace ckpt::testing
