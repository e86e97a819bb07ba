// libFuzzer target over a whole safetensors file held in memory (length prefix, header, data), through
// parse_safetensors_buffer: the path SafetensorsFile::open takes, minus the system calls. Every accepted
// tensor's bytes are touched, so a range the validator let through past the buffer trips ASan; then the
// same properties as the header target, with the file's real bytes in the round trip.
#include <cstdint>
#include <vector>

#include "fuzz_checks.h"
#include "kimirt/io/safetensors_header.h"

using kimirt::io::ParsedSafetensors;
using kimirt::io::SafetensorsError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ParsedSafetensors parsed;
  try {
    parsed = kimirt::io::parse_safetensors_buffer({data, size}, "fuzz");
  } catch (const SafetensorsError&) {
    return 0;
  }
  FUZZ_CHECK(parsed.data_offset() <= size, "header inside the buffer");
  const uint64_t data_size = size - parsed.data_offset();
  kimirt::fuzz::check_layout(parsed.header, data_size);
  const uint8_t* section = data + parsed.data_offset();
  volatile uint8_t sink = 0;
  for (const auto& t : parsed.header.tensors) {
    for (uint64_t i = 0; i < t.nbytes(); i += 64) sink = sink ^ section[t.begin + i];
    if (t.nbytes() > 0) sink = sink ^ section[t.end - 1];
  }
  kimirt::fuzz::check_round_trip(parsed.header, section);
  return 0;
}
