// `kimirt chat -m DIR`: an interactive chat on a terminal. The conversation is rendered with the model
// family's chat template (text/chat_template.h) and run through the engine; replies stream as they are
// produced. Lines starting with '/' are commands: /reset forgets the conversation, /system TEXT sets the
// system message, /quit (or end of input) leaves. One rank: the model runs in this process.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/base/timer.h"
#include "kimirt/cli/command.h"
#include "kimirt/cli/default_model.h"
#include "kimirt/cli/model_files.h"
#include "kimirt/comm/comm.h"
#include "kimirt/model/loader.h"
#include "kimirt/runtime/backend_factory.h"
#include "kimirt/runtime/engine.h"
#include "kimirt/text/chat_family.h"
#include "kimirt/text/utf8.h"

namespace kimirt::cli {
namespace {

namespace fs = std::filesystem;

struct ChatOptions {
  std::string model_dir;
  runtime::SamplingParams sampling;
  std::string system;
  bool thinking = false;
  size_t threads = hardware_threads();
  int64_t max_context = 8192;
};

// The K3 assistant turn is written in channels: with thinking on, what comes before the response channel
// is the reasoning. Splits a reply decoded with its special tokens.
void split_reply(const std::string& reply, text::ChatMessage& message) {
  const std::string open_response = "<|open|>response<|sep|>";
  const std::string close_think = "<|close|>think<|sep|>";
  const auto r = reply.find(open_response);
  if (r == std::string::npos) {
    message.content = reply;
    return;
  }
  std::string reasoning = reply.substr(0, r);
  if (const auto c = reasoning.rfind(close_think); c != std::string::npos) reasoning.resize(c);
  message.reasoning = reasoning;
  std::string content = reply.substr(r + open_response.size());
  if (const auto c = content.find("<|close|>response"); c != std::string::npos) content.resize(c);
  message.content = content;
}

void chat(const ChatOptions& o) {
  ThreadPool::set_global_threads(o.threads);
  const fs::path dir = o.model_dir.empty() ? ensure_default_model() : fs::path(o.model_dir);
  const Timer load_timer;
  model::LoadedModel loaded = model::load_model(dir, model::ParallelMapping{});
  const model::ModelConfig& config = loaded.config;
  const auto tokenizer = find_tokenizer(dir, config.vocab_size);
  KIMIRT_CHECK(tokenizer.has_value(), "chat needs a tokenizer ({} in {}) of the model's vocabulary",
               text::kTiktokenModelFile, dir.string());
  const text::ChatTemplate chat_template = text::chat_template_for(dir);

  SingleComm comm;
  runtime::CacheConfig cache;
  cache.max_sequences = 1;
  cache.block_size = 64;
  cache.num_blocks = static_cast<int>((o.max_context + cache.block_size - 1) / cache.block_size);
  auto backend = runtime::make_backend(runtime::Device::kCpu, config, loaded.params, comm, model::ParallelMapping{},
                                       cache, runtime::MoeComm::kDirect);
  loaded.params = model::ParamStore();

  runtime::EngineConfig engine_config;
  engine_config.eos_ids = eos_ids(dir, config);
  for (int32_t id : chat_template.end_of_turn_ids(*tokenizer)) engine_config.eos_ids.push_back(id);
  engine_config.tokenizer = tokenizer;
  std::vector<int32_t> reply_ids;
  runtime::FinishReason reason = runtime::FinishReason::kNone;
  std::string error;
  runtime::Engine engine(*backend, engine_config, [&](const runtime::TokenEvent& e) {
    if (e.token >= 0) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
      reply_ids.push_back(e.token);
    }
    if (e.finished) {
      reason = e.reason;
      error = e.error;
      if (e.token < 0) std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    }
  });
  std::fprintf(stderr, "kimirt chat: %s (%s) ready in %.2f s; /reset, /system TEXT, /quit\n", dir.c_str(),
               std::string(text::chat_family_name(chat_template.family())).c_str(), load_timer.seconds());

  std::vector<text::ChatMessage> history;
  auto reset = [&] {
    history.clear();
    if (!o.system.empty()) history.push_back({"system", o.system, "", ""});
  };
  reset();
  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      reset();
      std::puts("(conversation cleared)");
      continue;
    }
    if (line.rfind("/system ", 0) == 0) {
      history.erase(std::remove_if(history.begin(), history.end(), [](const auto& m) { return m.role == "system"; }),
                    history.end());
      history.insert(history.begin(), {"system", line.substr(8), "", ""});
      std::puts("(system message set)");
      continue;
    }
    if (line[0] == '/') {
      std::puts("(commands: /reset, /system TEXT, /quit)");
      continue;
    }
    history.push_back({"user", line, "", ""});
    runtime::GenerationRequest request;
    try {
      request.prompt = chat_template.encode(*tokenizer, history, /*add_generation_prompt=*/true, o.thinking);
    } catch (const Error& e) {
      // Bad input (text that is not UTF-8, say) loses this line, not the conversation.
      std::printf("(%s)\n", e.what());
      history.pop_back();
      continue;
    }
    request.sampling = o.sampling;
    if (static_cast<int64_t>(request.prompt.size()) + o.sampling.max_tokens > o.max_context) {
      std::printf("(the conversation no longer fits in %lld tokens: /reset)\n", static_cast<long long>(o.max_context));
      history.pop_back();
      continue;
    }
    reply_ids.clear();
    reason = runtime::FinishReason::kNone;
    engine.submit(std::move(request));
    engine.run_until_idle();
    std::fputc('\n', stdout);
    KIMIRT_CHECK(reason != runtime::FinishReason::kError, "generation failed: {}", error);
    // A reply may hold bytes that are not UTF-8 (a model can emit any byte token); the history keeps what
    // the terminal showed, with U+FFFD for those, so that the next turn encodes.
    std::string reply_text;
    text::decode_utf8_prefix(tokenizer->decode(reply_ids), /*final=*/true, reply_text);
    text::ChatMessage reply{"assistant", "", "", ""};
    split_reply(reply_text, reply);
    history.push_back(std::move(reply));
  }
  std::fputc('\n', stdout);
}

const RegisterCommand kChat("chat", 20, [](CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->sampling.max_tokens = 256;
  o->sampling.temperature = 0.7f;
  o->sampling.top_p = 0.95f;
  auto* cmd = app.add_subcommand("chat", "Interactive chat on a terminal (/reset, /system TEXT, /quit)");
  cmd->add_option("-m,--model", o->model_dir, "checkpoint directory (default: the embedded default model)");
  cmd->add_option("--system", o->system, "system message");
  cmd->add_flag("--thinking", o->thinking, "K3: open the thinking channel before the response");
  auto& sp = o->sampling;
  cmd->add_option("-n,--max-tokens", sp.max_tokens, "tokens per reply at most")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", sp.temperature, "0 = greedy");
  cmd->add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", sp.top_p, "nucleus sampling (1 = off)");
  cmd->add_option("--min-p", sp.min_p, "keep tokens with p >= min_p * p_max (0 = off)");
  cmd->add_option("--seed", sp.seed, "sampling seed");
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "Hugging Face repetition penalty (1 = off)");
  cmd->add_option("--stop", sp.stop_strings, "stop before this text (repeatable)");
  cmd->add_option("--context", o->max_context, "tokens the conversation may hold")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "CPU threads")->check(CLI::PositiveNumber);
  cmd->callback([o] { chat(*o); });
});

}  // namespace
}  // namespace kimirt::cli
