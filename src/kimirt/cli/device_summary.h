// `kimirt inspect --device`: the GPU and how its memory would be planned for the model (CUDA builds);
// a plain note on builds without CUDA.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kimirt/model/config.h"
#include "kimirt/model/schema.h"

namespace kimirt::cli {

// gpu_memory: the budget flag's text ("90%", "120GiB"; empty: the default budget, 90% of total memory).
// Throws kimirt::Error naming the text when it is not a budget, on any build and whether or not a GPU is
// visible (check_gpu_memory), so that a typo is refused before anything else runs.
void check_gpu_memory(const std::string& gpu_memory);
// The model's weights are sized from `stored` (the checkpoint's schema, with the formats its tensors are stored
// in) when given, else from the formats the config predicts (quantized routed experts, float elsewhere).
std::string device_summary_text(const std::optional<model::ModelConfig>& config, const model::Schema* stored,
                                const std::string& gpu_memory = {});
nlohmann::json device_summary_json(const std::optional<model::ModelConfig>& config, const model::Schema* stored,
                                   const std::string& gpu_memory = {});

}  // namespace kimirt::cli
