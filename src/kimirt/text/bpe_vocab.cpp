// Hash map layout: slots hold (tag, rank) only; the key bytes live once, in the decode arena, so the map
// for 163,584 ranks costs 4 MB of slots and no per-key allocation.
#include "kimirt/text/bpe_vocab.h"

#include "kimirt/base/error.h"

namespace kimirt::text {

BpeVocab::BpeVocab(const std::vector<std::string>& tokens) {
  KIMIRT_CHECK(!tokens.empty(), "the vocabulary has no tokens");
  KIMIRT_CHECK(tokens.size() < (1u << 30), "the vocabulary has {} tokens, more than supported", tokens.size());
  size_t total = 0;
  for (const auto& t : tokens) total += t.size();
  KIMIRT_CHECK(total < (1ULL << 32), "the vocabulary holds {} bytes, more than supported", total);
  arena_.reserve(total);
  offsets_.reserve(tokens.size() + 1);
  for (const auto& t : tokens) {
    offsets_.push_back(static_cast<std::uint32_t>(arena_.size()));
    arena_.append(t);
  }
  offsets_.push_back(static_cast<std::uint32_t>(arena_.size()));

  size_t capacity = 16;
  while (capacity < tokens.size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{0, kNoRank});
  mask_ = capacity - 1;
  for (TokenId r = 0; r < size(); ++r) {
    const std::string_view key = bytes(r);
    KIMIRT_CHECK(!key.empty(), "rank {} has no bytes", r);
    const std::uint64_t h = hash(key);
    const std::uint32_t tag = static_cast<std::uint32_t>(h >> 32) | 1u;
    for (std::uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.tag == 0) {
        slot = Slot{tag, r};
        break;
      }
      KIMIRT_CHECK(slot.tag != tag || bytes(slot.rank) != key, "ranks {} and {} have the same bytes", slot.rank, r);
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_ranks_[b] = rank_of(std::string_view(&c, 1));
  }
}

}  // namespace kimirt::text
