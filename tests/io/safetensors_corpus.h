// The hardening corpus of malformed safetensors files, as data: each case is a whole file made from a
// readable header, the error kind it must raise and what the message must name. Used by the reader's tests
// (tests/io) and by `kimirt inspect`'s (tests/cli). The cases follow the bugs other loaders had
// (spec/checkpoints-and-loading.md §4.3-4.5).
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_test_util.h"
#include "kimirt/io/io_error.h"

namespace kimirt::io::testing {

struct Case {
  std::string name;
  std::string bytes;
  SafetensorsError::Kind kind;
  std::string tensor;    // SafetensorsError::tensor(); empty when the problem is the file's
  std::string mentions;  // a further substring the message must contain
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A valid 16-byte tensor; most cases break one thing about a file built around it.
inline const std::string kW = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";

inline std::string with_w(std::string_view other) { return "{" + kW + "," + std::string(other) + "}"; }

inline std::string entry(std::string_view name, std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) +
         ",\"data_offsets\":" + std::string(offsets) + "}";
}

inline std::vector<Case> corpus() {
  const std::string good = "{" + kW + "}";
  const std::string good_file = st_bytes(good, 16);
  std::vector<Case> cases = {
      // The 8-byte length prefix.
      {"EmptyFile", "", SafetensorsError::Kind::kHeaderTooSmall, "", "0 bytes"},
      {"FewerThan8Bytes", std::string("\x10\x00\x00", 3), SafetensorsError::Kind::kHeaderTooSmall, "", "3 bytes"},
      {"LengthPastEof", st_bytes(good, 0, 1000), SafetensorsError::Kind::kInvalidHeaderLength, "", "1000"},
      {"TruncatedHeader", good_file.substr(0, 8 + good.size() / 2), SafetensorsError::Kind::kInvalidHeaderLength, "", ""},
      {"HugeLength", st_bytes(good, 16, 100'000'001), SafetensorsError::Kind::kHeaderTooLarge, "", "100000001"},
      // N + 8 wraps to 0: a reader that adds before comparing would accept it. The cap catches it first.
      {"LengthPlus8Overflows", st_bytes(good, 16, UINT64_MAX - 7), SafetensorsError::Kind::kHeaderTooLarge, "", ""},
      {"EmptyHeader", st_bytes("", 0), SafetensorsError::Kind::kInvalidJson, "", "empty"},
      // A length shorter than the JSON cuts the object: the rest lands in the data section.
      {"LengthCutsJson", st_bytes(good, 16, good.size() - 1), SafetensorsError::Kind::kInvalidJson, "", ""},

      // Text and JSON level.
      {"InvalidUtf8", st_bytes(with_w(entry("bad\xC3\x28", "U8", "[0]", "[16,16]")), 16), SafetensorsError::Kind::kInvalidUtf8, "",
       "UTF-8"},
      {"OverlongUtf8", st_bytes(with_w(entry("\xC0\xAF", "U8", "[0]", "[16,16]")), 16), SafetensorsError::Kind::kInvalidUtf8, "", ""},
      {"SurrogateUtf8", st_bytes(with_w(entry("\xED\xA0\x80", "U8", "[0]", "[16,16]")), 16), SafetensorsError::Kind::kInvalidUtf8, "",
       ""},
      {"NotJson", st_bytes("{not json}", 0), SafetensorsError::Kind::kInvalidJson, "", ""},
      {"LoneSurrogateEscape", st_bytes(with_w(entry("\\ud800", "U8", "[0]", "[16,16]")), 16), SafetensorsError::Kind::kInvalidJson, "",
       ""},
      {"JsonArray", st_bytes("[1,2,3]", 0), SafetensorsError::Kind::kNotAnObject, "", "'{'"},
      {"JsonString", st_bytes("\"w\"", 0), SafetensorsError::Kind::kNotAnObject, "", ""},
      {"LeadingWhitespace", st_bytes(" " + good, 16), SafetensorsError::Kind::kNotAnObject, "", ""},
      {"NewlinePadding", st_bytes(good + "\n", 16), SafetensorsError::Kind::kInvalidJson, "", "space padding"},
      {"NulPadding", st_bytes(good + std::string(3, '\0'), 16), SafetensorsError::Kind::kInvalidJson, "", ""},
      // nlohmann stops at a NUL as if the input ended: the bytes after it must not be ignored (polyglots).
      {"NulThenMoreJson", st_bytes(good + std::string(1, '\0') + "{}", 16), SafetensorsError::Kind::kInvalidJson, "", "NUL"},
      {"TooDeep", st_bytes("{\"w\":" + std::string(100, '[') + std::string(100, ']') + "}", 0), SafetensorsError::Kind::kInvalidJson, "",
       "deeper"},
      // nlohmann's plain parse would keep the second "w" silently.
      {"DuplicateTensorKey", st_bytes("{" + kW + "," + entry("w", "F32", "[4]", "[0,16]") + "}", 16),
       SafetensorsError::Kind::kDuplicateKey, "", "\"w\""},
      {"DuplicateKeyInEntry",
       st_bytes(R"({"w":{"dtype":"F32","dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})", 16), SafetensorsError::Kind::kDuplicateKey,
       "", "\"dtype\" in \"w\""},
      {"DuplicateMetadataKey", st_bytes(with_w(R"("__metadata__":{"a":"1","a":"2"})"), 16), SafetensorsError::Kind::kDuplicateKey, "",
       "__metadata__"},

      // Entry structure.
      {"EntryNotObject", st_bytes(R"({"w":[0,16]})", 16), SafetensorsError::Kind::kInvalidEntry, "w", "object"},
      {"MissingDataOffsets", st_bytes(R"({"w":{"dtype":"F32","shape":[2,2]}})", 16), SafetensorsError::Kind::kInvalidEntry, "w",
       "data_offsets"},
      {"MissingDtype", st_bytes(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", 16), SafetensorsError::Kind::kInvalidEntry, "w",
       "dtype"},
      {"ExtraField", st_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"offset":0}})", 16),
       SafetensorsError::Kind::kInvalidEntry, "w", "\"offset\""},
      {"DtypeNotString", st_bytes(R"({"w":{"dtype":32,"shape":[2,2],"data_offsets":[0,16]}})", 16), SafetensorsError::Kind::kInvalidEntry,
       "w", "dtype"},
      {"ShapeNotArray", st_bytes("{" + entry("w", "F32", "4", "[0,16]") + "}", 16), SafetensorsError::Kind::kInvalidEntry, "w", "shape"},
      {"EmptyName", st_bytes(with_w(entry("", "U8", "[0]", "[16,16]")), 16), SafetensorsError::Kind::kInvalidEntry, "", "empty"},

      // Dtypes.
      {"UnknownDtype", st_bytes("{" + entry("w", "F33", "[2,2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kUnknownDtype, "w", "F33"},
      {"LowercaseDtype", st_bytes("{" + entry("w", "f32", "[2,2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kUnknownDtype, "w", ""},
      {"UnsupportedDtype", st_bytes("{" + entry("w", "C64", "[2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kUnsupportedDtype, "w",
       "C64"},

      // Shapes and sizes.
      {"NegativeDim", st_bytes("{" + entry("w", "F32", "[-2,2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kInvalidShape, "w",
       "negative"},
      {"NegativeZeroDim", st_bytes("{" + entry("w", "F32", "[-0,4]", "[0,0]") + "}", 0), SafetensorsError::Kind::kInvalidShape, "w",
       "negative"},
      {"NonIntegerDim", st_bytes("{" + entry("w", "F32", "[2.0,2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kInvalidShape, "w",
       "integer"},
      {"StringDim", st_bytes("{" + entry("w", "F32", "[\"2\",2]", "[0,16]") + "}", 16), SafetensorsError::Kind::kInvalidShape, "w",
       "number"},
      {"DimOverInt64", st_bytes("{" + entry("w", "U8", "[9223372036854775808]", "[0,16]") + "}", 16),
       SafetensorsError::Kind::kInvalidShape, "w", "2^63"},
      {"DimOverUint64", st_bytes("{" + entry("w", "U8", "[100000000000000000000]", "[0,16]") + "}", 16),
       SafetensorsError::Kind::kInvalidShape, "w", ""},
      {"ShapeProductOverflows", st_bytes("{" + entry("w", "F32", "[4294967296,4294967296]", "[0,16]") + "}", 16),
       SafetensorsError::Kind::kOverflow, "w", ""},
      // The LiteRT bug: a product that wraps (or hides behind a zero) must not pass as an empty tensor.
      {"OverflowBehindZero", st_bytes("{" + entry("w", "F32", "[0,4294967296,4294967296]", "[0,0]") + "}", 0),
       SafetensorsError::Kind::kOverflow, "w", ""},
      {"ByteSizeOverflows", st_bytes("{" + entry("w", "I64", "[2305843009213693952]", "[0,16]") + "}", 16),
       SafetensorsError::Kind::kOverflow, "w", ""},
      {"OddF4Count", st_bytes("{" + entry("w", "F4", "[3]", "[0,2]") + "}", 2), SafetensorsError::Kind::kPartialByte, "w",
       "whole number of bytes"},

      // Offsets and layout.
      {"OffsetsReversed", st_bytes("{" + entry("w", "F32", "[2,2]", "[16,0]") + "}", 16), SafetensorsError::Kind::kInvalidOffsets, "w",
       "end before"},
      {"NegativeOffset", st_bytes("{" + entry("w", "F32", "[2,2]", "[-16,0]") + "}", 16), SafetensorsError::Kind::kInvalidOffsets, "w",
       "negative"},
      {"ThreeOffsets", st_bytes("{" + entry("w", "F32", "[2,2]", "[0,8,16]") + "}", 16), SafetensorsError::Kind::kInvalidOffsets, "w",
       ""},
      {"FloatOffset", st_bytes("{" + entry("w", "F32", "[2,2]", "[0,16.0]") + "}", 16), SafetensorsError::Kind::kInvalidOffsets, "w",
       "integer"},
      {"OffsetsPastData", st_bytes("{" + entry("w", "F32", "[2,2]", "[0,16]") + "}", 8), SafetensorsError::Kind::kOffsetsOutOfRange, "w",
       "8-byte data section"},
      // The gomlx bug: only END - BEGIN was checked, so offsets far past the data read out of bounds.
      {"OffsetsFarPastData",
       st_bytes("{" + entry("w", "U8", "[15]", "[18446744073709551600,18446744073709551615]") + "}", 15),
       SafetensorsError::Kind::kOffsetsOutOfRange, "w", ""},
      // The mlx bug: a large shape over a few bytes of data.
      {"SizeMismatch", st_bytes("{" + entry("w", "F32", "[1000,1000]", "[0,4]") + "}", 4), SafetensorsError::Kind::kSizeMismatch, "w",
       "4000000 bytes"},
      {"Overlap", st_bytes(with_w(entry("x", "F32", "[2]", "[8,16]")), 16), SafetensorsError::Kind::kOverlap, "x", "'w'"},
      {"SameRangeTwice", st_bytes(with_w(entry("x", "F32", "[2,2]", "[0,16]")), 16), SafetensorsError::Kind::kOverlap, "x", "'w'"},
      {"EmptyTensorInsideAnother", st_bytes(with_w(entry("x", "F32", "[0]", "[8,8]")), 16), SafetensorsError::Kind::kOverlap, "x",
       "inside"},
      {"Gap", st_bytes(with_w(entry("x", "F32", "[2]", "[20,28]")), 28), SafetensorsError::Kind::kGap, "x", "[16, 20)"},
      {"GapAtStart", st_bytes("{" + entry("w", "F32", "[2,2]", "[4,20]") + "}", 20), SafetensorsError::Kind::kGap, "w", "[0, 4)"},
      {"TrailingBytes", st_bytes(good, 20), SafetensorsError::Kind::kTrailingBytes, "", "4 trailing bytes"},
      {"NoTensorsButData", st_bytes("{}", 8), SafetensorsError::Kind::kTrailingBytes, "", "no tensors"},

      // __metadata__.
      {"MetadataValueNotString", st_bytes(with_w(R"("__metadata__":{"format":1})"), 16), SafetensorsError::Kind::kInvalidMetadata, "",
       "\"format\""},
      {"MetadataNotObject", st_bytes(with_w(R"("__metadata__":"pt")"), 16), SafetensorsError::Kind::kInvalidMetadata, "", ""},
      {"MetadataNull", st_bytes(with_w(R"("__metadata__":null)"), 16), SafetensorsError::Kind::kInvalidMetadata, "", ""},
      {"MetadataNested", st_bytes(with_w(R"("__metadata__":{"a":{"b":"c"}})"), 16), SafetensorsError::Kind::kInvalidMetadata, "",
       "\"a\""},
  };
  return cases;
}

}  // namespace kimirt::io::testing
