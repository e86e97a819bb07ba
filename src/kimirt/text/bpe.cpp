// Both strategies keep, for each current part, the rank of merging it with its right neighbour, and
// remember the id a part gets when it is merged (that rank), so no lookup is repeated at the end.
#include "kimirt/text/bpe.h"

#include <algorithm>
#include <functional>

#include "kimirt/base/error.h"

namespace kimirt::text {
namespace {

constexpr std::uint32_t kNone = 0xFFFFFFFFu;

inline std::uint32_t pair_rank(const BpeVocab& vocab, std::string_view piece, std::uint32_t begin, std::uint32_t end) {
  const TokenId r = vocab.rank_of(piece.substr(begin, end - begin));
  return r == BpeVocab::kNoRank ? kNone : static_cast<std::uint32_t>(r);
}

inline TokenId byte_id(const BpeVocab& vocab, unsigned char b) {
  const TokenId r = vocab.byte_rank(b);
  KIMIRT_CHECK(r != BpeVocab::kNoRank, "byte 0x{:02X} has no rank in the vocabulary, so it cannot be encoded", b);
  return r;
}

}  // namespace

void bpe_merge_scan(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& s) {
  const auto n = static_cast<std::uint32_t>(piece.size());
  auto& starts = s.starts;
  auto& ranks = s.ranks;
  auto& ids = s.ids;
  starts.resize(n + 1);
  ranks.resize(n);
  ids.resize(n);
  for (std::uint32_t i = 0; i <= n; ++i) starts[i] = i;
  for (std::uint32_t i = 0; i < n; ++i) {
    ids[i] = byte_id(vocab, static_cast<unsigned char>(piece[i]));
    ranks[i] = i + 1 < n ? pair_rank(vocab, piece, i, i + 2) : kNone;
  }
  std::uint32_t m = n;  // current number of parts; starts[m] == n
  while (m > 1) {
    std::uint32_t best = 0;
    std::uint32_t best_rank = kNone;
    for (std::uint32_t i = 0; i + 1 < m; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNone) break;
    ids[best] = static_cast<TokenId>(best_rank);
    // Drop part best+1: shift the tails left by one.
    std::copy(starts.begin() + best + 2, starts.begin() + m + 1, starts.begin() + best + 1);
    std::copy(ranks.begin() + best + 2, ranks.begin() + m, ranks.begin() + best + 1);
    std::copy(ids.begin() + best + 2, ids.begin() + m, ids.begin() + best + 1);
    --m;
    ranks[best] = best + 1 < m ? pair_rank(vocab, piece, starts[best], starts[best + 2]) : kNone;
    if (best > 0) ranks[best - 1] = pair_rank(vocab, piece, starts[best - 1], starts[best + 1]);
  }
  out.insert(out.end(), ids.begin(), ids.begin() + m);
}

void bpe_merge_heap(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& s) {
  // Parts are named by their first byte offset; next/prev link the live parts, ranks[i] is the rank of
  // merging part i with the part after it. Heap keys are (rank << 32 | offset), so the smallest key is the
  // lowest rank and, among equal ranks, the leftmost pair: the order tiktoken merges in. Stale keys (the
  // part died or its rank changed) are skipped when popped; a recomputed rank always differs from the old
  // one because it describes a longer byte string, and ranks are unique per byte string.
  const auto n = static_cast<std::uint32_t>(piece.size());
  auto& next = s.next;
  auto& prev = s.prev;
  auto& ranks = s.ranks;
  auto& ids = s.ids;
  auto& heap = s.heap;
  next.resize(n + 1);
  prev.resize(n + 1);
  ranks.resize(n + 1);
  ids.resize(n);
  heap.clear();
  const auto push = [&heap](std::uint32_t rank, std::uint32_t at) {
    heap.push_back((static_cast<std::uint64_t>(rank) << 32) | at);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i + 1] = i;
    ids[i] = byte_id(vocab, static_cast<unsigned char>(piece[i]));
    ranks[i] = i + 1 < n ? pair_rank(vocab, piece, i, i + 2) : kNone;
    if (ranks[i] != kNone) heap.push_back((static_cast<std::uint64_t>(ranks[i]) << 32) | i);
  }
  ranks[n] = kNone;
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  constexpr std::uint32_t kDead = 0xFFFFFFFEu;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const std::uint64_t key = heap.back();
    heap.pop_back();
    const auto rank = static_cast<std::uint32_t>(key >> 32);
    const auto i = static_cast<std::uint32_t>(key & 0xFFFFFFFFu);
    if (next[i] == kDead || ranks[i] != rank) continue;
    const std::uint32_t j = next[i];
    ids[i] = static_cast<TokenId>(rank);
    next[i] = next[j];
    prev[next[j]] = i;
    next[j] = kDead;
    ranks[i] = next[i] < n ? pair_rank(vocab, piece, i, next[next[i]]) : kNone;
    if (ranks[i] != kNone) push(ranks[i], i);
    if (i > 0) {
      const std::uint32_t p = prev[i];
      ranks[p] = pair_rank(vocab, piece, p, next[i]);
      if (ranks[p] != kNone) push(ranks[p], p);
    }
  }
  for (std::uint32_t i = 0; i < n; i = next[i]) out.push_back(ids[i]);
}

void bpe_encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<TokenId>& out, BpeScratch& scratch) {
  if (piece.size() == 1) {
    out.push_back(byte_id(vocab, static_cast<unsigned char>(piece[0])));
    return;
  }
  const TokenId whole = vocab.rank_of(piece);
  if (whole != BpeVocab::kNoRank) {
    out.push_back(whole);
    return;
  }
  if (piece.size() <= kBpeHeapThreshold) {
    bpe_merge_scan(vocab, piece, out, scratch);
  } else {
    bpe_merge_heap(vocab, piece, out, scratch);
  }
}

}  // namespace kimirt::text
