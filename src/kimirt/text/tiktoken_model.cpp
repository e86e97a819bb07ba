// tiktoken itself accepts any whitespace between the two fields and skips empty lines; we do the same,
// but reject what tiktoken would silently mis-read (bad base64, gaps or repeats in the ranks).
#include "kimirt/text/tiktoken_model.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/text/base64.h"

namespace kimirt::text {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t'; }

struct Entry {
  std::string bytes;
  size_t line = 0;
};

}  // namespace

BpeVocab parse_tiktoken_model(std::string_view contents, std::string_view name) {
  std::vector<std::pair<std::uint64_t, Entry>> parsed;  // (rank, token)
  parsed.reserve(contents.size() / 12);
  size_t line_no = 0;
  size_t pos = 0;
  std::string decoded;
  while (pos < contents.size()) {
    size_t end = contents.find('\n', pos);
    if (end == std::string_view::npos) end = contents.size();
    std::string_view line = contents.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;

    size_t a = 0;
    while (a < line.size() && is_blank(line[a])) ++a;
    size_t b = a;
    while (b < line.size() && !is_blank(line[b])) ++b;
    size_t c = b;
    while (c < line.size() && is_blank(line[c])) ++c;
    size_t d = c;
    while (d < line.size() && !is_blank(line[d])) ++d;
    size_t e = d;
    while (e < line.size() && is_blank(line[e])) ++e;
    const std::string_view token = line.substr(a, b - a);
    const std::string_view rank_text = line.substr(c, d - c);
    KIMIRT_CHECK(!token.empty() && !rank_text.empty() && e == line.size(),
                 "{}:{}: expected \"<base64 token> <rank>\", got \"{}\"", name, line_no, line.substr(0, 80));
    KIMIRT_CHECK(base64_decode(token, decoded) && !decoded.empty(), "{}:{}: \"{}\" is not valid base64 of a token",
                 name, line_no, token.substr(0, 80));
    std::uint64_t rank = 0;
    const auto [ptr, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    KIMIRT_CHECK(ec == std::errc() && ptr == rank_text.data() + rank_text.size() &&
                     rank <= static_cast<std::uint64_t>(std::numeric_limits<TokenId>::max()),
                 "{}:{}: rank \"{}\" is not a non-negative integer", name, line_no, rank_text.substr(0, 40));
    parsed.push_back({rank, Entry{decoded, line_no}});
  }
  KIMIRT_CHECK(!parsed.empty(), "{}: the file has no tokens", name);

  const size_t n = parsed.size();
  std::vector<size_t> line_of_rank(n, 0);
  for (const auto& [rank, entry] : parsed) {
    KIMIRT_CHECK(rank < n, "{}:{}: rank {} is out of range: the {} tokens must have ranks 0..{}", name, entry.line,
                 rank, n, n - 1);
    KIMIRT_CHECK(line_of_rank[rank] == 0, "{}:{}: rank {} appears twice (first at line {})", name, entry.line, rank,
                 line_of_rank[rank]);
    line_of_rank[rank] = entry.line;
  }
  std::vector<std::string> tokens(n);
  for (auto& [rank, entry] : parsed) tokens[rank] = std::move(entry.bytes);
  return with_context(std::string(name), [&] { return BpeVocab(tokens); });
}

std::string read_text_file(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  KIMIRT_CHECK(f != nullptr, "cannot open {}: {}", path.string(), std::strerror(errno));
  std::string data;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) data.append(buffer, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  KIMIRT_CHECK(!failed, "cannot read {}", path.string());
  return data;
}

BpeVocab load_tiktoken_model(const std::filesystem::path& path) {
  const std::string contents = read_text_file(path);
  return parse_tiktoken_model(contents, path.string());
}

}  // namespace kimirt::text
