// Typed access to the fields of a JSON object, with errors that name the source file and the field's full
// path ("config.json: text_config.hidden_size must be an integer, got \"7168\""). A null value counts as
// absent, as in the released configs (q_lora_rank: null).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kimirt::model {

class JsonFields {
 public:
  // `source` names the file ("config.json"), `path` the object's position ("text_config." or "").
  JsonFields(const nlohmann::json& object, std::string source, std::string path);

  const nlohmann::json& json() const { return object_; }
  // "text_config.hidden_size"
  std::string field(std::string_view key) const { return path_ + std::string(key); }
  const std::string& source() const { return source_; }
  // This object's own path ("text_config.quantization_config"), or "the top level".
  std::string where() const;
  bool has(std::string_view key) const;  // present and not null

  int64_t get_int(std::string_view key) const;
  std::optional<int64_t> opt_int(std::string_view key) const;
  int64_t int_or(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key) const;
  std::optional<double> opt_double(std::string_view key) const;
  double double_or(std::string_view key, double fallback) const;
  std::optional<bool> opt_bool(std::string_view key) const;
  bool bool_or(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;
  std::vector<int64_t> get_int_list(std::string_view key) const;
  std::vector<std::string> string_list_or_empty(std::string_view key) const;
  // A sub-object; required, or nullopt when absent.
  JsonFields object(std::string_view key) const;
  std::optional<JsonFields> opt_object(std::string_view key) const;

  // Throws "source: <field> <message>".
  [[noreturn]] void fail_field(std::string_view key, std::string_view message) const;

 private:
  const nlohmann::json& at(std::string_view key) const;
  int64_t to_int(std::string_view key, const nlohmann::json& v) const;

  const nlohmann::json& object_;
  std::string source_;
  std::string path_;
};

}  // namespace kimirt::model
