#include "kimirt/runtime/engine.h"

#include <algorithm>
#include <exception>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/base/log.h"
#include "kimirt/base/timer.h"
#include "kimirt/text/stop_matcher.h"
#include "kimirt/text/stream_decoder.h"

namespace kimirt::runtime {
namespace {

// The text of the exception being handled (inside a catch): its what(), or a word for any other type.
std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

}  // namespace

struct Engine::Request {
  int64_t id = 0;
  GenerationRequest req;
  std::unique_ptr<Sampler> sampler;
  int64_t cache_tokens = 0;  // what it can ever hold in the cache: the prompt and every token fed back
  int64_t prefilled = 0;     // prompt tokens in the cache
  std::vector<int32_t> generated;
  bool finished = false;
  std::optional<text::StreamDecoder> decoder;
  std::optional<text::StopMatcher> stops;

  bool decoding() const { return prefilled == static_cast<int64_t>(req.prompt.size()); }
};

int64_t cache_positions_needed(int64_t prompt_tokens, int max_tokens) {
  return prompt_tokens + std::max(max_tokens - 1, 0);
}

namespace {

int64_t cache_tokens_needed(const GenerationRequest& r) {
  return cache_positions_needed(static_cast<int64_t>(r.prompt.size()), r.sampling.max_tokens);
}

bool contains(std::span<const int32_t> ids, int32_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

}  // namespace

Engine::Engine(Backend& backend, EngineConfig config, TokenCallback on_token)
    : backend_(backend),
      config_(std::move(config)),
      on_token_(std::move(on_token)),
      forward_(backend),
      cache_(backend.cache_config()) {
  config_.scheduler.validate(cache_.config().max_sequences);
  // Every id the model can sample must decode: otherwise the first such token fails its whole batch.
  if (config_.tokenizer) {
    const int64_t vocab = backend_.config().vocab_size;
    KIMIRT_CHECK(config_.tokenizer->vocab_size() >= vocab,
                 "engine: the tokenizer of {} has {} ids, fewer than the model's vocabulary of {} (ids {} to {} could "
                 "not be shown)",
                 config_.tokenizer->source(), config_.tokenizer->vocab_size(), vocab, config_.tokenizer->vocab_size(),
                 vocab - 1);
  }
}

Engine::~Engine() = default;

void resolve_special_stops(const text::Tokenizer& tokenizer, SamplingParams& sampling) {
  std::vector<std::string> kept;
  for (const std::string& stop : sampling.stop_strings) {
    if (const auto id = tokenizer.find_special(stop)) {
      if (!contains(sampling.stop_ids, *id)) sampling.stop_ids.push_back(*id);
      continue;
    }
    for (const text::SpecialToken& special : tokenizer.special_tokens()) {
      KIMIRT_CHECK(stop.find(special.content) == std::string::npos,
                   "stop string \"{}\" holds the special token {} (id {}), which decodes to no text: the string would "
                   "match only ordinary tokens spelling it out, never the token; stop on the token alone (its text as "
                   "the whole stop string, or its id)",
                   stop, special.content, special.id);
    }
    kept.push_back(stop);
  }
  sampling.stop_strings = std::move(kept);
}

int64_t Engine::submit(GenerationRequest request) {
  const int64_t vocab = backend_.config().vocab_size;
  KIMIRT_CHECK(!request.prompt.empty(), "request: the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    KIMIRT_CHECK(request.prompt[i] >= 0 && request.prompt[i] < vocab,
                 "request: prompt token {} is id {}, outside the vocabulary [0, {})", i, request.prompt[i], vocab);
  }
  KIMIRT_CHECK(request.sampling.stop_strings.empty() || config_.tokenizer.has_value(),
               "request: stop strings need a tokenizer, and this engine has none");
  if (config_.tokenizer) {
    with_context("request: stop_strings", [&] { resolve_special_stops(*config_.tokenizer, request.sampling); });
  }
  // A stop id outside the vocabulary could never be sampled: the request would silently run to max_tokens. (The
  // ids of special stop strings included: a tokenizer may know more ids than the model has rows.)
  for (const int32_t id : request.sampling.stop_ids) {
    KIMIRT_CHECK(id >= 0 && id < vocab, "request: stop id {} is outside the vocabulary [0, {})", id, vocab);
  }
  with_context("request", [&] { request.sampling.validate(); });
  const int64_t need = cache_tokens_needed(request);
  const CacheConfig& cc = cache_.config();
  KIMIRT_CHECK(need <= max_request_tokens(),
               "request: the prompt ({} tokens) and max_tokens ({}) need {} cache positions; the cache holds {} "
               "({} blocks of {})",
               request.prompt.size(), request.sampling.max_tokens, need, max_request_tokens(), cc.num_blocks,
               cc.block_size);

  auto r = std::make_unique<Request>();
  r->sampler = std::make_unique<Sampler>(request.sampling, request.prompt);
  r->cache_tokens = need;
  if (config_.tokenizer) {
    r->decoder.emplace(*config_.tokenizer, /*skip_special=*/true, config_.hidden_tags);
    if (!request.sampling.stop_strings.empty()) {
      r->stops.emplace(
          with_context("request: stop_strings", [&] { return text::StopMatcher(request.sampling.stop_strings); }));
    }
  }
  r->req = std::move(request);
  r->id = next_id_.fetch_add(1);
  const int64_t id = r->id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(std::move(r));
    active_.fetch_add(1);
  }
  work_.notify_all();
  return id;
}

void Engine::cancel(int64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(request_id);
  }
  work_.notify_all();
}

bool Engine::idle() const { return active_.load() == 0; }

void Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_.wait_for(lock, timeout, [&] { return !incoming_.empty() || !cancels_.empty(); });
}

void Engine::emit(const TokenEvent& event) {
  if (!on_token_) return;
  try {
    on_token_(event);
  } catch (...) {
    log::error("engine: the token callback of request {} threw: {}", event.request_id, current_exception_text());
  }
}

void Engine::finish(Request& r, FinishReason reason, int32_t token, std::string text, std::string error,
                    std::span<const float> logits) {
  if (r.decoder) {
    // Bytes held back for an incomplete character or a possible stop string are shown now.
    std::string tail = r.decoder->finish();
    if (r.stops) {
      if (r.stops->stopped()) {
        tail.clear();  // after a stop string nothing more is shown
      } else {
        auto res = r.stops->push(tail);
        tail = std::move(res.text);
        // A stop string the held bytes complete (an incomplete character shown as U+FFFD, a held tag name)
        // ends the request as a stop, as it does mid-stream, where a stop string ranks above the length limit.
        if (res.stopped && reason == FinishReason::kLength) reason = FinishReason::kStop;
        if (!r.stops->stopped()) tail += r.stops->finish();
      }
    }
    text += tail;
  }
  if (cache_.contains(r.id)) cache_.release(r.id);
  r.finished = true;
  TokenEvent ev;
  ev.request_id = r.id;
  ev.token = token;
  ev.index = static_cast<int64_t>(r.generated.size()) - (token >= 0 ? 1 : 0);
  ev.finished = true;
  ev.reason = reason;
  ev.text = std::move(text);
  ev.error = std::move(error);
  ev.logits = logits;
  emit(ev);
  // Only now: a thread that waits for idle() must find the last callback done.
  active_.fetch_sub(1);
}

void Engine::after_sample(Request& r, int32_t token, std::span<const float> logits) {
  if (token == kNoToken) {
    finish(r, FinishReason::kError, -1, {},
           fmt::format("token {}: the logits hold no number above -inf (NaN or -inf everywhere): a weight or the "
                       "arithmetic gave NaN",
                       r.generated.size()));
    return;
  }
  r.generated.push_back(token);
  ++stats_.generated_tokens;
  const SamplingParams& sp = r.req.sampling;
  FinishReason reason = FinishReason::kNone;
  if (!sp.ignore_eos && contains(config_.eos_ids, token)) {
    reason = FinishReason::kEos;
  } else if (contains(sp.stop_ids, token)) {
    reason = FinishReason::kStop;
  }
  std::string text;
  if (r.decoder) {
    text = r.decoder->push(token);
    // Through the stop-string matcher even when this token ends the request (EOS, a stop id): text held back
    // for a possible stop string comes out before this token's, in the order they were made.
    if (r.stops) {
      auto res = r.stops->push(text);
      text = std::move(res.text);
      if (res.stopped && reason == FinishReason::kNone) reason = FinishReason::kStop;
    }
  }
  if (reason == FinishReason::kNone && static_cast<int64_t>(r.generated.size()) >= sp.max_tokens) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    finish(r, reason, token, std::move(text), {}, logits);
    return;
  }
  TokenEvent ev;
  ev.request_id = r.id;
  ev.token = token;
  ev.index = static_cast<int64_t>(r.generated.size()) - 1;
  ev.text = std::move(text);
  ev.logits = logits;
  emit(ev);
}

void Engine::take_incoming() {
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& r : incoming_) waiting_.push_back(std::move(r));
    incoming_.clear();
    cancels.swap(cancels_);
  }
  for (int64_t id : cancels) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        finish(**it, FinishReason::kCancelled, -1, {}, {});
        waiting_.erase(it);
        break;
      }
    }
    for (auto& r : running_) {
      if (r->id == id && !r->finished) finish(*r, FinishReason::kCancelled, -1, {}, {});
    }
  }
  drop_finished();
}

void Engine::admit() {
  const int64_t bs = cache_.config().block_size;
  while (!waiting_.empty()) {
    Request& r = *waiting_.front();
    if (r.req.sampling.max_tokens == 0 && !r.req.prompt_logits) {  // nothing to compute
      finish(r, FinishReason::kLength, -1, {}, {});
      waiting_.pop_front();
      continue;
    }
    // First come, first served: a request that does not fit yet holds back the ones behind it.
    if (!cache_.has_free_slot() || cache_.free_blocks() < (r.cache_tokens + bs - 1) / bs) break;
    cache_.open(r.id);
    const bool reserved = cache_.reserve(r.id, r.cache_tokens);
    KIMIRT_ASSERT(reserved);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Engine::drop_finished() {
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->finished; });
}

void Engine::fail_batch(const std::vector<Request*>& batch, const std::string& message) {
  log::error("engine: a step failed: {}", message);
  for (Request* r : batch) {
    if (!r->finished) finish(*r, FinishReason::kError, -1, {}, message);
  }
  drop_finished();
}

void Engine::fail_all(const std::string& message) {
  take_incoming();
  for (auto& r : running_) {
    if (!r->finished) finish(*r, FinishReason::kError, -1, {}, message);
  }
  for (auto& r : waiting_) finish(*r, FinishReason::kError, -1, {}, message);
  waiting_.clear();
  drop_finished();
}

bool Engine::step() {
  const int64_t before = active_.load();
  take_incoming();
  admit();
  if (running_.empty()) {
    if (config_.lockstep) {  // nothing of ours, but the group's collectives need us
      try {
        forward_.run(StepBatch{});
      } catch (...) {
        fail_all("the group's step failed: " + current_exception_text());
        throw;
      }
    }
    return active_.load() != before;
  }

  std::vector<SequenceWork> work;
  for (const auto& r : running_) {
    work.push_back({static_cast<int64_t>(r->req.prompt.size()) - r->prefilled, r->decoding()});
  }
  const std::vector<ScheduledChunk> chunks = schedule_step(work, config_.scheduler);
  StepBatch batch;
  std::vector<Request*> members;
  bool any_prefill = false;
  for (const ScheduledChunk& ch : chunks) {
    Request& r = *running_[ch.sequence];
    const SequenceCache& sc = cache_.at(r.id);
    if (ch.prefill) {
      any_prefill = true;
      const auto ids = std::span<const int32_t>(r.req.prompt)
                           .subspan(static_cast<size_t>(r.prefilled), static_cast<size_t>(ch.num_tokens));
      const bool ends_prompt = r.prefilled + ch.num_tokens == static_cast<int64_t>(r.req.prompt.size());
      const LogitRows rows = r.req.prompt_logits ? LogitRows::kAll : ends_prompt ? LogitRows::kLast : LogitRows::kNone;
      batch.add(ids, r.prefilled, sc.kda_slot, sc.blocks, rows);
    } else {
      const int32_t last = r.generated.back();
      const int64_t start = static_cast<int64_t>(r.req.prompt.size() + r.generated.size()) - 1;
      batch.add(std::span<const int32_t>(&last, 1), start, sc.kda_slot, sc.blocks, LogitRows::kLast);
    }
    members.push_back(&r);
  }

  const Timer timer;
  try {
    ActBuffer logits = forward_.run(batch);
    const int64_t vocab = backend_.config().vocab_size;
    std::vector<int64_t> sample_rows;
    std::vector<Sampler*> samplers;
    std::vector<Request*> sampled;
    std::vector<float> host;
    for (size_t i = 0; i < members.size(); ++i) {
      Request& r = *members[i];
      const StepSequence& s = batch.sequences[i];
      cache_.at(r.id).num_tokens = s.start_position + s.num_tokens;
      if (!r.decoding()) {
        r.prefilled += s.num_tokens;
        stats_.prompt_tokens += s.num_tokens;
        if (r.req.prompt_logits && on_prompt_logits_) {
          host.resize(static_cast<size_t>(s.num_tokens * vocab));
          backend_.to_host(logits.get(), s.first_logit_row, s.num_tokens, host);
          try {
            on_prompt_logits_(r.id, s.start_position, host, s.num_tokens);
          } catch (...) {
            log::error("engine: the prompt-logits callback of request {} threw: {}", r.id, current_exception_text());
          }
        }
        if (!r.decoding()) continue;           // more of the prompt to go
        if (r.req.sampling.max_tokens == 0) {  // the prompt's logits were the request
          finish(r, FinishReason::kLength, -1, {}, {});
          continue;
        }
      }
      sample_rows.push_back(s.first_logit_row + s.num_logit_rows() - 1);
      samplers.push_back(r.sampler.get());
      sampled.push_back(&r);
    }
    // Raw rows are copied before sampling, which may apply penalties in place on some backends.
    std::vector<std::vector<float>> raw(sampled.size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      if (!sampled[i]->req.step_logits) continue;
      raw[i].resize(static_cast<size_t>(vocab));
      backend_.to_host(logits.get(), sample_rows[i], 1, raw[i]);
    }
    std::vector<int32_t> tokens(sampled.size());
    if (!sampled.empty()) backend_.sample(logits.get(), sample_rows, samplers, tokens);
    for (size_t i = 0; i < sampled.size(); ++i) after_sample(*sampled[i], tokens[i], raw[i]);
  } catch (...) {
    const std::string message = current_exception_text();
    fail_batch(members, message);
    if (config_.lockstep) {
      fail_all("the group's step failed: " + message);
      throw;
    }
    return true;
  }

  const double seconds = timer.seconds();
  ++stats_.steps;
  if (any_prefill) {
    stats_.prefill_seconds += seconds;
  } else {
    stats_.decode_seconds += seconds;
    stats_.decode_step_tokens += batch.num_tokens();
  }
  drop_finished();
  return true;
}

void Engine::run_until_idle() {
  while (!idle()) {
    if (!step()) wait_for_work(std::chrono::milliseconds(10));
  }
}

}  // namespace kimirt::runtime
