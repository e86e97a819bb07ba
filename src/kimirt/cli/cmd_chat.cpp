// `kimirt chat -m DIR`: an interactive chat on a terminal. The conversation is rendered with the model
// family's chat template (text/chat_template.h) and run through the engine; replies stream as they are
// produced. Lines starting with '/' are commands: /reset forgets the conversation, /system TEXT sets the
// system message, /quit (or end of input) leaves. Ctrl-C during a reply ends the reply (what was shown stays in
// the conversation), not the session; at the prompt it ends the program as usual. The replies go to stdout, the
// prompt and chat's notes to stderr. One rank: the model runs in this process.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/base/timer.h"
#include "kimirt/cli/command.h"
#include "kimirt/cli/default_model.h"
#include "kimirt/cli/flag_checks.h"
#include "kimirt/cli/model_files.h"
#include "kimirt/cli/sampling_options.h"
#include "kimirt/cli/sequence_cache.h"
#include "kimirt/comm/comm.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/model/loader.h"
#include "kimirt/runtime/backend_factory.h"
#include "kimirt/runtime/engine.h"
#include "kimirt/runtime/rank_group.h"
#include "kimirt/text/chat_family.h"

namespace kimirt::cli {
namespace {

namespace fs = std::filesystem;

// Set by SIGINT while a reply is generated (lock-free atomics: safe in a handler).
std::atomic<bool> g_replying{false};
std::atomic<bool> g_interrupted{false};

extern "C" void on_interrupt(int) {
  // At the prompt, or a second Ctrl-C before the first has ended the reply (a long prefill step runs on until the
  // step ends): what Ctrl-C does to any program.
  if (!g_replying.load() || g_interrupted.exchange(true)) {
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
  }
}

// For the session: Ctrl-C ends a reply instead of the process. SA_RESTART: a write to the terminal that the signal
// interrupts goes on, rather than failing stdout.
class InterruptsEndReplies {
 public:
  InterruptsEndReplies() {
    // A SIGINT the parent set to be ignored (nohup, a job started in the background by a script) stays ignored.
    if (::sigaction(SIGINT, nullptr, &previous_) != 0 || previous_.sa_handler == SIG_IGN) return;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    installed_ = ::sigaction(SIGINT, &sa, nullptr) == 0;
  }
  ~InterruptsEndReplies() {
    if (installed_) ::sigaction(SIGINT, &previous_, nullptr);
  }
  InterruptsEndReplies(const InterruptsEndReplies&) = delete;
  InterruptsEndReplies& operator=(const InterruptsEndReplies&) = delete;

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

struct ChatOptions {
  std::string model_dir;
  runtime::SamplingParams sampling;
  std::string system;
  bool thinking = false;
  size_t threads = 0;  // 0: runtime::default_threads()
  int64_t max_context = 8192;
};

// The model's family is the chat template's: config.json's model_type decides both (text/chat_family.h), so
// config.json is not read a second time for it.
text::ChatTemplate chat_template_of(const model::ModelConfig& config) {
  return text::ChatTemplate(config.family == model::ModelFamily::kKimiK3 ? text::ChatFamily::kKimiK3
                                                                         : text::ChatFamily::kKimiLinear);
}

// Chat's own words (its notes, the prompt) go to stderr, so that stdout holds the replies alone (`chat < in >
// out`). stdout is flushed first: where both go to one terminal or file, the reply comes before the note.
template <typename... Args>
void note(fmt::format_string<Args...> format, Args&&... args) {
  std::fflush(stdout);
  fmt::print(stderr, "{}\n", fmt::format(format, std::forward<Args>(args)...));
}

void chat(const ChatOptions& o) {
  ThreadPool::set_global_threads(o.threads == 0 ? runtime::default_threads() : o.threads);
  const fs::path dir = o.model_dir.empty() ? ensure_default_model() : fs::path(o.model_dir);
  const Timer load_timer;
  // What can be refused is refused before the weights are read: the tokenizer, and --context.
  const io::Checkpoint checkpoint = io::Checkpoint::open(dir);
  const model::ModelConfig config = model::ModelConfig::from_json(checkpoint.config(), (dir / "config.json").string());
  check_stop_ids(o.sampling, config.vocab_size);  // at start, not line by line
  const auto tokenizer = find_tokenizer(dir, config.vocab_size);
  KIMIRT_CHECK(tokenizer.has_value(), "chat needs a tokenizer ({} in {}) of the model's vocabulary",
               text::kTiktokenModelFile, dir.string());
  const text::ChatTemplate chat_template = chat_template_of(config);
  KIMIRT_CHECK(!o.thinking || chat_template.family() == text::ChatFamily::kKimiK3,
               "--thinking: the {} chat template has no thinking channel (Kimi K3 only)",
               text::chat_family_name(chat_template.family()));
  const std::string context_flag = fmt::format("--context {}", o.max_context);
  // A reply must fit beside at least a turn of the conversation: with -n at or past --context, every line
  // would be refused, and /reset could not help.
  KIMIRT_CHECK(o.sampling.max_tokens >= 1, "-n 0: every reply would be empty");
  KIMIRT_CHECK(o.sampling.max_tokens < o.max_context,
               "-n {} leaves no room in {} for the conversation (a reply takes up to -n tokens of it)",
               o.sampling.max_tokens, context_flag);
  // The stop strings and ids every reply stops on: a --stop holding special-token text is refused now, not line
  // by line; the end of turn stops a reply even under --ignore-eos (which keeps going past the model's EOS only).
  runtime::SamplingParams sampling = o.sampling;
  with_context("--stop", [&] { runtime::resolve_special_stops(*tokenizer, sampling); });
  for (const int32_t id : chat_template.end_of_turn_ids(*tokenizer)) {
    if (std::find(sampling.stop_ids.begin(), sampling.stop_ids.end(), id) == sampling.stop_ids.end()) {
      sampling.stop_ids.push_back(id);
    }
  }
  // Encoded once now: a --system text that is not UTF-8 would otherwise fail every line, naming no flag.
  with_context("--system", [&] { (void)tokenizer->encode(o.system); });
  // The shortest turn there can be (the system message, a one-character line, the template's markup) must fit
  // beside a reply of -n: otherwise every line would be refused, and /reset could not help.
  // The same holds for a message /system sets later.
  auto shortest_turn = [&](const std::string& system) {
    std::vector<text::ChatMessage> shortest;
    if (!system.empty()) shortest.push_back({"system", system, "", ""});
    shortest.push_back({"user", "x", "", ""});
    return chat_template.encode(*tokenizer, shortest, /*add_generation_prompt=*/true, o.thinking).size();
  };
  auto fits_a_turn = [&](size_t prompt) {
    return runtime::cache_positions_needed(static_cast<int64_t>(prompt), o.sampling.max_tokens) <= o.max_context;
  };
  const size_t first_turn = shortest_turn(o.system);
  KIMIRT_CHECK(fits_a_turn(first_turn),
               "{} cannot hold one turn: the system message and the template's markup take {} tokens, a reply of "
               "-n {} more",
               context_flag, first_turn, o.sampling.max_tokens);
  const runtime::CacheConfig cache = one_sequence_cache(o.max_context, config, context_flag);

  model::LoadedModel loaded = model::load_model(checkpoint, model::ParallelMapping{});
  SingleComm comm;
  auto backend = make_backend_for(cache, context_flag, [&] {
    return runtime::make_backend(runtime::Device::kCpu, config, loaded.params, comm, model::ParallelMapping{}, cache,
                                 runtime::MoeComm::kDirect);
  });
  loaded.params = model::ParamStore();

  runtime::EngineConfig engine_config;
  engine_config.eos_ids = eos_ids(dir, config);
  engine_config.tokenizer = tokenizer;
  // K3's channel and message tags are markup: their names are not shown (nor matched by stop strings).
  engine_config.hidden_tags = chat_template.tag_markup(*tokenizer);
  std::vector<int32_t> reply_ids;
  std::string shown;  // the reply's text as streamed (cut where a stop string starts)
  runtime::FinishReason reason = runtime::FinishReason::kNone;
  std::string error;
  runtime::Engine engine(*backend, engine_config, [&](const runtime::TokenEvent& e) {
    if (e.token >= 0) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      reply_ids.push_back(e.token);
      shown += e.text;
      // A blank line between the reasoning and the answer: shown only, not part of `shown` (text the stop strings
      // hold back, a possible stop string's start, comes after it).
      if (chat_template.closes_think_channel(*tokenizer, reply_ids)) std::fputs("\n\n", stdout);
      std::fflush(stdout);
    }
    if (e.finished) {
      reason = e.reason;
      error = e.error;
      if (e.token < 0) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        shown += e.text;
      }
    }
  });
  std::fprintf(stderr, "kimirt chat: %s (%s) ready in %.2f s; /reset, /system TEXT, /quit\n", dir.c_str(),
               std::string(text::chat_family_name(chat_template.family())).c_str(), load_timer.seconds());

  const InterruptsEndReplies interrupts;
  std::vector<text::ChatMessage> history;
  std::string system = o.system;  // the system message now: --system, or what /system set since
  auto reset = [&] {
    history.clear();
    if (!system.empty()) history.push_back({"system", system, "", ""});
  };
  reset();
  std::string line;
  for (;;) {
    std::fflush(stdout);  // the reply before the prompt, where both go to one terminal or file
    std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      reset();
      note("(conversation cleared)");
      if (!system.empty()) note("(the system message stays; /system alone clears it)");
      continue;
    }
    if (line == "/system" || line.rfind("/system ", 0) == 0) {
      // No text (or only blanks): no system message, as without --system (Kimi Linear's template then gives its
      // default one).
      std::string text = line.size() > 8 ? line.substr(8) : std::string();
      if (text.find_first_not_of(" \t") == std::string::npos) text.clear();
      size_t turn = 0;
      try {
        turn = shortest_turn(text);
      } catch (const Error& e) {
        note("(/system: {}; the system message is unchanged)", e.what());
        continue;
      }
      if (!fits_a_turn(turn)) {
        note(
            "(/system: with this message one turn takes {} tokens and a reply -n {} more, past --context {}; the "
            "system message is unchanged)",
            turn, o.sampling.max_tokens, o.max_context);
        continue;
      }
      system = text;
      history.erase(std::remove_if(history.begin(), history.end(), [](const auto& m) { return m.role == "system"; }),
                    history.end());
      if (!system.empty()) history.insert(history.begin(), {"system", system, "", ""});
      note("{}", system.empty() ? "(system message cleared)" : "(system message set)");
      continue;
    }
    if (line[0] == '/') {
      note("(commands: /reset, /system TEXT, /quit)");
      continue;
    }
    history.push_back({"user", line, "", ""});
    runtime::GenerationRequest request;
    try {
      request.prompt = chat_template.encode(*tokenizer, history, /*add_generation_prompt=*/true, o.thinking);
    } catch (const Error& e) {
      // Bad input (text that is not UTF-8, say) loses this line, not the conversation.
      note("({})", e.what());
      history.pop_back();
      continue;
    }
    request.sampling = sampling;
    if (!fits_a_turn(request.prompt.size())) {
      note("(the conversation no longer fits in {} tokens: /reset)", o.max_context);
      history.pop_back();
      continue;
    }
    reply_ids.clear();
    shown.clear();
    reason = runtime::FinishReason::kNone;
    int64_t id = 0;
    try {
      id = engine.submit(std::move(request));
    } catch (const Error& e) {
      // A request the engine refuses (a stop string it cannot take, say) loses this line, not the conversation.
      note("({})", e.what());
      history.pop_back();
      continue;
    }
    g_interrupted.store(false);
    g_replying.store(true);
    while (!engine.idle()) {
      if (g_interrupted.exchange(false)) engine.cancel(id);
      if (!engine.step()) engine.wait_for_work(std::chrono::milliseconds(10));
    }
    g_replying.store(false);
    std::fputc('\n', stdout);
    if (reason == runtime::FinishReason::kCancelled) note("(reply interrupted)");
    KIMIRT_CHECK(reason != runtime::FinishReason::kError, "generation failed: {}", error);
    // The history keeps the reply without the markup that ended it (end of turn, EOS): the next turn renders
    // that markup itself, and as template tokens, not as text.
    std::vector<int32_t> ending = engine_config.eos_ids;
    ending.insert(ending.end(), sampling.stop_ids.begin(), sampling.stop_ids.end());
    // A stop string (a stop that is not an ending id) ends the reply where it starts: the history keeps what was
    // shown, not the text that the tokens completing the stop string carry past it.
    const bool stop_string = reason == runtime::FinishReason::kStop && !reply_ids.empty() &&
                             std::find(ending.begin(), ending.end(), reply_ids.back()) == ending.end();
    // An interrupted reply, the same: what was shown; one interrupted before its first token leaves no turn (the
    // line it answered is dropped with it).
    if (reason == runtime::FinishReason::kCancelled && reply_ids.empty()) {
      history.pop_back();
      continue;
    }
    const bool cut = stop_string || reason == runtime::FinishReason::kCancelled;
    history.push_back(chat_template.parse_reply(*tokenizer, reply_ids, o.thinking, ending,
                                                cut ? std::optional<std::string_view>(shown) : std::nullopt));
  }
  std::fputc('\n', stderr);  // ends the last prompt's line
}

const RegisterCommand kChat("chat", 20, [](CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->sampling.max_tokens = 256;
  o->sampling.temperature = 0.7f;
  o->sampling.top_p = 0.95f;
  auto* cmd = app.add_subcommand("chat", "Interactive chat on a terminal (/reset, /system TEXT, /quit)");
  cmd->add_option("-m,--model", o->model_dir, "checkpoint directory (default: the embedded default model)")
      ->check(not_empty());
  cmd->add_option("--system", o->system, "system message");
  cmd->add_flag("--thinking", o->thinking, "K3: open the thinking channel before the response");
  add_sampling_options(cmd, o->sampling, "tokens per reply at most");
  cmd->add_option("--context", o->max_context, "tokens the conversation may hold (at most the model's positions)")
      ->capture_default_str()
      ->check(whole_number_in(1, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--threads", o->threads, "CPU threads (default: the CPUs this process may run on)")
      ->check(whole_number_in(1, kMaxThreads));
  cmd->callback([o] { chat(*o); });
});

}  // namespace
}  // namespace kimirt::cli
