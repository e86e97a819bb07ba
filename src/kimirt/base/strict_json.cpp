#include "kimirt/base/strict_json.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

using nlohmann::json;

// Builds the DOM from SAX events so that a key can be checked against its object before it is inserted;
// nlohmann's own DOM builder would overwrite it.
class StrictDomBuilder final : public nlohmann::json_sax<json> {
 public:
  StrictDomBuilder(json& root, JsonProblem& problem, size_t max_depth)
      : root_(root), problem_(problem), max_depth_(max_depth) {}

  bool null() override { return add(json(nullptr)) != nullptr; }
  bool boolean(bool value) override { return add(json(value)) != nullptr; }
  bool number_integer(number_integer_t value) override { return add(json(value)) != nullptr; }
  bool number_unsigned(number_unsigned_t value) override { return add(json(value)) != nullptr; }
  bool number_float(number_float_t value, const string_t&) override { return add(json(value)) != nullptr; }
  bool string(string_t& value) override { return add(json(std::move(value))) != nullptr; }
  bool binary(binary_t&) override { return fail(JsonProblem::Kind::kSyntax, "binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& key) override {
    json* object = stack_.back();
    if (object->contains(key)) {
      std::string where = path();
      return fail(JsonProblem::Kind::kDuplicateKey, where.empty()
                                                        ? fmt::format("duplicate key \"{}\"", key)
                                                        : fmt::format("duplicate key \"{}\" in {}", key, where));
    }
    key_ = std::move(key);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    // nlohmann's messages start with "[json.exception.parse_error.101] "; the byte offset says more.
    std::string_view what = ex.what();
    if (auto pos = what.find("] "); pos != std::string_view::npos) what.remove_prefix(pos + 2);
    return fail(JsonProblem::Kind::kSyntax, fmt::format("invalid JSON near byte {}: {}", position, what));
  }

 private:
  // Inserts `value` where the parser stands and returns where it landed; nullptr after a failure.
  json* add(json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json* parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(value));
      return &parent->back();
    }
    json& slot = (*parent)[key_];
    slot = std::move(value);
    return &slot;
  }

  bool open(json container) {
    if (stack_.size() >= max_depth_) {
      return fail(JsonProblem::Kind::kTooDeep, fmt::format("JSON nested deeper than {} levels", max_depth_));
    }
    std::string label;
    if (!stack_.empty()) {
      json* parent = stack_.back();
      label = parent->is_array() ? fmt::format("[{}]", parent->size()) : fmt::format("\"{}\"", key_);
    }
    labels_.push_back(std::move(label));
    stack_.push_back(add(std::move(container)));
    return true;
  }

  bool close() {
    stack_.pop_back();
    labels_.pop_back();
    return true;
  }

  std::string path() const {
    std::string out;
    for (const auto& label : labels_) {
      if (label.empty()) continue;  // the root
      if (!out.empty()) out += " > ";
      out += label;
    }
    return out;
  }

  bool fail(JsonProblem::Kind kind, std::string message) {
    problem_ = JsonProblem{kind, std::move(message)};
    return false;
  }

  json& root_;
  JsonProblem& problem_;
  size_t max_depth_;
  std::vector<json*> stack_;
  std::vector<std::string> labels_;  // parallel to stack_: how each open container is reached ("" = root)
  std::string key_;
};

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte decides the length and the allowed range of the first continuation byte, which is what
    // rules out overlong forms, UTF-16 surrogates and code points past U+10FFFF (RFC 3629 table).
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3, lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      len = 3;
    } else if (c == 0xED) {
      len = 3, hi = 0x9F;
    } else if (c == 0xF0) {
      len = 4, lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else if (c == 0xF4) {
      len = 4, hi = 0x8F;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::nullopt;
}

std::optional<nlohmann::json> parse_json_strict(std::string_view text, JsonProblem& problem, size_t max_depth) {
  if (auto bad = find_invalid_utf8(text)) {
    problem = JsonProblem{JsonProblem::Kind::kInvalidUtf8, fmt::format("not valid UTF-8 at byte {}", *bad)};
    return std::nullopt;
  }
  // nlohmann takes a NUL byte for the end of the input, which would silently drop whatever follows it.
  if (auto nul = text.find('\0'); nul != std::string_view::npos) {
    problem = JsonProblem{JsonProblem::Kind::kSyntax, fmt::format("NUL byte at offset {}", nul)};
    return std::nullopt;
  }
  json root;
  StrictDomBuilder builder(root, problem, max_depth);
  const char* begin = text.data();
  if (!json::sax_parse(begin, begin + text.size(), &builder, nlohmann::json::input_format_t::json,
                       /*strict=*/true, /*ignore_comments=*/false)) {
    return std::nullopt;
  }
  return root;
}

nlohmann::json parse_json_strict_or_fail(std::string_view text, std::string_view source) {
  JsonProblem problem;
  auto root = parse_json_strict(text, problem);
  if (!root) {
    // A duplicate key is valid JSON that we refuse; everything else is not JSON at all.
    if (problem.kind == JsonProblem::Kind::kDuplicateKey) fail("{}: {}", source, problem.message);
    fail("{}: not valid JSON: {}", source, problem.message);
  }
  return std::move(*root);
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump();
  if (text.size() > max_chars && max_chars >= 3) {
    text.resize(max_chars - 3);
    text += "...";
  }
  return text;
}

}  // namespace kimirt
