// The engine on a random-weight Kimi K3 tiny model: tokens equal to a hand-written greedy loop, continuous
// batching that gives each request the tokens it gets alone, the stopping rules, cancellation, admission
// against the cache, submits from another thread, logits delivery and a failing step.
#include "kimirt/runtime/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <map>
#include <thread>

#include "common/error_of.h"
#include "kimirt/cpu/lm_head.h"
#include "kimirt/runtime/sampler.h"
#include "kimirt/text/stream_decoder.h"
#include "runtime/failing_backend.h"
#include "runtime/test_util.h"

namespace kimirt::runtime {
namespace {

using ::testing::HasSubstr;
using testing::RandomModel;

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  int finished_events = 0;
  int64_t finished_at = -1;  // global event counter when it finished
  int64_t first_token_at = -1;
  std::vector<std::vector<float>> step_logits;
  std::vector<std::string> pieces;  // the text of each event
};

// Collects the events of every request (thread-safe: submits may come from other threads, events do not).
class Collector {
 public:
  Engine::TokenCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      Outcome& o = outcomes_[e.request_id];
      if (e.token >= 0) {
        EXPECT_EQ(e.index, static_cast<int64_t>(o.tokens.size()));
        o.tokens.push_back(e.token);
        if (o.first_token_at < 0) o.first_token_at = counter_;
      }
      if (!e.logits.empty()) o.step_logits.emplace_back(e.logits.begin(), e.logits.end());
      o.text += e.text;
      o.pieces.push_back(e.text);
      if (e.finished) {
        o.reason = e.reason;
        o.error = e.error;
        ++o.finished_events;
        o.finished_at = counter_;
      }
      ++counter_;
    };
  }
  Outcome at(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return outcomes_[id];
  }
  int finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    int n = 0;
    for (const auto& [id, o] : outcomes_) n += o.finished_events;
    return n;
  }

 private:
  std::mutex mutex_;
  std::map<int64_t, Outcome> outcomes_;
  int64_t counter_ = 0;
};

GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  return r;
}

class EngineTest : public ::testing::Test {
 protected:
  EngineTest() : model_(testing::k3_tiny_config(), 31) {}

  // The request's tokens when it runs alone in a fresh engine.
  std::vector<int32_t> alone(const GenerationRequest& r, EngineConfig config = {}) {
    testing::TestBackend t(model_);
    Collector c;
    Engine engine(t.backend, std::move(config), c.callback());
    const int64_t id = engine.submit(r);
    engine.run_until_idle();
    return c.at(id).tokens;
  }
  std::vector<int32_t> ids(int64_t n, uint32_t seed) const {
    return testing::random_ids(n, model_.config().vocab_size, seed);
  }

  RandomModel model_;
};

TEST_F(EngineTest, GreedyTokensMatchAHandWrittenLoop) {
  const auto prompt = ids(12, 1);
  testing::TestBackend t(model_);
  std::vector<int32_t> expected;
  auto logits = testing::run_one(t.backend, prompt, 0, 0, LogitRows::kLast);
  for (int i = 0; i < 6; ++i) {
    expected.push_back(cpu::argmax(logits.data(), model_.config().vocab_size));
    logits = testing::run_one(t.backend, {expected.back()}, 12 + i, 0, LogitRows::kLast);
  }
  testing::TestBackend t2(model_);
  Collector c;
  Engine engine(t2.backend, {}, c.callback());
  const int64_t id = engine.submit(greedy(prompt, 6));
  engine.run_until_idle();
  const Outcome o = c.at(id);
  EXPECT_EQ(o.tokens, expected);
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_EQ(o.finished_events, 1);
  EXPECT_EQ(engine.stats().prompt_tokens, 12);
  EXPECT_EQ(engine.stats().generated_tokens, 6);
  EXPECT_EQ(engine.stats().decode_step_tokens, 5);
}

// The engine's sampling against a hand-written loop of Sampler over the backend's logits, as the greedy test
// above does for argmax: a repetition penalty seeded with the prompt, and a seeded temperature / top-k draw.
// (The batching test below compares the engine only with itself; a sampler built without the prompt would
// pass it.)
TEST_F(EngineTest, SampledTokensMatchAHandWrittenLoop) {
  SamplingParams penalized;
  penalized.repetition_penalty = 1.3f;
  SamplingParams drawn;
  drawn.temperature = 0.8f, drawn.top_k = 20, drawn.seed = 7;
  for (const SamplingParams& params : {penalized, drawn}) {
    const auto prompt = ids(20, 4);
    testing::TestBackend t(model_);
    Sampler sampler(params, prompt);
    std::vector<int32_t> expected;
    auto logits = testing::run_one(t.backend, prompt, 0, 0, LogitRows::kLast);
    for (int i = 0; i < 6; ++i) {
      expected.push_back(sampler.sample(logits));
      logits = testing::run_one(t.backend, {expected.back()}, 20 + i, 0, LogitRows::kLast);
    }
    testing::TestBackend t2(model_);
    Collector c;
    Engine engine(t2.backend, {}, c.callback());
    GenerationRequest request = greedy(prompt, 6);
    request.sampling = params;
    request.sampling.max_tokens = 6;
    const int64_t id = engine.submit(request);
    engine.run_until_idle();
    EXPECT_EQ(c.at(id).tokens, expected) << "repetition penalty " << params.repetition_penalty << ", temperature "
                                         << params.temperature;
  }
}

TEST_F(EngineTest, ContinuousBatchingGivesEachRequestItsTokensAlone) {
  auto a = greedy(ids(30, 2), 8);
  auto b = greedy(ids(9, 3), 10);
  b.sampling.temperature = 0.8f;  // a seeded sampler draws the same whatever it is batched with
  b.sampling.top_k = 20;
  b.sampling.seed = 7;
  auto c = greedy(ids(50, 4), 5);
  c.sampling.repetition_penalty = 1.3f;
  EngineConfig config;
  config.scheduler = {.max_batch_tokens = 16, .prefill_chunk = 8};  // prompts in chunks next to decodes

  testing::TestBackend t(model_);
  Collector col;
  Engine engine(t.backend, config, col.callback());
  const int64_t ia = engine.submit(a), ib = engine.submit(b);
  for (int i = 0; i < 6; ++i) engine.step();
  const int64_t ic = engine.submit(c);  // joins while the others decode
  engine.run_until_idle();

  EXPECT_EQ(col.at(ia).tokens, alone(a));
  EXPECT_EQ(col.at(ib).tokens, alone(b));
  EXPECT_EQ(col.at(ic).tokens, alone(c));
  EXPECT_EQ(col.at(ia).tokens.size(), 8u);
  EXPECT_EQ(col.at(ib).tokens.size(), 10u);
  EXPECT_EQ(col.at(ic).tokens.size(), 5u);
  // Shared steps: fewer than the requests would take one after another with the same chunking.
  const int64_t separate = (4 + 8 - 1) + (2 + 10 - 1) + (7 + 5 - 1);
  EXPECT_LT(engine.stats().steps, separate);
  EXPECT_EQ(engine.cache().free_slots(), engine.cache().config().max_sequences);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().config().num_blocks);
}

TEST_F(EngineTest, StopsOnEosAndStopIdsUnlessIgnoringEos) {
  const auto r = greedy(ids(10, 5), 8);
  const auto tokens = alone(r);
  ASSERT_EQ(tokens.size(), 8u);
  // The first position whose token did not occur before it.
  size_t k = 1;
  while (k < tokens.size() && std::count(tokens.begin(), tokens.begin() + static_cast<long>(k), tokens[k])) ++k;
  ASSERT_LT(k, tokens.size());
  const std::vector<int32_t> until(tokens.begin(), tokens.begin() + static_cast<long>(k) + 1);

  for (int mode = 0; mode < 3; ++mode) {
    testing::TestBackend t(model_);
    Collector col;
    EngineConfig config;
    auto req = r;
    if (mode == 0) config.eos_ids = {tokens[k]};
    if (mode == 1) req.sampling.stop_ids = {tokens[k]};
    if (mode == 2) {
      config.eos_ids = {tokens[k]};
      req.sampling.ignore_eos = true;
    }
    Engine engine(t.backend, config, col.callback());
    const int64_t id = engine.submit(req);
    engine.run_until_idle();
    const Outcome o = col.at(id);
    if (mode == 2) {
      EXPECT_EQ(o.tokens, tokens);
      EXPECT_EQ(o.reason, FinishReason::kLength);
    } else {
      EXPECT_EQ(o.tokens, until) << "mode " << mode;
      EXPECT_EQ(o.reason, mode == 0 ? FinishReason::kEos : FinishReason::kStop);
    }
    EXPECT_EQ(engine.cache().free_slots(), engine.cache().config().max_sequences);
  }
}

TEST_F(EngineTest, CancellingFreesTheCacheOfRunningAndWaitingRequests) {
  testing::TestBackend t(model_);  // 4 sequence slots
  Collector col;
  Engine engine(t.backend, {}, col.callback());
  std::vector<int64_t> id;
  for (int i = 0; i < 5; ++i) id.push_back(engine.submit(greedy(ids(6, 10 + i), 100)));
  for (int i = 0; i < 3; ++i) engine.step();
  EXPECT_EQ(engine.cache().free_slots(), 0);
  engine.cancel(id[4]);  // still waiting for a slot
  engine.cancel(id[1]);  // running
  engine.cancel(12345);  // unknown: nothing happens
  engine.step();
  EXPECT_EQ(col.at(id[4]).reason, FinishReason::kCancelled);
  EXPECT_TRUE(col.at(id[4]).tokens.empty());
  EXPECT_EQ(col.at(id[1]).reason, FinishReason::kCancelled);
  EXPECT_EQ(col.at(id[1]).tokens.size(), 3u);
  EXPECT_EQ(engine.cache().free_slots(), 1);
  for (int64_t i : {id[0], id[2], id[3]}) engine.cancel(i);
  engine.step();
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.cache().free_slots(), 4);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().config().num_blocks);
  for (int64_t i : id) EXPECT_EQ(col.at(i).finished_events, 1);
}

// A request cancelled halfway through its chunked prefill gives back its slot and blocks, and the request
// that takes the slot next (the only one) starts from clean KDA states: it gets the tokens it gets alone.
TEST_F(EngineTest, CancellingDuringAChunkedPrefillLeavesNoStateBehind) {
  testing::TestBackend t(model_, CacheConfig{1, 16, 64});  // one slot, blocks of 16
  EngineConfig config;
  config.scheduler.prefill_chunk = 8;
  Collector col;
  Engine engine(t.backend, config, col.callback());
  const int64_t cut = engine.submit(greedy(ids(40, 71), 5));
  engine.step();
  engine.step();  // 16 of its 40 prompt tokens are in the caches
  EXPECT_EQ(engine.cache().free_slots(), 0);
  engine.cancel(cut);
  engine.step();
  EXPECT_EQ(col.at(cut).reason, FinishReason::kCancelled);
  EXPECT_TRUE(col.at(cut).tokens.empty());
  EXPECT_EQ(engine.cache().free_slots(), 1);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().config().num_blocks);
  const auto next = greedy(ids(20, 72), 6);
  const int64_t id = engine.submit(next);
  engine.run_until_idle();
  EXPECT_EQ(col.at(id).reason, FinishReason::kLength);
  EXPECT_EQ(col.at(id).tokens, alone(next, config));
}

TEST_F(EngineTest, RequestsWaitForRoomAndTooLargeOnesAreRefused) {
  SingleComm comm;
  CpuBackend backend(model_.config(), model_.store(), comm, {}, CacheConfig{4, 16, 8});  // 128 positions
  Collector col;
  Engine engine(backend, {}, col.callback());
  try {
    engine.submit(greedy(ids(100, 6), 30));  // 129 positions
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("need 129 cache positions; the cache holds 128"));
  }
  const int64_t a = engine.submit(greedy(ids(40, 7), 60));  // 99 positions: 7 blocks
  const int64_t b = engine.submit(greedy(ids(20, 8), 20));  // 39 positions: 3 blocks, only 1 left
  engine.run_until_idle();
  EXPECT_EQ(col.at(a).tokens.size(), 60u);
  EXPECT_EQ(col.at(b).tokens.size(), 20u);
  EXPECT_GT(col.at(b).first_token_at, col.at(a).finished_at);
}

TEST_F(EngineTest, BadRequestsAreRefusedAtSubmitNamingTheField) {
  testing::TestBackend t(model_);
  Engine engine(t.backend, {}, nullptr);
  auto refusal = [&](GenerationRequest r) {
    try {
      engine.submit(std::move(r));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_THAT(refusal(greedy({}, 4)), HasSubstr("prompt is empty"));
  EXPECT_THAT(refusal(greedy({1, 2, 5000}, 4)), HasSubstr("prompt token 2 is id 5000"));
  auto bad_p = greedy({1, 2}, 4);
  bad_p.sampling.top_p = 0.0f;
  EXPECT_THAT(refusal(bad_p), HasSubstr("top_p"));
  auto stops = greedy({1, 2}, 4);
  stops.sampling.stop_strings = {"x"};
  EXPECT_THAT(refusal(stops), HasSubstr("stop strings need a tokenizer"));
  EXPECT_TRUE(engine.idle());
}

// A NaN weight (here the whole LM head) gives rows of NaN logits: each request ends with an error saying so at its
// first token, greedy or sampled, not with "length" after a token drawn from nothing at every step (the
// sampler's lowest id).
TEST_F(EngineTest, LogitsWithNoNumberEndTheRequestWithAnError) {
  const model::ParamStore full = model_.store();
  model::ParamStore store;
  bool poisoned = false;
  for (const auto& [name, p] : full.params()) {
    model::LoadedParam q;
    q.spec = p.spec, q.format = p.format, q.shape = p.shape, q.component_ids = p.component_ids;
    for (const auto& t : p.components) q.components.push_back(t.clone());
    if (p.spec->role == model::ParamRole::kLmHead) {
      for (float& v : q.components[0].span<float>()) v = std::numeric_limits<float>::quiet_NaN();
      poisoned = true;
    }
    store.put(name, std::move(q));
  }
  ASSERT_TRUE(poisoned);
  SingleComm comm;
  CpuBackend backend(model_.config(), store, comm, model::ParallelMapping{}, testing::small_cache());
  Collector col;
  Engine engine(backend, {}, col.callback());
  GenerationRequest sampled = greedy(ids(5, 3), 4);
  sampled.sampling.temperature = 0.7f;
  const int64_t a = engine.submit(greedy(ids(5, 2), 4)), b = engine.submit(sampled);
  engine.run_until_idle();
  for (const int64_t id : {a, b}) {
    const Outcome o = col.at(id);
    EXPECT_EQ(o.reason, FinishReason::kError) << id;
    EXPECT_THAT(o.error, HasSubstr("token 0: the logits hold no number above -inf")) << id;
    EXPECT_TRUE(o.tokens.empty()) << id;
    EXPECT_EQ(o.finished_events, 1) << id;
  }
}

TEST_F(EngineTest, MaxTokensZeroEndsAtOnce) {
  testing::TestBackend t(model_);
  Collector col;
  Engine engine(t.backend, {}, col.callback());
  const int64_t id = engine.submit(greedy(ids(5, 9), 0));
  engine.run_until_idle();
  EXPECT_TRUE(col.at(id).tokens.empty());
  EXPECT_EQ(col.at(id).reason, FinishReason::kLength);
  EXPECT_EQ(engine.stats().steps, 0);
}

TEST_F(EngineTest, RequestsSubmittedFromAnotherThreadAllFinish) {
  testing::TestBackend t(model_);
  Collector col;
  Engine engine(t.backend, {}, col.callback());
  std::vector<int64_t> submitted(6);
  std::thread client([&] {
    for (int i = 0; i < 6; ++i) {
      submitted[static_cast<size_t>(i)] = engine.submit(greedy(ids(5 + i, 20 + i), 4));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  while (col.finished() < 6) {
    if (!engine.step()) engine.wait_for_work(std::chrono::milliseconds(5));
  }
  client.join();
  for (int64_t id : submitted) EXPECT_EQ(col.at(id).tokens.size(), 4u);
  EXPECT_TRUE(engine.idle());
}

TEST_F(EngineTest, DeliversPromptLogitsAndTheRowsThatChoseEachToken) {
  const auto prompt = ids(20, 11);
  testing::TestBackend ref_backend(model_);
  const auto ref = testing::run_one(ref_backend.backend, prompt, 0, 0, LogitRows::kAll);
  const int64_t V = model_.config().vocab_size;

  testing::TestBackend t(model_);
  Collector col;
  EngineConfig config;
  config.scheduler = {.max_batch_tokens = 16, .prefill_chunk = 7};
  Engine engine(t.backend, config, col.callback());
  std::vector<float> prompt_logits;
  int64_t next_position = 0;
  engine.set_prompt_logits_callback([&](int64_t, int64_t first, std::span<const float> rows, int64_t n) {
    EXPECT_EQ(first, next_position);
    EXPECT_EQ(rows.size(), static_cast<size_t>(n * V));
    prompt_logits.insert(prompt_logits.end(), rows.begin(), rows.end());
    next_position += n;
  });
  auto r = greedy(prompt, 3);
  r.prompt_logits = true;
  r.step_logits = true;
  const int64_t id = engine.submit(r);
  engine.run_until_idle();
  EXPECT_LE(testing::rel_error(prompt_logits, ref), 1e-4);
  const Outcome o = col.at(id);
  ASSERT_EQ(o.step_logits.size(), 3u);
  const std::vector<float> last_prompt_row(prompt_logits.end() - V, prompt_logits.end());
  EXPECT_EQ(o.step_logits[0], last_prompt_row);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(o.tokens[i], cpu::argmax(o.step_logits[i].data(), V));

  // max_tokens 0 with the prompt's logits asked for: the prompt is run (that is the whole request: scoring a
  // text) and every row delivered, then it ends with no token.
  prompt_logits.clear();
  next_position = 0;
  auto score_only = greedy(prompt, 0);
  score_only.prompt_logits = true;
  const int64_t scored = engine.submit(score_only);
  engine.run_until_idle();
  EXPECT_EQ(prompt_logits.size(), prompt.size() * static_cast<size_t>(V));
  EXPECT_LE(testing::rel_error(prompt_logits, ref), 1e-4);
  EXPECT_TRUE(col.at(scored).tokens.empty());
  EXPECT_EQ(col.at(scored).reason, FinishReason::kLength);
  EXPECT_EQ(col.at(scored).finished_events, 1);
  EXPECT_TRUE(engine.idle());
}

TEST_F(EngineTest, TextAndStopStringsWithATokenizer) {
  const auto tokenizer = text::Tokenizer::load(testing::testdata("tokenizer"));
  EngineConfig config;
  config.tokenizer = tokenizer;
  const auto r = greedy(ids(8, 12), 12);

  testing::TestBackend t(model_);
  Collector col;
  Engine engine(t.backend, config, col.callback());
  const int64_t plain = engine.submit(r);
  engine.run_until_idle();
  const Outcome o = col.at(plain);
  text::StreamDecoder decoder(tokenizer, true);
  std::string expected;
  for (int32_t id : o.tokens) expected += decoder.push(id);
  expected += decoder.finish();
  EXPECT_EQ(o.text, expected);

  // A stop string made of what one later token produced (whole characters): the text ends before it.
  std::string stop;
  for (size_t i = 3; i < o.pieces.size() && stop.empty(); ++i) stop = o.pieces[i];
  ASSERT_FALSE(stop.empty());
  auto with_stop = r;
  with_stop.sampling.stop_strings = {stop};
  const int64_t stopped = engine.submit(with_stop);
  engine.run_until_idle();
  EXPECT_EQ(col.at(stopped).reason, FinishReason::kStop);
  EXPECT_EQ(col.at(stopped).text, o.text.substr(0, o.text.find(stop)));
  EXPECT_LT(col.at(stopped).tokens.size(), o.tokens.size());

  // A stop id while a stop string holds text back: the held text comes out first, then the stop token's
  // own text, in the order the tokens made them (the stop token's text used to go around the matcher and
  // come out before the held text).
  // Token k: a first occurrence, after a piece ending in an ASCII character c; stop string c + "\x01", which
  // the output never continues with, so c is held back at token k - 1.
  size_t k = 0;
  for (size_t i = 1; i < o.tokens.size() && k == 0; ++i) {
    const std::string& before = o.pieces[i - 1];
    const bool first = std::find(o.tokens.begin(), o.tokens.begin() + i, o.tokens[i]) == o.tokens.begin() + i;
    const std::string& at = o.pieces[i];  // whole characters on both sides: nothing held for UTF-8
    if (first && !before.empty() && static_cast<unsigned char>(before.back()) < 0x80 && !at.empty() &&
        static_cast<unsigned char>(at.back()) < 0x80)
      k = i;
  }
  ASSERT_GT(k, 0u) << "no suitable token in the greedy output";
  auto with_both = r;
  with_both.sampling.stop_strings = {std::string(1, o.pieces[k - 1].back()) + "\x01"};
  with_both.sampling.stop_ids = {o.tokens[k]};
  const int64_t id = engine.submit(with_both);
  engine.run_until_idle();
  std::string upto_k;
  for (size_t i = 0; i <= k; ++i) upto_k += o.pieces[i];
  EXPECT_EQ(col.at(id).reason, FinishReason::kStop);
  EXPECT_EQ(col.at(id).text, upto_k);
  EXPECT_EQ(col.at(id).tokens.size(), k + 1);
}

// Special tokens decode to no text: a stop string that is one becomes a stop on its id, one that holds one among
// other text is refused (both used to be taken; the token itself never matched, the request running on to max_tokens).
TEST_F(EngineTest, StopStringsOfSpecialTokensStopOnTheirIdsOrAreRefused) {
  const auto tokenizer = text::Tokenizer::load(testing::testdata("tokenizer"));
  const int32_t eos = tokenizer.special_id("[EOS]"), sep = tokenizer.special_id("<|sep|>");
  SamplingParams sp;
  sp.stop_strings = {"[EOS]", "plain", "<|sep|>"};
  sp.stop_ids = {eos};
  resolve_special_stops(tokenizer, sp);
  EXPECT_EQ(sp.stop_strings, (std::vector<std::string>{"plain"}));
  EXPECT_EQ(sp.stop_ids, (std::vector<int32_t>{eos, sep}));

  EngineConfig config;
  config.tokenizer = tokenizer;
  testing::TestBackend t(model_);
  Engine engine(t.backend, config, nullptr);
  auto mixed = greedy(ids(4, 3), 4);
  mixed.sampling.stop_strings = {"ok", "end[EOS]"};
  try {
    engine.submit(mixed);
    ADD_FAILURE() << "a stop string holding [EOS] was taken";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("stop_strings: stop string \"end[EOS]\" holds the special token [EOS] (id"));
  }
}

// cancel() may come from any thread while step() runs on its own: the request ends with one kCancelled
// event, the others are untouched, and the engine goes idle with its cache free.
TEST_F(EngineTest, CancelFromAnotherThreadWhileStepsRun) {
  testing::TestBackend t(model_);
  Collector col;
  std::atomic<int> tokens{0};
  auto collect = col.callback();
  Engine engine(t.backend, {}, [&](const TokenEvent& e) {
    collect(e);
    if (e.token >= 0) tokens++;
  });
  const auto short_request = greedy(ids(6, 51), 4);
  const int64_t long_id = engine.submit(greedy(ids(6, 50), 200));  // far more than it gets to make
  const int64_t short_id = engine.submit(short_request);
  std::thread canceller([&] {
    while (tokens.load() < 10) std::this_thread::yield();
    engine.cancel(long_id);
  });
  engine.run_until_idle();
  canceller.join();
  const Outcome o = col.at(long_id);
  EXPECT_EQ(o.reason, FinishReason::kCancelled);
  EXPECT_EQ(o.finished_events, 1);
  EXPECT_GE(o.tokens.size(), 6u);
  EXPECT_LT(o.tokens.size(), 200u);
  EXPECT_EQ(col.at(short_id).tokens, alone(short_request));
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.cache().free_slots(), engine.cache().config().max_sequences);
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().config().num_blocks);
}

// A thread waiting for idle() (a server draining) must find every final callback done, whichever way the
// request ended: length, max_tokens 0 at admission, cancellation.
TEST_F(EngineTest, NotIdleWhileAFinalEventIsDelivered) {
  testing::TestBackend t(model_);
  std::vector<bool> idle_during_final;
  const Engine* self = nullptr;
  Engine engine(t.backend, {}, [&](const TokenEvent& e) {
    if (e.finished) idle_during_final.push_back(self->idle());
  });
  self = &engine;
  engine.submit(greedy(ids(5, 40), 3));
  engine.submit(greedy(ids(5, 41), 0));
  const int64_t cancelled = engine.submit(greedy(ids(5, 42), 50));
  engine.step();
  engine.cancel(cancelled);
  engine.run_until_idle();
  EXPECT_EQ(idle_during_final, (std::vector<bool>{false, false, false}));
  EXPECT_TRUE(engine.idle());
}

TEST_F(EngineTest, ATokenizerWithoutEveryModelIdIsRefused) {
  testing::TestBackend t(model_);
  EngineConfig config;
  // 3 ranks and the 256 special ids: 259 ids for a model of 1024.
  config.tokenizer =
      text::Tokenizer::from_contents("YQ== 0\nYg== 1\nYWI= 2\n", R"({"added_tokens_decoder": {}})", "tiny");
  EXPECT_THAT(kimirt::test::error_of([&] { Engine(t.backend, config, {}); }),
              HasSubstr("engine: the tokenizer of tiny has 259 ids, fewer than the model's vocabulary of 1024"));
}

using testing::FailingBackend;

TEST_F(EngineTest, AFailedStepEndsItsRequestsWithTheErrorAndTheEngineGoesOn) {
  testing::TestBackend t(model_);
  FailingBackend failing(t.backend);
  Collector col;
  Engine engine(failing, {}, col.callback());
  const auto r = greedy(ids(7, 13), 4);
  const int64_t first = engine.submit(r);
  failing.fail = true;
  engine.step();
  failing.fail = false;
  EXPECT_EQ(col.at(first).reason, FinishReason::kError);
  EXPECT_THAT(col.at(first).error, HasSubstr("injected failure in layer 0"));
  EXPECT_EQ(engine.cache().free_slots(), engine.cache().config().max_sequences);
  const int64_t second = engine.submit(r);
  engine.run_until_idle();
  EXPECT_EQ(col.at(second).tokens, alone(r));
}

// A lockstep engine (a rank of a parallel group) whose step fails ends every request it holds, not only the
// step's batch: the fifth request, waiting for one of the 4 cache slots, gets its final event too (it had none,
// and a server waiting on it would hang); the step rethrows.
TEST_F(EngineTest, ALockstepEngineWhoseStepFailsEndsEveryRequest) {
  testing::TestBackend t(model_);
  FailingBackend failing(t.backend);
  Collector col;
  EngineConfig config;
  config.lockstep = true;
  Engine engine(failing, config, col.callback());
  std::vector<int64_t> submitted;
  for (uint32_t i = 0; i < 5; ++i) submitted.push_back(engine.submit(greedy(ids(7, 20 + i), 4)));
  failing.fail = true;
  EXPECT_ANY_THROW(engine.step());
  for (int64_t id : submitted) {
    EXPECT_EQ(col.at(id).finished_events, 1) << id;
    EXPECT_EQ(col.at(id).reason, FinishReason::kError) << id;
    EXPECT_THAT(col.at(id).error, HasSubstr("injected failure in layer 0")) << id;
  }
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.cache().free_slots(), engine.cache().config().max_sequences);
}

// A stop string that only the bytes the decoder holds at the end complete (an incomplete character, shown as
// U+FFFD when the length limit ends the request) ends the request as a stop, as a stop string found mid-stream
// does (it had ended as "length", the text cut all the same).
TEST_F(EngineTest, AStopStringCompletedByTheHeldBytesIsAStop) {
  const auto tokenizer = text::Tokenizer::load(testing::testdata("tokenizer"));
  EngineConfig config;
  config.tokenizer = tokenizer;
  // Greedy outputs until one stops after a token that leaves bytes of a character held.
  for (uint32_t seed = 1; seed < 200; ++seed) {
    const auto r = greedy(ids(6, seed), 24);
    const std::vector<int32_t> tokens = alone(r, config);
    for (size_t i = 0; i < tokens.size(); ++i) {
      text::StreamDecoder decoder(tokenizer, true);
      std::string shown;
      for (size_t j = 0; j <= i; ++j) shown += decoder.push(tokens[j]);
      const std::string held = decoder.finish();
      if (held.empty()) continue;
      auto stopping = r;
      stopping.sampling.max_tokens = static_cast<int>(i + 1);
      stopping.sampling.stop_strings = {held};
      testing::TestBackend t(model_);
      Collector col;
      Engine engine(t.backend, config, col.callback());
      const int64_t id = engine.submit(stopping);
      engine.run_until_idle();
      EXPECT_EQ(col.at(id).reason, FinishReason::kStop) << "seed " << seed << ", token " << i;
      EXPECT_EQ(col.at(id).text, shown);
      return;
    }
  }
  FAIL() << "no greedy output held bytes at a token";
}

}  // namespace
}  // namespace kimirt::runtime
