// The sampling and stopping flags that `kimirt run` and `kimirt chat` share, registered once so that the two
// commands take the same flags with the same meaning.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "kimirt/runtime/sampling_params.h"

namespace kimirt::cli {

// -n/--max-tokens (described by `max_tokens_help`), --temperature, --top-k, --top-p, --min-p, --seed,
// --repetition-penalty, --presence-penalty, --frequency-penalty, --stop-id, --stop, --ignore-eos.
void add_sampling_options(CLI::App* cmd, runtime::SamplingParams& sp, const std::string& max_tokens_help);

}  // namespace kimirt::cli
