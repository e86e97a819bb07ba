// The writer: byte-for-byte what the official serializer produces (its own test vectors), its entry
// order, atomic replacement, and refusal of input the reader would reject.
#include "kimirt/io/safetensors_writer.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/io_test_util.h"
#include "kimirt/io/safetensors.h"

namespace kimirt::io {
namespace {

using testing::le64;
using testing::ScratchDir;
using Kind = SafetensorsError::Kind;

std::string as_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::string f32_bytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return out;
}

// What a scratch directory holds, by name: a temp file left behind shows here.
std::vector<std::string> sorted_names(const ScratchDir& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Expected bytes are those of the safetensors crate's own serializer tests (test_serialization,
// test_serialization_forced_alignement, test_empty).
TEST(SafetensorsWriter, MatchesOfficialSerializerBytes) {
  const std::string data = f32_bytes({0, 1, 2, 3, 4, 5});
  {
    SafetensorsWriter w;
    w.add("attn.0", DType::kF32, {1, 2, 3}, span_of(data));
    const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    EXPECT_EQ(as_string(w.serialize()), le64(64) + header + data);
  }
  {
    SafetensorsWriter w;
    w.add("attn0", DType::kF32, {1, 1, 2, 3}, span_of(data));
    const std::string header = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
    EXPECT_EQ(as_string(w.serialize()), le64(72) + header + std::string(7, ' ') + data);
  }
  {
    SafetensorsWriter w;
    w.set_metadata("framework", "pt");
    EXPECT_EQ(as_string(w.serialize()), le64(40) + R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' '));
  }
}

TEST(SafetensorsWriter, OrdersByDescendingAlignmentThenName) {
  SafetensorsWriter w;
  const std::vector<uint8_t> zeros(64, 0);
  auto add = [&](const char* name, DType dtype, Shape shape) {
    const auto n = *dtype_bytes(dtype, static_cast<uint64_t>(shape_numel(shape)));
    w.add(name, dtype, shape, std::span<const uint8_t>(zeros.data(), n));
  };
  add("z", DType::kU8, {3});
  add("a", DType::kBF16, {1});
  add("m", DType::kF32, {1});
  add("b", DType::kF32, {1});
  add("q", DType::kI64, {1});
  add("f", DType::kF4, {2});
  add("k", DType::kBool, {1});
  add("e", DType::kF8E4M3, {1});
  w.set_metadata("format", "pt");
  const std::string expected = R"({"__metadata__":{"format":"pt"},)"
                               R"("q":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                               R"("m":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},)"
                               R"("a":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]},)"
                               R"("e":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[18,19]},)"
                               R"("z":{"dtype":"U8","shape":[3],"data_offsets":[19,22]},)"
                               R"("f":{"dtype":"F4","shape":[2],"data_offsets":[22,23]},)"
                               R"("k":{"dtype":"BOOL","shape":[1],"data_offsets":[23,24]}})";
  const std::string header = w.header();
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.substr(0, expected.size()), expected);
  EXPECT_EQ(header.find_first_not_of(' ', expected.size()), std::string::npos);
}

TEST(SafetensorsWriter, GathersStridedViews) {
  Tensor t = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  TensorView transposed(DType::kF32, {3, 2}, {1, 3}, t.data());
  SafetensorsWriter w;
  w.add("t", transposed);
  w.add("c", t.view());
  ScratchDir dir;
  w.write(dir / "v.safetensors");
  const auto file = SafetensorsFile::open(dir / "v.safetensors");
  EXPECT_EQ(file.read_tensor("t").to_f32(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(file.read_tensor("c").to_f32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(SafetensorsWriter, ReplacesAtomicallyAndLeavesNoTempOnFailure) {
  ScratchDir dir;
  const auto path = dir / "m.safetensors";
  const std::string one = f32_bytes({1}), two = f32_bytes({2, 2});
  SafetensorsWriter first;
  first.add("x", DType::kF32, {1}, span_of(one));
  first.write(path);
  SafetensorsWriter second;
  second.add("y", DType::kF32, {2}, span_of(two));
  second.write(path);
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("x"), nullptr);
  EXPECT_NE(file.find("y"), nullptr);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::others_read);

  // A directory where the file should go: refused, named, before a byte is written.
  std::filesystem::create_directory(dir / "blocked.safetensors");
  try {
    second.write(dir / "blocked.safetensors");
    FAIL() << "write over a directory succeeded";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), Kind::kIo);
    EXPECT_NE(std::string(e.what()).find("blocked.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  // A directory that does not exist: nothing can be created at all.
  EXPECT_THROW(second.write(dir / "no" / "such.safetensors"), SafetensorsError);
  EXPECT_EQ(sorted_names(dir), (std::vector<std::string>{"blocked.safetensors", "m.safetensors"}));
}

// A FIFO (like a character device such as /dev/stdout) is written in place and stays a FIFO: renaming a temp
// file over it would replace it by a regular file. A symbolic link stays a link and its file is replaced.
TEST(SafetensorsWriter, WritesIntoAFifoAndThroughASymbolicLink) {
  ScratchDir dir;
  const std::string one = f32_bytes({1}), two = f32_bytes({2, 2});
  SafetensorsWriter w;
  w.add("x", DType::kF32, {1}, span_of(one));
  const auto fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opened for reading and writing, non-blocking: the writer's open does not wait for a reader, and the file
  // (far below the pipe's 64 KB) sits in the pipe until read here; a write that went elsewhere leaves it empty.
  const int rfd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(rfd, 0);
  w.write(fifo);
  std::string got(1 << 16, '\0');
  const ssize_t n = ::read(rfd, got.data(), got.size());
  ::close(rfd);
  got.resize(n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_EQ(got, as_string(w.serialize()));
  EXPECT_TRUE(std::filesystem::is_fifo(std::filesystem::symlink_status(fifo)));

  const auto file = dir / "real.safetensors", link = dir / "link.safetensors";
  w.write(file);
  std::filesystem::create_symlink(file.filename(), link);
  SafetensorsWriter second;
  second.add("y", DType::kF32, {2}, span_of(two));
  second.write(link);
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  const auto written = SafetensorsFile::open(file);
  EXPECT_EQ(written.find("x"), nullptr);
  EXPECT_NE(written.find("y"), nullptr);
  EXPECT_EQ(sorted_names(dir), (std::vector<std::string>{"link.safetensors", "pipe", "real.safetensors"}))
      << "no temp left";
}

// Where a write goes, beyond FIFOs and links to files: a replaced file keeps its permissions; a dangling link of
// this user names the file to create; a link another user owns is replaced itself, not followed (it may have
// been planted in a shared directory); a socket is refused, naming it.
TEST(SafetensorsWriter, DestinationsBeyondFilesAndFifos) {
  ScratchDir dir;
  const std::string one = f32_bytes({1});
  SafetensorsWriter w;
  w.add("x", DType::kF32, {1}, span_of(one));
  const auto file = dir / "private.safetensors";
  w.write(file);
  std::filesystem::permissions(file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  w.write(file);
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  const auto dangling = dir / "dangling.safetensors";
  std::filesystem::create_symlink("made.safetensors", dangling);
  w.write(dangling);
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_NE(SafetensorsFile::open(dir / "made.safetensors").find("x"), nullptr);

  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = (dir / "sock").string();
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  try {
    w.write(sock_path);
    ADD_FAILURE() << "a socket was written";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("is neither a file, a FIFO nor a character device"), std::string::npos)
        << e.what();
  }
  ::close(sock);
  EXPECT_TRUE(std::filesystem::is_socket(std::filesystem::symlink_status(sock_path)));

  // A link owned by another user (only root can make one here).
  const auto target = dir / "theirs.safetensors", planted = dir / "planted.safetensors";
  w.write(target);
  std::filesystem::create_symlink(target.filename(), planted);
  if (::lchown(planted.c_str(), 65534, 65534) != 0) GTEST_SKIP() << "cannot give a link to another user here";
  SafetensorsWriter other;
  const std::string two = f32_bytes({2, 2});
  other.add("y", DType::kF32, {2}, span_of(two));
  other.write(planted);
  EXPECT_FALSE(std::filesystem::is_symlink(planted)) << "the planted link was followed";
  EXPECT_NE(SafetensorsFile::open(target).find("x"), nullptr) << "the file it named was replaced";
  EXPECT_NE(SafetensorsFile::open(planted).find("y"), nullptr);
}

TEST(SafetensorsWriter, RefusesWhatTheReaderWouldReject) {
  const std::vector<uint8_t> eight(8, 0);
  auto kind_of = [&](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const SafetensorsError& e) {
      return std::string(kind_name(e.kind()));
    }
    return "accepted";
  };
  const std::string invalid(kind_name(Kind::kInvalidArgument));
  SafetensorsWriter w;
  w.add("ok", DType::kF32, {2}, eight);
  EXPECT_EQ(kind_of([&] { w.add("ok", DType::kF32, {2}, eight); }), invalid);  // twice
  EXPECT_EQ(kind_of([&] { w.add("", DType::kF32, {2}, eight); }), invalid);    // empty
  EXPECT_EQ(kind_of([&] { w.add("__metadata__", DType::kF32, {2}, eight); }), invalid);
  EXPECT_EQ(kind_of([&] { w.add("n", DType::kF32, {3}, eight); }), invalid);  // 12 bytes expected
  EXPECT_EQ(kind_of([&] { w.add("n", DType::kF32, {-2}, eight); }), invalid);
  EXPECT_EQ(kind_of([&] { w.add("n", DType::kF4, {3}, std::span(eight).first(1)); }), invalid);
  EXPECT_EQ(kind_of([&] { w.add("n", DType::kU8, {0, INT64_MAX, 4}, {}); }), invalid);
  EXPECT_EQ(kind_of([&] { w.add("bad\xff", DType::kF32, {2}, eight); }), invalid);
  EXPECT_EQ(kind_of([&] { w.set_metadata("k", "\xc0\x80"); }), invalid);
  EXPECT_EQ(w.size(), 1u);
  // Names with quotes, backslashes and control characters are escaped and read back unchanged.
  const std::string odd = "a\"b\\c\nd\x01";
  w.add(odd, DType::kU8, {1}, std::span(eight).first(1));
  const auto parsed = parse_safetensors_buffer(w.serialize(), "memory");
  ASSERT_EQ(parsed.header.tensors.size(), 2u);
  EXPECT_TRUE(parsed.header.tensors[0].name == odd || parsed.header.tensors[1].name == odd);
}

}  // namespace
}  // namespace kimirt::io
