// Reader behaviour on valid files: writer round trip over every dtype, scalars, empty tensors and
// metadata; pread access by tensor and by absolute range; files the official writer would not produce
// but the format allows; and the errors of lookups and reads.
#include "kimirt/io/safetensors.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <thread>

#include "io/io_test_util.h"
#include "kimirt/io/safetensors_writer.h"

namespace kimirt::io {
namespace {

using testing::ScratchDir;
using testing::st_bytes;
using Kind = SafetensorsError::Kind;

// Distinct bytes per tensor so a read from the wrong offset cannot match.
std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed * 31 + i * 7 + 1);
  return bytes;
}

Shape shape_for(DType dtype) { return dtype == DType::kF4 ? Shape{3, 4} : Shape{3, 5}; }

TEST(Safetensors, RoundTripEveryDtypeScalarEmptyAndMetadata) {
  ScratchDir dir;
  SafetensorsWriter writer;
  std::map<std::string, std::vector<uint8_t>> expected;
  uint8_t seed = 0;
  for (DType dtype : kAllDTypes) {
    const Shape shape = shape_for(dtype);
    const auto bytes = pattern(*dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape))), ++seed);
    const std::string name = "t." + std::string(dtype_name(dtype));
    writer.add(name, dtype, shape, bytes);
    expected[name] = bytes;
  }
  const auto scalar = pattern(4, 99);
  writer.add("scalar", DType::kF32, {}, scalar);
  writer.add("empty", DType::kBF16, {0, 7}, {});
  writer.add("empty.f4", DType::kF4, {5, 0}, {});
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "ünïcode ✓");
  const auto path = dir / "all.safetensors";
  writer.write(path);

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.tensors().size(), std::size(kAllDTypes) + 3);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "ünïcode ✓");
  EXPECT_EQ(file.file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(file.data_offset() % 8, 0u) << "the writer pads the header to a multiple of 8";
  for (const auto& [name, bytes] : expected) {
    const TensorInfo& info = file.at(name);
    const DType dtype = *parse_dtype(name.substr(2));
    EXPECT_EQ(info.dtype, dtype) << name;
    EXPECT_EQ(info.shape, shape_for(dtype)) << name;
    // Descending alignment order puts every tensor on a multiple of its element size.
    const uint64_t elem = std::max(1, dtype_bits(dtype) / 8);
    EXPECT_EQ(file.absolute_offset(info) % elem, 0u) << name;
    Tensor t = file.read_tensor(name);
    ASSERT_EQ(t.nbytes(), bytes.size()) << name;
    EXPECT_EQ(std::memcmp(t.data(), bytes.data(), bytes.size()), 0) << name;
  }
  const TensorInfo& s = file.at("scalar");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  Tensor st = file.read_tensor("scalar");
  EXPECT_EQ(std::memcmp(st.data(), scalar.data(), 4), 0);
  EXPECT_EQ(file.at("empty").nbytes(), 0u);
  EXPECT_EQ(file.read_tensor("empty").shape(), (Shape{0, 7}));
  EXPECT_EQ(file.at("empty.f4").nbytes(), 0u);

  // Data order: offsets ascend and tile the data section.
  uint64_t cursor = 0;
  for (const auto& info : file.tensors()) {
    EXPECT_EQ(info.begin, cursor) << info.name;
    cursor = info.end;
  }
  EXPECT_EQ(cursor, file.file_size() - file.data_offset());

  // The in-memory parse of the serialized bytes sees the same header.
  const auto bytes = writer.serialize();
  const auto parsed = parse_safetensors_buffer(bytes, "memory");
  EXPECT_EQ(parsed.data_offset(), file.data_offset());
  ASSERT_EQ(parsed.header.tensors.size(), file.tensors().size());
  for (size_t i = 0; i < parsed.header.tensors.size(); ++i) {
    EXPECT_EQ(parsed.header.tensors[i].name, file.tensors()[i].name);
    EXPECT_EQ(parsed.header.tensors[i].begin, file.tensors()[i].begin);
  }
}

TEST(Safetensors, ReadBytesSpansTensors) {
  ScratchDir dir;
  SafetensorsWriter writer;
  const auto a = pattern(16, 1), b = pattern(8, 2);
  writer.add("a", DType::kF32, {4}, a);
  writer.add("b", DType::kF32, {2}, b);
  writer.write(dir / "x.safetensors");
  const auto file = SafetensorsFile::open(dir / "x.safetensors");
  // Same dtype: name order, so a then b, back to back: one read covers both.
  std::vector<uint8_t> both(24);
  file.read_bytes(file.absolute_offset(file.at("a")), both.size(), both.data());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), both.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), both.begin() + 16));
  try {
    file.read_bytes(file.file_size() - 4, 8, both.data());
    FAIL() << "read past the end accepted";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos);
  }
  EXPECT_THROW(file.read_bytes(UINT64_MAX, 2, both.data()), SafetensorsError);
}

TEST(Safetensors, AcceptsWhatTheFormatAllowsBeyondTheOfficialWriter) {
  ScratchDir dir;
  // Entries out of offset order, an unaligned F32 (odd header length, no padding), pretty-printed JSON,
  // trailing space padding, two empty tensors on one boundary.
  const std::string header = R"({ "b": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]},
    "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
    "e1": {"dtype": "F32", "shape": [0], "data_offsets": [5, 5]},
    "e2": {"dtype": "I64", "shape": [2, 0], "data_offsets": [5, 5]} }   )";
  std::string bytes = st_bytes(header, 0);
  bytes += std::string("\x07\x00\x00\x80\x3f", 5);
  testing::write_file(dir / "odd.safetensors", bytes);
  const auto file = SafetensorsFile::open(dir / "odd.safetensors");
  ASSERT_EQ(file.tensors().size(), 4u);
  EXPECT_EQ(file.tensors()[0].name, "a");
  EXPECT_EQ(file.tensors()[1].name, "b");
  Tensor b = file.read_tensor("b");
  EXPECT_EQ(b.span<float>()[0], 1.0f);
  EXPECT_EQ(file.read_tensor("a").data_as<uint8_t>()[0], 7);
}

TEST(Safetensors, EmptyFileOfNoTensors) {
  ScratchDir dir;
  SafetensorsWriter writer;
  writer.write(dir / "none.safetensors");
  // The crate's serializer writes exactly this for no tensors and no metadata.
  std::string expected = testing::le64(8) + "{}      ";
  std::ifstream in(dir / "none.safetensors", std::ios::binary);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, expected);
  const auto file = SafetensorsFile::open(dir / "none.safetensors");
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(Safetensors, LookupErrorsNameFileAndTensor) {
  ScratchDir dir;
  SafetensorsWriter writer;
  writer.add("w", DType::kF32, {2}, pattern(8, 3));
  writer.write(dir / "w.safetensors");
  const auto file = SafetensorsFile::open(dir / "w.safetensors");
  EXPECT_EQ(file.find("nope"), nullptr);
  EXPECT_NE(file.find("w"), nullptr);
  try {
    (void)file.at("nope");
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kTensorNotFound);
    EXPECT_NE(std::string(e.what()).find("w.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
  TensorInfo foreign{"foreign", DType::kF32, {1024}, 0, 4096};
  std::vector<uint8_t> sink(4096);
  EXPECT_THROW(file.read(foreign, sink.data()), SafetensorsError);
}

TEST(Safetensors, FileTruncatedAfterOpenIsReportedNotRead) {
  ScratchDir dir;
  SafetensorsWriter writer;
  writer.add("a", DType::kF32, {64}, pattern(256, 4));
  writer.add("b", DType::kF32, {64}, pattern(256, 5));
  const auto path = dir / "t.safetensors";
  writer.write(path);
  const auto file = SafetensorsFile::open(path);
  std::filesystem::resize_file(path, file.file_size() - 100);
  std::vector<uint8_t> out(256);
  file.read(file.at("a"), out.data());  // still whole
  try {
    file.read(file.at("b"), out.data());
    FAIL() << "short read not reported";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kTruncated);
    EXPECT_EQ(e.tensor(), "b");
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

// A file rewritten in place (same inode, same size: every tensor kept its shape) after open() read its header:
// the bytes a reader took from it before and after may belong to two versions. check_unchanged() sees the new
// modification time (set two seconds on, as file systems with coarse timestamps would not show a fast rewrite).
// A one-tensor file at dir/t.safetensors, for the rewrite tests.
std::filesystem::path write_one_tensor(const ScratchDir& dir) {
  SafetensorsWriter writer;
  writer.add("a", DType::kF32, {64}, pattern(256, 4));
  const auto path = dir / "t.safetensors";
  writer.write(path);
  return path;
}

// Rewrites the first data byte of `file` in place: same inode, same size.
void rewrite_first_data_byte(const std::filesystem::path& path, const SafetensorsFile& file) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(file.data_offset()));
  f.put('\x7f');
}

TEST(Safetensors, FileRewrittenInPlaceAfterOpenIsReported) {
  ScratchDir dir;
  const auto path = write_one_tensor(dir);
  const auto file = SafetensorsFile::open(path);
  EXPECT_NO_THROW(file.check_unchanged());
  const auto written = std::filesystem::last_write_time(path);
  rewrite_first_data_byte(path, file);
  std::filesystem::last_write_time(path, written + std::chrono::seconds(2));
  EXPECT_EQ(std::filesystem::file_size(path), file.file_size());
  try {
    file.check_unchanged();
    FAIL() << "a rewrite in place not reported";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kChanged);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("changed while it was read"), std::string::npos) << e.what();
  }
}

// The same rewrite with the old modification time put back afterwards (touch -d, rsync -a --inplace): the status
// change time, which no program can set, still tells.
TEST(Safetensors, FileRewrittenInPlaceWithItsOldModificationTimeIsReported) {
  ScratchDir dir;
  const auto path = write_one_tensor(dir);
  // Past the coarse clock file times are taken from (a few milliseconds), so the rewrite's times differ.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto file = SafetensorsFile::open(path);
  const auto written = std::filesystem::last_write_time(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  rewrite_first_data_byte(path, file);
  std::filesystem::last_write_time(path, written);
  ASSERT_EQ(std::filesystem::last_write_time(path), written);
  try {
    file.check_unchanged();
    FAIL() << "a rewrite in place with its modification time restored not reported";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kChanged);
    EXPECT_NE(std::string(e.what()).find("status changed"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, OpenErrorsForMissingFilesAndDirectories) {
  ScratchDir dir;
  try {
    SafetensorsFile::open(dir / "absent.safetensors");
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kIo);
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos);
  }
  try {
    SafetensorsFile::open(dir.path());
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kIo);
    EXPECT_NE(std::string(e.what()).find("regular file"), std::string::npos);
  }
}

TEST(Safetensors, CollectingValidatorReportsEveryIndependentProblem) {
  const std::string header = R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[-1],"data_offsets":[8,12]},)"
                             R"("c":{"dtype":"F32","shape":[2],"data_offsets":[12,16]},)"
                             R"("d":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
                             R"("__metadata__":{"k":1}})";
  const auto problems = find_safetensors_header_problems(header, 24, "many.safetensors");
  std::vector<Kind> kinds;
  for (const auto& p : problems) kinds.push_back(p.kind());
  // Keys are visited in sorted order ("__metadata__" sorts first), then the layout is checked.
  EXPECT_EQ(kinds, (std::vector<Kind>{Kind::kInvalidMetadata, Kind::kUnknownDtype, Kind::kInvalidShape,
                                      Kind::kSizeMismatch, Kind::kGap}));
  // The same header thrown: the first of them.
  try {
    parse_safetensors_header(header, 24, "many.safetensors");
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kInvalidMetadata);
  }
  EXPECT_TRUE(
      find_safetensors_header_problems(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", 3, "ok").empty());
}

}  // namespace
}  // namespace kimirt::io
