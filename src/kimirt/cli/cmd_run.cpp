// `kimirt run`: one prompt through the engine on the CPU backend, tokens streamed to stdout as they are
// produced (text when the model directory has a tokenizer of the model's vocabulary, ids otherwise), then
// the prompt and decode rates on stderr. Without -m it runs the embedded default: a small random Kimi K3
// checkpoint generated once into the user's cache directory (what `make run` shows).
// With --tp N the model runs on N ranks (--ep, --attention-dp, --moe-comm: runtime/parallel_config.h):
// threads of this process, or under `mpirun -np N` one process per rank; every rank loads only its slice,
// and only rank 0 prints.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/log.h"
#include "kimirt/base/progress.h"
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
#include "kimirt/io/safetensors_writer.h"
#include "kimirt/model/loader.h"
#include "kimirt/runtime/backend_factory.h"
#include "kimirt/runtime/engine.h"
#include "kimirt/runtime/parallel_config.h"
#include "kimirt/runtime/parallel_engine.h"
#include "kimirt/runtime/rank_group.h"
#include "kimirt/text/chat_template.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::cli {
namespace {

namespace fs = std::filesystem;

struct RunOptions {
  std::string model_dir;
  std::string prompt;
  std::string ids;
  runtime::SamplingParams sampling;
  size_t threads = 0;  // 0: runtime::default_threads()
  int64_t prefill_chunk = 512;
  std::string dump_logits;
  bool print_ids = false;
  std::string device = "cpu";
  int tp = 0;  // 0: one rank, or one per process under mpirun
  int ep = 1;
  bool attention_dp = false;
  std::string moe_comm;  // empty: direct, or all_to_all under attention-DP
};

void write_logits(const std::string& path, const std::vector<float>& prompt, const std::vector<float>& steps,
                  int64_t vocab) {
  auto bytes = [](const std::vector<float>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
  };
  io::SafetensorsWriter writer;
  writer.add("prompt_logits", DType::kF32, {static_cast<int64_t>(prompt.size()) / vocab, vocab}, bytes(prompt));
  writer.add("step_logits", DType::kF32, {static_cast<int64_t>(steps.size()) / vocab, vocab}, bytes(steps));
  writer.write(path);
}

// What every rank of the run shares (read-only while the ranks run).
struct RankInputs {
  const RunOptions& o;
  fs::path dir;
  const io::Checkpoint& checkpoint;  // opened once: every rank of this process loads its slice from it
  runtime::ParallelConfig parallel;
  runtime::Device device;
  runtime::GenerationRequest request;
  runtime::CacheConfig cache;
  std::string cache_flag;  // what the cache was sized from, for errors
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::TagMarkup> hidden_tags;
  std::vector<int32_t> eos_ids;
  const Timer& load_timer;
};

// One rank: its slice of the model, its backend, its engine stepping in lockstep with the other ranks'.
// Every rank stops on the same tokens (stop strings included), so each has the tokenizer; only rank 0
// prints. Under attention-DP the one request is rank 0's and the others only join the collectives.
void run_rank(const RankInputs& in, Comm& comm) {
  const RunOptions& o = in.o;
  const bool printer = comm.rank() == 0;
  const model::ParallelMapping mapping = in.parallel.mapping(comm.rank());
  model::LoadOptions load;
  load.progress = printer;
  model::LoadedModel loaded = model::load_model(in.checkpoint, mapping, load);
  const model::ModelConfig& config = loaded.config;
  std::unique_ptr<runtime::Backend> backend = make_backend_for(in.cache, in.cache_flag, [&] {
    return runtime::make_backend(in.device, config, loaded.params, comm, mapping, in.cache, in.parallel.moe_comm);
  });
  loaded.params = model::ParamStore();  // the backend holds its own copies
  if (printer) {
    const std::string ranks = in.parallel.tp > 1 ? ", " + in.parallel.str() : std::string();
    std::fprintf(stderr, "kimirt: %s (%s, %lld layers, hidden %lld, vocab %lld) ready in %.2f s, %zu threads%s\n",
                 in.dir.c_str(), std::string(model::family_name(config.family)).c_str(),
                 static_cast<long long>(config.num_layers), static_cast<long long>(config.hidden_size),
                 static_cast<long long>(config.vocab_size), in.load_timer.seconds(), ThreadPool::global().num_threads(),
                 ranks.c_str());
  }

  runtime::EngineConfig engine_config;
  engine_config.scheduler.prefill_chunk = o.prefill_chunk;
  engine_config.scheduler.max_batch_tokens = o.prefill_chunk;
  engine_config.eos_ids = in.eos_ids;
  const bool as_text = in.tokenizer.has_value() && !o.print_ids;
  if (in.tokenizer) engine_config.tokenizer = in.tokenizer;
  engine_config.hidden_tags = in.hidden_tags;

  std::vector<float> prompt_logits, step_logits;
  runtime::FinishReason reason = runtime::FinishReason::kNone;
  std::string error;
  // A prompt of several prefill chunks can run for minutes on the CPU before its first token: a bar (on a terminal
  // only) counts its tokens through the model, and is closed before the first token prints.
  std::optional<ProgressBar> prefill_bar;
  const auto prompt_tokens = static_cast<int64_t>(in.request.prompt.size());
  if (printer && prompt_tokens > o.prefill_chunk && ProgressBar::stderr_is_terminal()) {
    prefill_bar.emplace("prefill", prompt_tokens, true, "tokens");
  }
  runtime::ParallelEngine engine(*backend, comm, engine_config, [&](const runtime::TokenEvent& e) {
    if (e.finished) {
      reason = e.reason;
      error = e.error;
    }
    if (!printer) return;
    if (prefill_bar) {
      // The prompt is through when its first token comes; a request that ends without one leaves the bar as it was.
      if (e.token >= 0) prefill_bar->add(static_cast<uint64_t>(prompt_tokens) - prefill_bar->done());
      prefill_bar.reset();  // draws its last state and a newline
    }
    if (e.token >= 0) {
      if (as_text) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      } else {
        std::printf("%d ", e.token);
      }
      std::fflush(stdout);
      step_logits.insert(step_logits.end(), e.logits.begin(), e.logits.end());
    }
    if (e.finished && as_text && e.token < 0) std::fwrite(e.text.data(), 1, e.text.size(), stdout);
  });
  engine.engine().set_prompt_logits_callback([&](int64_t, int64_t, std::span<const float> rows, int64_t) {
    if (printer) prompt_logits.insert(prompt_logits.end(), rows.begin(), rows.end());
  });
  const bool runs_request = printer || !in.parallel.attention_dp;
  if (runs_request) engine.engine().submit(in.request);
  while (engine.step()) {
    if (prefill_bar) {
      const auto done = static_cast<uint64_t>(std::min(engine.engine().stats().prompt_tokens, prompt_tokens));
      if (done > prefill_bar->done()) prefill_bar->add(done - prefill_bar->done());
    }
  }
  prefill_bar.reset();
  KIMIRT_CHECK(reason != runtime::FinishReason::kError, "generation failed: {}", error);
  if (!printer) return;
  std::printf("\n");
  std::fflush(stdout);

  const auto& s = engine.engine().stats();
  auto rate = [](double n, double seconds) { return seconds > 0 ? n / seconds : 0.0; };
  std::fprintf(
      stderr, "kimirt: prompt %lld tokens, %.1f tok/s; decode %lld tokens, %.1f tok/s; %lld generated, finished: %s\n",
      static_cast<long long>(s.prompt_tokens), rate(static_cast<double>(s.prompt_tokens), s.prefill_seconds),
      static_cast<long long>(s.decode_step_tokens), rate(static_cast<double>(s.decode_step_tokens), s.decode_seconds),
      static_cast<long long>(s.generated_tokens), std::string(runtime::finish_reason_name(reason)).c_str());
  if (!o.dump_logits.empty()) {
    write_logits(o.dump_logits, prompt_logits, step_logits, config.vocab_size);
    std::fprintf(stderr, "kimirt: logits written to %s\n", o.dump_logits.c_str());
  }
}

void run(const RunOptions& o) {
  KIMIRT_CHECK(o.sampling.max_tokens >= 1 || !o.dump_logits.empty(),
               "-n 0 generates nothing (with --dump-logits it scores the prompt alone)");
  if (!o.dump_logits.empty()) {
    // Checked now, not after the load and the generation it would otherwise waste: where the write will go
    // (io::write_destination: refused for a directory, a block device or a socket) and that this process may
    // write there.
    const io::WriteDestination to = with_context("--dump-logits", [&] { return io::write_destination(o.dump_logits); });
    std::error_code ec;
    if (to.kind == io::WriteDestination::Kind::kInPlace) {
      KIMIRT_CHECK(::access(to.target.c_str(), W_OK) == 0, "--dump-logits {}: this process cannot write to it",
                   o.dump_logits);
    } else if (to.kind == io::WriteDestination::Kind::kReplace) {
      const fs::path parent = fs::absolute(fs::path(to.target), ec).parent_path();
      KIMIRT_CHECK(fs::is_directory(parent, ec) && ::access(parent.c_str(), W_OK) == 0,
                   "--dump-logits {}: {} is not a directory this process can write to", o.dump_logits, parent.string());
    }
  }
  const runtime::Device device = runtime::parse_device(o.device);
  runtime::require_device(device);
  const runtime::RankLaunch launch = runtime::plan_launch(device, o.tp);
  ThreadPool::set_global_threads(o.threads == 0 ? runtime::default_threads() : o.threads);
  if (const std::string note = runtime::default_threads_note();
      o.threads == 0 && !note.empty() && launch.process_rank == 0) {
    std::fprintf(stderr, "%s\n", note.c_str());
  }
  const runtime::MoeComm moe_comm =
      o.moe_comm.empty() ? runtime::MoeComm::kDirect : runtime::parse_moe_comm(o.moe_comm);
  // Under attention-DP each rank runs its own tokens, so they go to their experts all-to-all: a --moe-comm direct
  // given with it was replaced without a word (said only in the banner).
  KIMIRT_CHECK(!o.attention_dp || o.moe_comm.empty() || moe_comm == runtime::MoeComm::kAllToAll,
               "--moe-comm {}: with --attention-dp each rank's tokens go to their experts all_to_all; leave "
               "--moe-comm out or give all_to_all",
               o.moe_comm);
  const fs::path dir = o.model_dir.empty() ? ensure_default_model() : fs::path(o.model_dir);

  const Timer load_timer;
  // config.json and the shard headers are read once, here; the parallel layout is checked against the
  // config before any rank starts or loads a byte.
  const io::Checkpoint checkpoint = io::Checkpoint::open(dir);
  const model::ModelConfig config = model::ModelConfig::from_json(checkpoint.config(), (dir / "config.json").string());
  const runtime::ParallelConfig parallel{launch.world_size, o.ep, o.attention_dp, moe_comm};
  parallel.validate(config);
  const auto tokenizer = find_tokenizer(dir, config.vocab_size);

  std::vector<int32_t> prompt;
  if (!o.ids.empty()) {
    prompt = parse_ids(o.ids);
  } else if (!o.prompt.empty()) {
    KIMIRT_CHECK(tokenizer.has_value(), "-p needs a tokenizer ({} in {}) of the model's vocabulary; use --ids",
                 text::kTiktokenModelFile, dir.string());
    prompt = tokenizer->encode(o.prompt, /*allow_special=*/true);
  } else if (tokenizer) {
    prompt = tokenizer->encode("The capital of France is");
  } else {
    for (int32_t i = 1; i <= 8; ++i) prompt.push_back(i % static_cast<int32_t>(config.vocab_size));
  }

  // Ids the model has no row for are refused naming their flag, before the load (the engine refuses them too).
  for (const int32_t id : prompt) {
    KIMIRT_CHECK(id >= 0 && id < config.vocab_size, "--ids: id {} is outside the model's vocabulary [0, {})", id,
                 config.vocab_size);
  }
  check_stop_ids(o.sampling, config.vocab_size);
  // Refused here rather than by the engine after the whole load: stop strings without a tokenizer, and ones
  // holding a special token's text among other text (runtime::resolve_special_stops).
  runtime::SamplingParams sampling = o.sampling;
  KIMIRT_CHECK(sampling.stop_strings.empty() || tokenizer.has_value(),
               "--stop needs a tokenizer ({} in {}) of the model's vocabulary; use --stop-id", text::kTiktokenModelFile,
               dir.string());
  if (tokenizer) with_context("--stop", [&] { runtime::resolve_special_stops(*tokenizer, sampling); });
  // K3's channel and message tags are markup, hidden from the text as in chat: with the special tokens around
  // them left out, their names alone would be glued into it ("thinkThe user asks...").
  std::optional<text::TagMarkup> hidden_tags;
  if (tokenizer && !o.print_ids && config.family == model::ModelFamily::kKimiK3) {
    hidden_tags = text::ChatTemplate(text::ChatFamily::kKimiK3).tag_markup(*tokenizer);
  }
  RankInputs in{o,         dir,         checkpoint,           parallel,  device, {}, {}, {},
                tokenizer, hidden_tags, eos_ids(dir, config), load_timer};
  in.request.prompt = prompt;
  in.request.sampling = sampling;
  in.request.prompt_logits = in.request.step_logits = !o.dump_logits.empty();
  // One sequence: the cache holds exactly what this request can need, and never more than the model's
  // positions (an -n past them is refused here, before a byte is loaded).
  const int64_t positions = runtime::cache_positions_needed(static_cast<int64_t>(prompt.size()), o.sampling.max_tokens);
  in.cache_flag = fmt::format("-n {} (with a prompt of {} tokens)", o.sampling.max_tokens, prompt.size());
  in.cache = one_sequence_cache(positions, config, in.cache_flag);
  runtime::run_ranks(launch, [&](Comm& comm) { run_rank(in, comm); });
}

const RegisterCommand kRun("run", 10, [](CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  o->sampling.max_tokens = 32;
  auto* cmd = app.add_subcommand("run", "Generate from one prompt, streaming the tokens (on one or several ranks)");
  cmd->add_option("-m,--model", o->model_dir,
                  "checkpoint directory (default: a small random Kimi K3, generated once into the cache directory)")
      ->check(not_empty());
  auto* text =
      cmd->add_option(
             "-p,--prompt", o->prompt,
             "prompt text, raw: no chat template, and special-token text such as <|im_end|> is that token (needs the "
             "model's tokenizer)")
          ->check(utf8_text());
  auto* ids = cmd->add_option("--ids", o->ids, "prompt token ids, comma separated: 1,2,3")->check(not_empty());
  text->excludes(ids);
  add_sampling_options(cmd, o->sampling, "tokens to generate at most");
  cmd->add_option("--threads", o->threads,
                  "CPU threads (default: the CPUs this process may run on, shared with the other processes mpirun "
                  "started on this host)")
      ->check(whole_number_in(1, kMaxThreads));
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "longest prompt piece per step")
      ->capture_default_str()
      ->check(whole_number_in(1, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--dump-logits", o->dump_logits,
                  "write prompt_logits [T, vocab] and step_logits [S, vocab] (row i chose token i) as F32 safetensors")
      ->check(not_empty());
  cmd->add_flag("--print-ids", o->print_ids, "print token ids even when a tokenizer is available");
  cmd->add_option("--device", o->device,
                  "cpu, or cuda (refused for now: the CUDA forward of the whole model is not there yet)");
  cmd->add_option("--tp", o->tp,
                  "ranks: tensor parallelism over threads of this process, or under mpirun the number of processes "
                  "(its default)")
      ->check(whole_number_in(1, std::numeric_limits<int>::max()));
  cmd->add_option("--ep", o->ep,
                  "expert parallelism: ranks the routed experts are spread over (divides --tp; the rest "
                  "cuts every expert, MoE-TP)")
      ->check(whole_number_in(1, std::numeric_limits<int>::max()));
  cmd->add_flag("--attention-dp", o->attention_dp,
                "attention data parallelism: each rank runs its own sequences (needs --ep equal to --tp)");
  cmd->add_option(
         "--moe-comm", o->moe_comm,
         "MoE communication: direct (one all-reduce; the default with attention-DP off) or all_to_all (tokens sent to "
         "their experts' ranks; needs --ep equal to --tp; the default, and the only one with attention-DP)")
      ->check(not_empty());
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace kimirt::cli
