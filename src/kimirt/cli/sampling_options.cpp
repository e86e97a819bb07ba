#include "kimirt/cli/sampling_options.h"

#include <cfloat>
#include <cstdint>
#include <limits>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/cli/flag_checks.h"

namespace kimirt::cli {

void add_sampling_options(CLI::App* cmd, runtime::SamplingParams& sp, const std::string& max_tokens_help) {
  // --help shows each default (run is greedy, chat samples): set sp's defaults before calling.
  constexpr uint64_t kIntMax = static_cast<uint64_t>(std::numeric_limits<int>::max());
  cmd->add_option("-n,--max-tokens", sp.max_tokens, max_tokens_help)
      ->capture_default_str()
      ->check(decimal_at_most(kIntMax));
  cmd->add_option("--temperature", sp.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(number_in(0.0, FLT_MAX, false, "[0, inf)"));
  cmd->add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->check(decimal_at_most(kIntMax));
  cmd->add_option("--top-p", sp.top_p, "nucleus sampling (1 = off)")
      ->capture_default_str()
      ->check(number_in(0.0, 1.0, true, "(0, 1]"));
  cmd->add_option("--min-p", sp.min_p, "keep tokens with p >= min_p * p_max (0 = off)")
      ->capture_default_str()
      ->check(number_in(0.0, 1.0, false, "[0, 1]"));
  cmd->add_option("--seed", sp.seed, "sampling seed (the same flags, seed and prompt give the same text)")
      ->capture_default_str()
      ->check(decimal_at_most(std::numeric_limits<uint64_t>::max()));
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "Hugging Face repetition penalty (1 = off)")
      ->capture_default_str()
      ->check(number_in(0.0, FLT_MAX, true, "(0, inf)"));
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty")
      ->capture_default_str()
      ->check(number_in(-2.0, 2.0, false, "[-2, 2]"));
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty")
      ->capture_default_str()
      ->check(number_in(-2.0, 2.0, false, "[-2, 2]"));
  cmd->add_option("--stop-id", sp.stop_ids, "stop after this token id (repeatable)")->check(decimal_at_most(kIntMax));
  cmd->add_option("--stop", sp.stop_strings, "stop before this text (repeatable; needs the tokenizer)")
      ->check(utf8_text());
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "keep going past the model's EOS id");
}

void check_stop_ids(const runtime::SamplingParams& sp, int64_t vocab_size) {
  for (const int32_t id : sp.stop_ids) {
    KIMIRT_CHECK(id < vocab_size, "--stop-id {}: outside the model's vocabulary [0, {}), it could never stop", id,
                 vocab_size);
  }
}

}  // namespace kimirt::cli
