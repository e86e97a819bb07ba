// BPE merge order (tiktoken's rule: lowest rank first, leftmost on a tie) and the agreement of the two
// merge strategies on random input.
#include "kimirt/text/bpe.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

// All 256 single bytes, then merges; ranks follow the order of `merges`.
BpeVocab make_vocab(const std::vector<std::string>& merges) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  tokens.insert(tokens.end(), merges.begin(), merges.end());
  return BpeVocab(tokens);
}

std::vector<std::string> pieces(const BpeVocab& vocab, std::string_view text) {
  std::vector<TokenId> ids;
  BpeScratch scratch;
  bpe_encode_piece(vocab, text, ids, scratch);
  std::vector<std::string> out;
  for (const TokenId id : ids) out.emplace_back(vocab.bytes(id));
  return out;
}

TEST(Bpe, MergesLowestRankFirst) {
  // "bc" outranks "ab", so "abc" -> a + bc, even though "ab" comes first in the text.
  const BpeVocab vocab = make_vocab({"bc", "ab"});
  EXPECT_EQ(pieces(vocab, "abc"), (std::vector<std::string>{"a", "bc"}));
  // Whole-piece hit: a piece that is itself a token is that token, merges or not.
  const BpeVocab with_whole = make_vocab({"bc", "ab", "xyzw"});
  EXPECT_EQ(pieces(with_whole, "xyzw"), (std::vector<std::string>{"xyzw"}));
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
  const BpeVocab vocab = make_vocab({"aa"});
  EXPECT_EQ(pieces(vocab, "aaa"), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(pieces(vocab, "aaaaa"), (std::vector<std::string>{"aa", "aa", "a"}));
}

TEST(Bpe, MergedPartsMergeAgain) {
  const BpeVocab vocab = make_vocab({"ab", "cd", "abcd", "abcde"});
  EXPECT_EQ(pieces(vocab, "abcdeab"), (std::vector<std::string>{"abcde", "ab"}));
}

TEST(Bpe, AMissingByteIsAnError) {
  const BpeVocab vocab(std::vector<std::string>{"a", "b", "ab"});
  std::vector<TokenId> ids;
  BpeScratch scratch;
  EXPECT_THROW(bpe_encode_piece(vocab, "ac", ids, scratch), Error);
}

TEST(Bpe, ScanAndHeapAgreeOnRandomInput) {
  // A vocabulary over a 4-letter alphabet with many overlapping merges, so that ties and re-merges are
  // frequent; pieces from 2 to 300 bytes.
  std::mt19937 rng(7);
  std::vector<std::string> merges;
  std::vector<std::string> known = {"a", "b", "c", "d"};
  for (int i = 0; i < 300; ++i) {
    const std::string t = known[rng() % known.size()] + known[rng() % known.size()];
    if (std::find(merges.begin(), merges.end(), t) == merges.end() && t.size() <= 12) {
      merges.push_back(t);
      known.push_back(t);
    }
  }
  const BpeVocab vocab = make_vocab(merges);
  BpeScratch scratch;
  for (int trial = 0; trial < 1000; ++trial) {
    std::string piece(2 + rng() % 299, 'a');
    for (auto& c : piece) c = static_cast<char>('a' + rng() % 4);
    std::vector<TokenId> scan;
    std::vector<TokenId> heap;
    bpe_merge_scan(vocab, piece, scan, scratch);
    bpe_merge_heap(vocab, piece, heap, scratch);
    ASSERT_EQ(scan, heap) << piece;
    std::string joined;
    for (const TokenId id : heap) joined += vocab.bytes(id);
    ASSERT_EQ(joined, piece);
  }
}

}  // namespace
}  // namespace kimirt::text
