#include "kimirt/cli/sampling_options.h"

namespace kimirt::cli {

void add_sampling_options(CLI::App* cmd, runtime::SamplingParams& sp, const std::string& max_tokens_help) {
  cmd->add_option("-n,--max-tokens", sp.max_tokens, max_tokens_help)->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", sp.temperature, "0 = greedy");
  cmd->add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", sp.top_p, "nucleus sampling (1 = off)");
  cmd->add_option("--min-p", sp.min_p, "keep tokens with p >= min_p * p_max (0 = off)");
  cmd->add_option("--seed", sp.seed, "sampling seed");
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "Hugging Face repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty");
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty");
  cmd->add_option("--stop-id", sp.stop_ids, "stop after this token id (repeatable)");
  cmd->add_option("--stop", sp.stop_strings, "stop before this text (repeatable; needs the tokenizer)");
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "keep going past the model's EOS id");
}

}  // namespace kimirt::cli
