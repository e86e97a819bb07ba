// Helpers shared by the model tests: golden configs and index key sets, read straight from testdata/.
#pragma once

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "kimirt/base/error.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/model/config.h"
#include "kimirt/model/key_index.h"
#include "kimirt/model/schema.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::model::testing {

inline std::string testdata(const std::string& rel) { return std::string(KIMIRT_TESTDATA_DIR) + "/" + rel; }

inline nlohmann::json read_json(const std::string& rel) {
  std::ifstream in(testdata(rel));
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

// The weight_map keys of a golden checkpoint's index.
inline std::set<std::string> index_keys(const std::string& model) {
  const auto j = read_json(model + "/model.safetensors.index.json");
  std::set<std::string> keys;
  for (const auto& [k, v] : j.at("weight_map").items()) keys.insert(k);
  return keys;
}

// A golden checkpoint's config, and the schema it implies for that checkpoint's key set.
inline ModelConfig golden_config(const std::string& model) {
  return ModelConfig::from_json(read_json(model + "/config.json"));
}
inline Schema golden_schema(const std::string& model) {
  return Schema::for_checkpoint(golden_config(model), KeyIndex::from_names(index_keys(model)));
}

// Every tensor of a golden checkpoint, read through the io layer.
inline std::map<std::string, Tensor> read_checkpoint(const std::string& model) {
  const auto checkpoint = io::Checkpoint::open(testdata(model));
  std::map<std::string, Tensor> out;
  for (const auto& name : checkpoint.tensor_names()) out.emplace(name, checkpoint.read_tensor(name));
  return out;
}

using ::kimirt::test::error_of;

}  // namespace kimirt::model::testing
