#include "kimirt/model/json_fields.h"

#include <cmath>
#include <cstdint>

#include "kimirt/base/error.h"
#include "kimirt/base/strict_json.h"

namespace kimirt::model {
namespace {

// Config values are short; 60 characters show a whole list of layer ids.
std::string shown(const nlohmann::json& v) { return json_excerpt(v, 60); }

}  // namespace

JsonFields::JsonFields(const nlohmann::json& object, std::string source, std::string path)
    : object_(object), source_(std::move(source)), path_(std::move(path)) {
  KIMIRT_CHECK(object_.is_object(), "{}: {} must be a JSON object, got {}", source_, where(), shown(object_));
}

std::string JsonFields::where() const {
  return path_.empty() ? std::string("the top level") : path_.substr(0, path_.size() - 1);
}

void JsonFields::fail_field(std::string_view key, std::string_view message) const {
  fail("{}: {} {}", source_, field(key), message);
}

bool JsonFields::has(std::string_view key) const {
  const auto it = object_.find(std::string(key));
  return it != object_.end() && !it->is_null();
}

const nlohmann::json& JsonFields::at(std::string_view key) const {
  const auto it = object_.find(std::string(key));
  if (it == object_.end() || it->is_null()) fail_field(key, "is missing");
  return *it;
}

int64_t JsonFields::to_int(std::string_view key, const nlohmann::json& v) const {
  // An unsigned value past INT64_MAX would wrap to a negative one (2^64 - 1 read as -1).
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    fail_field(key, "is too large, got " + shown(v));
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers emit 4.0 for an integer; accept it when it is exactly integral.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  fail_field(key, "must be an integer, got " + shown(v));
}

int64_t JsonFields::get_int(std::string_view key) const { return to_int(key, at(key)); }

std::optional<int64_t> JsonFields::opt_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}

int64_t JsonFields::int_or(std::string_view key, int64_t fallback) const { return opt_int(key).value_or(fallback); }

double JsonFields::get_double(std::string_view key) const {
  const auto& v = at(key);
  if (!v.is_number()) fail_field(key, "must be a number, got " + shown(v));
  return v.get<double>();
}

std::optional<double> JsonFields::opt_double(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_double(key);
}

double JsonFields::double_or(std::string_view key, double fallback) const { return opt_double(key).value_or(fallback); }

std::optional<bool> JsonFields::opt_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const auto& v = at(key);
  if (!v.is_boolean()) fail_field(key, "must be true or false, got " + shown(v));
  return v.get<bool>();
}

bool JsonFields::bool_or(std::string_view key, bool fallback) const { return opt_bool(key).value_or(fallback); }

std::string JsonFields::get_string(std::string_view key) const {
  const auto& v = at(key);
  if (!v.is_string()) fail_field(key, "must be a string, got " + shown(v));
  return v.get<std::string>();
}

std::optional<std::string> JsonFields::opt_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

std::vector<int64_t> JsonFields::get_int_list(std::string_view key) const {
  const auto& v = at(key);
  if (!v.is_array()) fail_field(key, "must be a list of integers, got " + shown(v));
  std::vector<int64_t> out;
  for (const auto& e : v) out.push_back(to_int(key, e));
  return out;
}

std::vector<std::string> JsonFields::string_list_or_empty(std::string_view key) const {
  if (!has(key)) return {};
  const auto& v = at(key);
  if (!v.is_array()) fail_field(key, "must be a list of strings, got " + shown(v));
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) fail_field(key, "must be a list of strings, got an element " + shown(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

JsonFields JsonFields::object(std::string_view key) const {
  const auto& v = at(key);
  if (!v.is_object()) fail_field(key, "must be a JSON object, got " + shown(v));
  return JsonFields(v, source_, field(key) + ".");
}

std::optional<JsonFields> JsonFields::opt_object(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return object(key);
}

}  // namespace kimirt::model
