// `kimirt inspect --device`: the GPU and how its memory would be planned for the model (CUDA builds);
// a plain note on builds without CUDA.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kimirt/model/config.h"

namespace kimirt::cli {

std::string device_summary_text(const std::optional<model::ModelConfig>& config);
nlohmann::json device_summary_json(const std::optional<model::ModelConfig>& config);

}  // namespace kimirt::cli
