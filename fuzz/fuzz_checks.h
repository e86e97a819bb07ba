// Properties shared by the fuzz targets. A violated property aborts, which libFuzzer records as a crash
// with the input that caused it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "kimirt/io/safetensors_header.h"
#include "kimirt/io/safetensors_writer.h"

#define FUZZ_CHECK(cond, what)                                                \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "fuzz property violated: %s (%s)\n", what, #cond); \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

namespace kimirt::fuzz {

// An accepted header describes tensors that tile the data section exactly, each as large as its shape.
inline void check_layout(const io::SafetensorsHeader& header, uint64_t data_size) {
  uint64_t cursor = 0;
  std::set<std::string> names;
  for (const auto& t : header.tensors) {
    FUZZ_CHECK(!t.name.empty() && names.insert(t.name).second, "tensor names are unique and non-empty");
    FUZZ_CHECK(t.begin == cursor && t.end >= t.begin, "tensors are contiguous in data order");
    const auto bytes = dtype_bytes(t.dtype, static_cast<uint64_t>(t.numel()));
    FUZZ_CHECK(bytes && *bytes == t.nbytes(), "byte size matches shape x dtype");
    cursor = t.end;
  }
  FUZZ_CHECK(cursor == data_size, "tensors cover the data section exactly");
}

// Writes the header's tensors (bytes taken from `data`, the data section) and metadata with the writer,
// reads the result back and compares.
inline void check_round_trip(const io::SafetensorsHeader& header, const uint8_t* data) {
  io::SafetensorsWriter writer;
  try {
    for (const auto& t : header.tensors) writer.add(t.name, t.dtype, t.shape, {data + t.begin, t.nbytes()});
    for (const auto& [k, v] : header.metadata) writer.set_metadata(k, v);
  } catch (const io::SafetensorsError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "the writer refuses what the reader accepted");
  }
  const auto file = writer.serialize();
  io::ParsedSafetensors back;
  try {
    back = io::parse_safetensors_buffer(file, "round trip");
  } catch (const io::SafetensorsError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "the reader refuses what the writer wrote");
  }
  FUZZ_CHECK(back.data_offset() % 8 == 0, "the writer pads the header to a multiple of 8");
  FUZZ_CHECK(back.header.metadata == header.metadata, "metadata survives the round trip");
  FUZZ_CHECK(back.header.tensors.size() == header.tensors.size(), "tensor count survives the round trip");
  for (const auto& t : back.header.tensors) {
    const io::TensorInfo* orig = nullptr;
    for (const auto& o : header.tensors) {
      if (o.name == t.name) orig = &o;
    }
    FUZZ_CHECK(orig != nullptr, "names survive the round trip");
    FUZZ_CHECK(orig->dtype == t.dtype && orig->shape == t.shape, "dtype and shape survive the round trip");
    FUZZ_CHECK(t.nbytes() == orig->nbytes(), "sizes survive the round trip");
    FUZZ_CHECK(
        t.nbytes() == 0 || std::memcmp(file.data() + back.data_offset() + t.begin, data + orig->begin, t.nbytes()) == 0,
        "bytes survive the round trip");
  }
}

}  // namespace kimirt::fuzz
