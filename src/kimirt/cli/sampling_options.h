// The sampling and stopping flags that `kimirt run` and `kimirt chat` share, registered once so that the two
// commands take the same flags with the same meaning.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "kimirt/runtime/sampling_params.h"

namespace kimirt::cli {

// -n/--max-tokens (described by `max_tokens_help`), --temperature, --top-k, --top-p, --min-p, --seed,
// --repetition-penalty, --presence-penalty, --frequency-penalty, --stop-id, --stop, --ignore-eos.
void add_sampling_options(CLI::App* cmd, runtime::SamplingParams& sp, const std::string& max_tokens_help);

// Refuses a --stop-id past the model's vocabulary, naming it: such an id could never stop anything. Called once
// the config is read, before the weights are.
void check_stop_ids(const runtime::SamplingParams& sp, int64_t vocab_size);

}  // namespace kimirt::cli
