// The engine: requests in, tokens out as they are produced. Several requests share each step (continuous
// batching: a new request's prefill joins the running decodes; long prompts go in chunks). A request
// reserves the cache it can ever need when it is admitted (prompt + max_tokens − 1 positions: the last token
// is never fed back), so a running request never runs out of room; a request larger than the whole cache is
// refused at submit, others wait for room, first come first served.
//
// Threads: step() runs on one thread (the one that owns the backend); submit() and cancel() may be called
// from any thread at any time. Callbacks run on the step() thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cache_manager.h"
#include "kimirt/runtime/forward.h"
#include "kimirt/runtime/request.h"
#include "kimirt/runtime/scheduler.h"
#include "kimirt/text/stream_decoder.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::runtime {

// Cache positions a request of `prompt_tokens` and max_tokens needs: the last sampled token is never fed back,
// so prompt + max_tokens - 1 (the prompt alone for max_tokens 0). What a cache sized for one request must hold.
int64_t cache_positions_needed(int64_t prompt_tokens, int max_tokens);

// Special tokens decode to no text (TokenEvent::text leaves them out), so a stop string holding one could never
// match: a stop string that is exactly a special token's text becomes a stop on its id (added to stop_ids); one
// that holds a special token among other text is refused, naming both. Engine::submit applies it; a front end
// calls it too, to refuse a flag before the weights are loaded.
void resolve_special_stops(const text::Tokenizer& tokenizer, SamplingParams& sampling);

struct EngineConfig {
  SchedulerConfig scheduler;
  std::vector<int32_t> eos_ids;  // the model's end-of-sequence ids (stop unless ignore_eos)
  // Enables TokenEvent::text and stop strings; must know every id of the model (the constructor checks).
  std::optional<text::Tokenizer> tokenizer;
  // Markup whose tag names TokenEvent::text and the stop strings leave out (a chat's K3 channel tags:
  // ChatTemplate::tag_markup), as they leave out special tokens.
  std::optional<text::TagMarkup> hidden_tags;
  // One rank of a parallel group (set by ParallelEngine): every step() runs the forward, with no tokens when
  // this rank has nothing to run, so that the other ranks' collectives find it; and a failing step is
  // rethrown after its requests are failed, because the group cannot tell which collective each rank is in.
  bool lockstep = false;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;       // prompt tokens run through the model
  int64_t generated_tokens = 0;    // tokens sampled
  double prefill_seconds = 0.0;    // steps that ran prompt tokens (with any decodes riding along)
  double decode_seconds = 0.0;     // steps that ran decode tokens only
  int64_t decode_step_tokens = 0;  // tokens fed in decode-only steps
};

class Engine {
 public:
  using TokenCallback = std::function<void(const TokenEvent&)>;
  // rows [n, vocab]: the logits of prompt positions first_position .. first_position + n - 1.
  using PromptLogitsCallback =
      std::function<void(int64_t request_id, int64_t first_position, std::span<const float> rows, int64_t n)>;

  // The backend must outlive the engine; the engine owns the bookkeeping of the backend's cache.
  Engine(Backend& backend, EngineConfig config, TokenCallback on_token);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void set_prompt_logits_callback(PromptLogitsCallback callback) { on_prompt_logits_ = std::move(callback); }

  // Thread-safe. Checks the request (prompt ids within the vocabulary, sampling parameters, that it can fit
  // in the cache at all) and queues it; returns its id. Throws an Error naming the field otherwise.
  int64_t submit(GenerationRequest request);
  // Thread-safe. The request ends with a kCancelled event at the next step (nothing happens for an id that
  // is unknown or already finished).
  void cancel(int64_t request_id);

  // Runs one step: takes new requests and cancellations, admits what fits, runs one batch, delivers its
  // tokens. Returns false when there was nothing to do (a lockstep engine has then run an empty forward). A
  // failing forward ends the batch's requests with kError and the engine goes on; a lockstep engine ends every
  // request it holds (fail_all) and rethrows.
  bool step();
  // Steps until every request has finished.
  void run_until_idle();
  // Blocks until a request or cancellation arrives or the timeout passes (for a serving loop).
  void wait_for_work(std::chrono::milliseconds timeout);

  bool idle() const;  // thread-safe: nothing queued, waiting or running, and every final event delivered
  // For the step() thread: ends every request the engine holds (queued, waiting or running) with a kError event
  // carrying `message`. A lockstep engine does so itself when its step fails, since its group cannot go on.
  void fail_all(const std::string& message);
  // For the step() thread (or once the engine is idle).
  const EngineStats& stats() const { return stats_; }
  const CacheManager& cache() const { return cache_; }
  int64_t max_request_tokens() const { return cache_.config().max_tokens_per_sequence(); }

 private:
  struct Request;

  void take_incoming();
  void admit();
  // The request's last event; frees its cache. `text` is what its last token produced.
  void finish(Request& r, FinishReason reason, int32_t token, std::string text, std::string error,
              std::span<const float> logits = {});
  void emit(const TokenEvent& event);
  void after_sample(Request& r, int32_t token, std::span<const float> logits);
  void fail_batch(const std::vector<Request*>& batch, const std::string& message);
  void drop_finished();

  Backend& backend_;
  EngineConfig config_;
  TokenCallback on_token_;
  PromptLogitsCallback on_prompt_logits_;
  Forward forward_;
  CacheManager cache_;
  EngineStats stats_;

  // Shared with submit()/cancel() on other threads.
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::unique_ptr<Request>> incoming_;
  std::vector<int64_t> cancels_;
  std::atomic<int64_t> next_id_{1};
  std::atomic<int64_t> active_{0};  // submitted and not finished

  // Owned by the step() thread.
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
};

}  // namespace kimirt::runtime
