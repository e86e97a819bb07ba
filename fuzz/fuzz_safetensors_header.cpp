// libFuzzer target over parse_safetensors_header. Input: an optional line "<data size>\n" (decimal; 0 when
// absent) followed by the header bytes, so seeds stay readable JSON and the offset checks meet varied data
// sizes. Besides "no crash, no UB, no exception but SafetensorsError", it checks properties:
//   - an accepted header tiles [0, data size) exactly with well-sized tensors;
//   - the collecting validator agrees with the throwing parser (same first problem, none when accepted);
//   - what the reader accepts the writer writes back, and the reader reads that back identically.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string_view>
#include <vector>

#include "fuzz_checks.h"
#include "kimirt/io/safetensors_header.h"

using kimirt::io::SafetensorsError;
using kimirt::io::SafetensorsHeader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  uint64_t data_size = 0;
  if (auto nl = input.find('\n'); nl != std::string_view::npos && nl > 0 && nl <= 20) {
    auto [end, ec] = std::from_chars(input.data(), input.data() + nl, data_size);
    if (ec == std::errc() && end == input.data() + nl) {
      input.remove_prefix(nl + 1);
    } else {
      data_size = 0;
    }
  }

  const auto problems = kimirt::io::find_safetensors_header_problems(input, data_size, "fuzz");
  SafetensorsHeader header;
  try {
    header = kimirt::io::parse_safetensors_header(input, data_size, "fuzz");
  } catch (const SafetensorsError& e) {
    FUZZ_CHECK(!problems.empty(), "parser threw but the collector found nothing");
    FUZZ_CHECK(problems.front().kind() == e.kind(), "collector's first problem differs from the parser's");
    return 0;
  }
  FUZZ_CHECK(problems.empty(), "parser accepted but the collector found problems");
  kimirt::fuzz::check_layout(header, data_size);
  // Rebuilding needs the data bytes; zeros are as good as any for the header round trip.
  if (data_size <= (uint64_t{1} << 16)) {
    std::vector<uint8_t> zeros(data_size, 0);
    kimirt::fuzz::check_round_trip(header, zeros.data());
  }
  return 0;
}
