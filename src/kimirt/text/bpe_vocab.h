// The mergeable ranks of a byte-level BPE vocabulary: rank -> bytes (decode table) and bytes -> rank
// (an open-addressing hash map over the same storage). Built once, read-only afterwards, so any number
// of threads may encode with it.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/text/token.h"

namespace kimirt::text {

class BpeVocab {
 public:
  static constexpr TokenId kNoRank = -1;

  BpeVocab() { byte_ranks_.fill(kNoRank); }
  // `tokens[r]` holds the bytes of rank r. Throws kimirt::Error for an empty token or a byte string that
  // appears twice (naming the ranks); callers that know the file name add it with with_context.
  explicit BpeVocab(const std::vector<std::string>& tokens);

  TokenId size() const { return static_cast<TokenId>(offsets_.empty() ? 0 : offsets_.size() - 1); }
  std::string_view bytes(TokenId rank) const {
    return {arena_.data() + offsets_[rank], static_cast<size_t>(offsets_[rank + 1] - offsets_[rank])};
  }
  // Rank of exactly these bytes, or kNoRank.
  TokenId rank_of(std::string_view bytes) const { return rank_of(bytes, hash(bytes)); }
  inline TokenId rank_of(std::string_view bytes, std::uint64_t h) const;
  // Rank of a single byte (precomputed: every BPE starts from bytes).
  TokenId byte_rank(unsigned char b) const { return byte_ranks_[b]; }

  // Inline and branch-light: BPE hashes every candidate pair, mostly 2..8 bytes.
  static inline std::uint64_t hash(std::string_view bytes);

 private:
  struct Slot {
    std::uint32_t tag;  // high bits of the hash, to skip most byte comparisons; 0 = empty
    TokenId rank;
  };

  std::string arena_;                   // all token bytes, rank order
  std::vector<std::uint32_t> offsets_;  // size()+1 offsets into arena_
  std::vector<Slot> slots_;             // power-of-two table, load factor <= 0.5
  std::uint64_t mask_ = 0;
  std::array<TokenId, 256> byte_ranks_;
};

namespace detail {

inline std::uint64_t load64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::uint32_t load32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 1..7 bytes at p as one word: two overlapping 4-byte loads, or three single bytes for n < 4. Both
// cover every byte, so with the length (mixed in separately) distinct strings give distinct words.
inline std::uint64_t load_tail(const char* p, size_t n) {
  if (n >= 4) return load32(p) | (static_cast<std::uint64_t>(load32(p + n - 4)) << 32);
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return u[0] | (static_cast<std::uint64_t>(u[n / 2]) << 8) | (static_cast<std::uint64_t>(u[n - 1]) << 16);
}

// Equality of two n-byte strings without a call for the short ones BPE compares all the time: overlapping
// word loads cover every byte.
inline bool bytes_equal(const char* a, const char* b, size_t n) {
  if (n >= 8 && n <= 16) return load64(a) == load64(b) && load64(a + n - 8) == load64(b + n - 8);
  if (n < 8) return n == 0 || load_tail(a, n) == load_tail(b, n);
  return std::memcmp(a, b, n) == 0;
}

inline std::uint64_t mix(std::uint64_t x) {
  x *= 0x9E3779B97F4A7C15ULL;
  return x ^ (x >> 32);
}

}  // namespace detail

std::uint64_t BpeVocab::hash(std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  std::uint64_t h = 0x243F6A8885A308D3ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  while (n >= 8) {
    h = detail::mix(h ^ detail::load64(p));
    p += 8;
    n -= 8;
  }
  if (n > 0) h = detail::mix(h ^ detail::load_tail(p, n));
  h *= 0xBF58476D1CE4E5B9ULL;
  return h ^ (h >> 29);
}

TokenId BpeVocab::rank_of(std::string_view key, std::uint64_t h) const {
  if (slots_.empty()) return kNoRank;
  const std::uint32_t tag = static_cast<std::uint32_t>(h >> 32) | 1u;
  for (std::uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = slots_[i];
    if (slot.tag == 0) return kNoRank;
    if (slot.tag == tag) {
      const std::uint32_t begin = offsets_[slot.rank];
      if (offsets_[slot.rank + 1] - begin == key.size() &&
          detail::bytes_equal(arena_.data() + begin, key.data(), key.size())) {
        return slot.rank;
      }
    }
  }
}

}  // namespace kimirt::text
