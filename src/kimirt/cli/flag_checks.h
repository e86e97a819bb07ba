// Checks of flag values, run as the flags are parsed: a bad value is refused naming its flag (CLI11 prefixes
// it) before a model is loaded or a byte written, not by every request afterwards or by a later stage that
// names no flag. Shared by every command.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kimirt::cli {

// A text flag given as "" is refused naming the flag (an empty value must not read as "not given").
const CLI::Validator& not_empty();
// Text given as "" or not UTF-8 is refused naming the flag (a stop string that is not UTF-8 could never match
// the decoded text; a prompt that is not was refused by the tokenizer, naming no flag).
const CLI::Validator& utf8_text();

// A finite number in [lo, hi] (or (lo, hi] when lo_open), checked as the float it is stored in (1e-46 is 0 as
// a float), as the flags are parsed: a bad value (NaN, which a plain range check lets through, included) is
// refused naming its flag before a model is loaded, not by every request afterwards. `range` is how the
// message writes the interval.
CLI::Validator number_in(double lo, double hi, bool lo_open, const std::string& range);

// A whole number in [0, max] written in decimal digits only: CLI11 alone reads "010" as octal 8 and wraps
// "-1" into an unsigned flag.
CLI::Validator decimal_at_most(uint64_t max);
// The same in [min, max]: the counts and sizes that must be positive (--tp, --context, make-tiny's dimensions).
CLI::Validator whole_number_in(uint64_t min, uint64_t max);

}  // namespace kimirt::cli
