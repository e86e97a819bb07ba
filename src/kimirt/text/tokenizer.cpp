// Encoding path: validate UTF-8 once, cut at allowed special tokens, split each stretch with the Kimi
// pattern, then per piece: one vocabulary lookup (most words are one token), else the piece cache, else
// BPE. The per-thread scratch (spans, BPE buffers, cache) makes steady-state encoding allocation-free.
#include "kimirt/text/tokenizer.h"

#include <atomic>

#include "kimirt/base/error.h"
#include "kimirt/text/bpe.h"
#include "kimirt/text/bpe_vocab.h"
#include "kimirt/text/piece_cache.h"
#include "kimirt/text/pretokenizer.h"
#include "kimirt/text/tiktoken_model.h"
#include "kimirt/text/utf8.h"

namespace kimirt::text {

struct Tokenizer::Impl {
  std::string source;
  BpeVocab vocab;
  SpecialTokenTable specials;
  std::optional<TokenId> bos, eos, pad, unk;
  bool config_chat_template = false;
  std::uint64_t instance = 0;  // tells the per-thread caches which tokenizer they hold pieces of
};

namespace {

const Pretokenizer& kimi_pretokenizer() {
  static const Pretokenizer pretokenizer;
  return pretokenizer;
}

std::uint64_t next_instance() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

struct EncodeScratch {
  std::uint64_t instance = 0;
  std::vector<PieceSpan> spans;
  BpeScratch bpe;
  PieceCache cache;
};

// One huge piece (a 100 MB run of one character) sizes the thread's scratch to it, 30-50 bytes per input
// byte; kept, it would stay that large for the thread's life. Buffers past this many elements are freed when
// the call ends (the next huge input pays for its allocation again, a small cost beside its merges).
constexpr size_t kScratchKeep = size_t{1} << 20;

template <typename V>
void release_if_huge(V& v) {
  if (v.capacity() > kScratchKeep) V().swap(v);
}

struct TrimScratchOnExit {
  EncodeScratch& s;
  ~TrimScratchOnExit() {
    release_if_huge(s.spans);
    release_if_huge(s.bpe.starts);
    release_if_huge(s.bpe.ranks);
    release_if_huge(s.bpe.ids);
    release_if_huge(s.bpe.next);
    release_if_huge(s.bpe.prev);
    release_if_huge(s.bpe.heap);
  }
};

EncodeScratch& scratch_for(const Tokenizer::Impl& impl) {
  thread_local EncodeScratch scratch;
  if (scratch.instance != impl.instance) {
    scratch.cache.clear();
    scratch.instance = impl.instance;
  }
  return scratch;
}

std::optional<TokenId> role_id(const Tokenizer::Impl& impl, const std::optional<std::string>& content,
                               const char* field) {
  if (!content) return std::nullopt;
  const auto id = impl.specials.find(*content);
  KIMIRT_CHECK(id.has_value(), "{}: {}: field \"{}\" names \"{}\", which is not one of its special tokens", impl.source,
               kTokenizerConfigFile, field, *content);
  return id;
}

void encode_ordinary(const Tokenizer::Impl& impl, std::string_view text, EncodeScratch& s, std::vector<TokenId>& out) {
  if (text.empty()) return;
  s.spans.clear();
  kimi_pretokenizer().split(text, s.spans);
  for (const PieceSpan span : s.spans) {
    const std::string_view piece = text.substr(span.begin, span.end - span.begin);
    if (piece.size() == 1) {
      bpe_encode_piece(impl.vocab, piece, out, s.bpe);
      continue;
    }
    const std::uint64_t h = BpeVocab::hash(piece);
    const TokenId whole = impl.vocab.rank_of(piece, h);
    if (whole != BpeVocab::kNoRank) {
      out.push_back(whole);
      continue;
    }
    if (const auto* cached = s.cache.find(piece, h)) {
      out.insert(out.end(), cached->begin(), cached->end());
      continue;
    }
    const size_t before = out.size();
    if (piece.size() <= kBpeHeapThreshold) {
      bpe_merge_scan(impl.vocab, piece, out, s.bpe);
    } else {
      bpe_merge_heap(impl.vocab, piece, out, s.bpe);
    }
    s.cache.insert(piece, h, out.data() + before, out.size() - before);
  }
}

std::shared_ptr<const Tokenizer::Impl> build_impl(std::string source, std::string_view model_text,
                                                  const std::string& model_name, std::string_view config_text,
                                                  const std::string& config_name) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->source = std::move(source);
  impl->vocab = parse_tiktoken_model(model_text, model_name);
  const TokenizerConfig config = parse_tokenizer_config(config_text, config_name);
  impl->specials = SpecialTokenTable(config, impl->vocab.size(), config_name);
  impl->bos = role_id(*impl, config.bos_token, "bos_token");
  impl->eos = role_id(*impl, config.eos_token, "eos_token");
  impl->pad = role_id(*impl, config.pad_token, "pad_token");
  impl->unk = role_id(*impl, config.unk_token, "unk_token");
  impl->config_chat_template = config.has_chat_template;
  impl->instance = next_instance();
  return impl;
}

}  // namespace

Tokenizer Tokenizer::from_contents(std::string_view tiktoken_model, std::string_view config_json,
                                   std::string_view name) {
  const std::string source(name);
  return Tokenizer(build_impl(source, tiktoken_model, source + "/" + kTiktokenModelFile, config_json,
                              source + "/" + kTokenizerConfigFile));
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tiktoken_model, const std::filesystem::path& config) {
  const std::string model_text = read_text_file(tiktoken_model);
  const std::string config_text = read_text_file(config);
  return Tokenizer(build_impl(tiktoken_model.parent_path().string(), model_text, tiktoken_model.string(), config_text,
                              config.string()));
}

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  return from_files(model_dir / kTiktokenModelFile, model_dir / kTokenizerConfigFile);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_append(text, allow_special, ids);
  return ids;
}

void Tokenizer::encode_append(std::string_view text, bool allow_special, std::vector<TokenId>& out) const {
  KIMIRT_CHECK(text.size() < (1ULL << 32), "text of {} bytes is too long to encode at once (limit 4 GiB)", text.size());
  const size_t bad = find_invalid_utf8(text);
  KIMIRT_CHECK(bad == text.size(), "text to encode is not valid UTF-8 (byte {} of {})", bad, text.size());
  EncodeScratch& scratch = scratch_for(*impl_);
  const TrimScratchOnExit trim{scratch};
  if (!allow_special) {
    encode_ordinary(*impl_, text, scratch, out);
    return;
  }
  size_t pos = 0;
  while (true) {
    const auto match = impl_->specials.next_match(text, pos);
    const size_t end = match ? match->pos : text.size();
    encode_ordinary(*impl_, text.substr(pos, end - pos), scratch, out);
    if (!match) break;
    out.push_back(match->id);
    pos = match->pos + match->length;
  }
}

std::string_view Tokenizer::id_to_bytes(TokenId id) const {
  KIMIRT_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary of {} (ids 0..{})", id,
               impl_->source, vocab_size() - 1);
  if (id < num_ranks()) return impl_->vocab.bytes(id);
  return impl_->specials.content(id);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (const TokenId id : ids) {
    if (skip_special && is_special(id)) continue;
    text.append(id_to_bytes(id));
  }
  return text;
}

TokenId Tokenizer::vocab_size() const { return impl_->vocab.size() + kNumSpecialIds; }
TokenId Tokenizer::num_ranks() const { return impl_->vocab.size(); }

std::optional<TokenId> Tokenizer::find_special(std::string_view content) const { return impl_->specials.find(content); }

TokenId Tokenizer::special_id(std::string_view content) const {
  const auto id = impl_->specials.find(content);
  KIMIRT_CHECK(id.has_value(), "the tokenizer of {} has no special token \"{}\"", impl_->source, content);
  return *id;
}

const std::vector<SpecialToken>& Tokenizer::special_tokens() const { return impl_->specials.tokens(); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->pad; }
std::optional<TokenId> Tokenizer::unk_id() const { return impl_->unk; }
bool Tokenizer::has_config_chat_template() const { return impl_->config_chat_template; }
bool Tokenizer::jit_enabled() const { return kimi_pretokenizer().jit_enabled(); }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace kimirt::text
