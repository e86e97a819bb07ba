// A small direct-mapped cache from piece bytes to their BPE ids. Natural text repeats the same words, and
// a word that is not one token costs several hash lookups per merge; a hit costs one comparison. Only
// pieces that needed merging are stored, and only short ones (long pieces rarely repeat).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/text/bpe_vocab.h"
#include "kimirt/text/token.h"

namespace kimirt::text {

class PieceCache {
 public:
  static constexpr size_t kSlots = 4096;  // power of two
  static constexpr size_t kMaxPieceBytes = 48;

  PieceCache() : entries_(kSlots) {}

  // Ids of `piece` if cached (hash is BpeVocab::hash(piece)), else nullptr.
  const std::vector<TokenId>* find(std::string_view piece, std::uint64_t hash) const {
    const Entry& e = entries_[hash & (kSlots - 1)];
    if (e.hash != hash || e.key.size() != piece.size() ||
        !detail::bytes_equal(e.key.data(), piece.data(), piece.size())) {
      return nullptr;
    }
    return &e.ids;
  }

  // Overwrites the slot; reuses its buffers, so steady-state inserts do not allocate.
  void insert(std::string_view piece, std::uint64_t hash, const TokenId* ids, size_t count) {
    if (piece.size() > kMaxPieceBytes) return;
    Entry& e = entries_[hash & (kSlots - 1)];
    e.hash = hash;
    e.key.assign(piece);
    e.ids.assign(ids, ids + count);
  }

  void clear() {
    for (auto& e : entries_) {
      e.hash = 0;
      e.key.clear();
    }
  }

 private:
  struct Entry {
    std::uint64_t hash = 0;
    std::string key;
    std::vector<TokenId> ids;
  };
  std::vector<Entry> entries_;
};

}  // namespace kimirt::text
