#include "kimirt/cli/flag_checks.h"

#include <cmath>
#include <cstdint>
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

}  // namespace kimirt::cli
