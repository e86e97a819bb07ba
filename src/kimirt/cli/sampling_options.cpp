#include "kimirt/cli/sampling_options.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kimirt/text/utf8.h"

namespace kimirt::cli {

CLI::Validator number_in(double lo, double hi, bool lo_open, const std::string& range) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0.0;
        const bool parsed = CLI::detail::lexical_cast(text, v);
        // Checked as the float it is stored in: 1e-46 passes as a double but is 0 as a float.
        const double f = static_cast<float>(v);
        const bool ok = parsed && std::isfinite(f) && f <= hi && (lo_open ? f > lo : f >= lo);
        return ok ? std::string() : "must be a number in " + range + ", got " + text;
      },
      range);
}

CLI::Validator whole_number_in(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        // Decimal digits only: CLI11 reads "010" as octal 8, "0x10" as 16 and "-1" into an unsigned seed as
        // 2^64 - 1, and saturates a number past its type.
        uint64_t v = 0;
        bool fits = !text.empty();
        for (char c : text) {
          const auto d = static_cast<uint64_t>(c - '0');
          fits = fits && c >= '0' && c <= '9' && v <= (max - d) / 10;
          if (!fits) break;
          v = v * 10 + d;
        }
        if (!fits || v < min) {
          return "must be a whole number in [" + std::to_string(min) + ", " + std::to_string(max) +
                 "] (decimal digits), got " + text;
        }
        text = std::to_string(v);  // without leading zeros, which CLI11 would take for octal
        return std::string();
      },
      "UINT");
}

CLI::Validator decimal_at_most(uint64_t max) { return whole_number_in(0, max); }

const CLI::Validator& utf8_text() {
  static const CLI::Validator v(
      [](std::string& text) {
        if (text.empty()) return std::string("must not be empty");
        const size_t at = text::find_invalid_utf8(text);
        return at == text.size() ? std::string() : "is not valid UTF-8 (byte " + std::to_string(at) + ")";
      },
      "TEXT");
  return v;
}

const CLI::Validator& not_empty() {
  static const CLI::Validator v(
      [](std::string& text) { return text.empty() ? std::string("must not be empty") : std::string(); }, "TEXT");
  return v;
}

void add_sampling_options(CLI::App* cmd, runtime::SamplingParams& sp, const std::string& max_tokens_help) {
  constexpr uint64_t kIntMax = static_cast<uint64_t>(std::numeric_limits<int>::max());
  cmd->add_option("-n,--max-tokens", sp.max_tokens, max_tokens_help)->check(decimal_at_most(kIntMax));
  cmd->add_option("--temperature", sp.temperature, "0 = greedy")->check(number_in(0.0, FLT_MAX, false, "[0, inf)"));
  cmd->add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = off)")->check(decimal_at_most(kIntMax));
  cmd->add_option("--top-p", sp.top_p, "nucleus sampling (1 = off)")->check(number_in(0.0, 1.0, true, "(0, 1]"));
  cmd->add_option("--min-p", sp.min_p, "keep tokens with p >= min_p * p_max (0 = off)")
      ->check(number_in(0.0, 1.0, false, "[0, 1]"));
  cmd->add_option("--seed", sp.seed, "sampling seed (default 0: the same flags and prompt give the same text)")
      ->check(decimal_at_most(std::numeric_limits<uint64_t>::max()));
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "Hugging Face repetition penalty (1 = off)")
      ->check(number_in(0.0, FLT_MAX, true, "(0, inf)"));
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty")
      ->check(number_in(-2.0, 2.0, false, "[-2, 2]"));
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty")
      ->check(number_in(-2.0, 2.0, false, "[-2, 2]"));
  cmd->add_option("--stop-id", sp.stop_ids, "stop after this token id (repeatable)")->check(decimal_at_most(kIntMax));
  cmd->add_option("--stop", sp.stop_strings, "stop before this text (repeatable; needs the tokenizer)")
      ->check(utf8_text());
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "keep going past the model's EOS id");
}

}  // namespace kimirt::cli
