// Byte-pair encoding of one pre-tokenized piece with tiktoken's merge rule: starting from single bytes,
// repeatedly merge the adjacent pair whose concatenated bytes have the lowest rank (the leftmost such
// pair on a tie) until no adjacent pair is in the vocabulary.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kimirt/text/bpe_vocab.h"

namespace kimirt::text {

// Reusable buffers, so that encoding a piece allocates nothing once they have grown.
struct BpeScratch {
  std::vector<std::uint32_t> starts;
  std::vector<std::uint32_t> ranks;
  std::vector<TokenId> ids;
  std::vector<std::uint32_t> next;
  std::vector<std::uint32_t> prev;
  std::vector<std::uint64_t> heap;
};

// Pieces up to this many bytes use the quadratic scan (fast for short words); longer ones (a paragraph
// of Han characters, a run of punctuation) use a heap, O(n log n).
inline constexpr size_t kBpeHeapThreshold = 32;

// Appends the ids of `piece` (non-empty) to `out`. Throws kimirt::Error when a byte of the piece has no
// rank (a vocabulary without all 256 single bytes cannot encode arbitrary text).
void bpe_encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& scratch);

// The two strategies, exposed so a test can check that they agree on every input.
void bpe_merge_scan(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& scratch);
void bpe_merge_heap(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& scratch);

}  // namespace kimirt::text
