// The embedded default model of `kimirt run` (and `make run`): a small random Kimi K3 in the released
// layout, with the built-in tokenizer, generated once into the user's cache directory.
#pragma once

#include <filesystem>

#include "kimirt/model/config.h"

namespace kimirt::cli {

// A tiny config of `family` whose vocabulary and special ids are those of the built-in tokenizer.
model::ModelConfig config_for_default_tokenizer(model::ModelFamily family);
// $XDG_CACHE_HOME/kimirt/default-k3-v1, else ~/.cache/kimirt/default-k3-v1.
std::filesystem::path default_model_dir();
// Generates the model when it is not there (into a temporary directory renamed at the end, so an
// interrupted run never leaves a half model behind) and returns its directory.
std::filesystem::path ensure_default_model();

}  // namespace kimirt::cli
