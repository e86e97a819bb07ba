// `kimirt make-tiny OUT`: writes a random checkpoint in the released layout (model/tiny_checkpoint.h) for
// tests, benchmarks and demos, small by default or scaled to a size with --size-gb.
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/cli/command.h"
#include "kimirt/cli/flag_checks.h"
#include "kimirt/model/tiny_checkpoint.h"
#include "kimirt/text/default_tokenizer.h"
#include "kimirt/text/tokenizer.h"

namespace kimirt::cli {
namespace {

namespace fs = std::filesystem;

// The files the tokenizer reads from a model directory (text/tokenizer.h), for --tokenizer-from.
constexpr const char* kTokenizerFiles[] = {"tiktoken.model", "tokenizer_config.json"};

struct MakeTinyOptions {
  std::string out;
  std::string family = "k3";
  std::string experts_format = "mxfp4";
  uint64_t seed = 0;
  double shard_mb = 2048;
  double size_gb = 0;
  std::string tokenizer_from;
  bool no_tokenizer = false;
  model::TinyDims dims;
};

CLI::Option* add_dim(CLI::App* cmd, const std::string& flag, std::optional<int64_t>& field, const std::string& help,
                     bool zero_ok = false) {
  return cmd
      ->add_option_function<int64_t>(
          flag, [&field](const int64_t& v) { field = v; }, help)
      ->check(whole_number_in(zero_ok ? 0 : 1, std::numeric_limits<int64_t>::max()));
}

void run(const MakeTinyOptions& o) {
  const std::map<std::string, model::ModelFamily> families = {{"k3", model::ModelFamily::kKimiK3},
                                                              {"kimi-linear", model::ModelFamily::kKimiLinear}};
  const std::map<std::string, model::ExpertStorage> formats = {{"mxfp4", model::ExpertStorage::kMxfp4},
                                                               {"bf16", model::ExpertStorage::kBf16},
                                                               {"fp8", model::ExpertStorage::kFp8}};
  // Without --vocab and --tokenizer-from, a K3 checkpoint gets the built-in tokenizer (K3 special tokens)
  // and its vocabulary, so that it takes and gives text.
  const bool builtin_tokenizer = o.family == "k3" && !o.no_tokenizer && o.tokenizer_from.empty() && !o.dims.vocab;
  model::TinyDims dims = o.dims;
  if (builtin_tokenizer) dims.vocab = text::default_tokenizer_vocab_size();
  if (!o.tokenizer_from.empty()) {
    // The model's vocabulary is the tokenizer's: with any other, run and chat could not turn its ids into text.
    const int64_t ids = with_context(fmt::format("--tokenizer-from {}", o.tokenizer_from), [&] {
      return static_cast<int64_t>(text::Tokenizer::load(o.tokenizer_from).vocab_size());
    });
    KIMIRT_CHECK(!dims.vocab || *dims.vocab == ids, "--vocab {}: the tokenizer of --tokenizer-from {} has {} ids",
                 dims.vocab.value_or(0), o.tokenizer_from, ids);
    dims.vocab = ids;
  }
  model::ModelConfig config = model::tiny_config(families.at(o.family), dims, formats.at(o.experts_format));
  if (o.size_gb > 0) model::scale_experts_to_size(config, static_cast<uint64_t>(o.size_gb * double(1ull << 30)));
  model::TinyCheckpointOptions options;
  options.seed = o.seed;
  options.shard_bytes = static_cast<uint64_t>(o.shard_mb * double(1ull << 20));
  if (!o.tokenizer_from.empty()) {
    for (const char* name : kTokenizerFiles) {
      const fs::path p = fs::path(o.tokenizer_from) / name;
      KIMIRT_CHECK(fs::is_regular_file(p), "--tokenizer-from: {} has no {}", o.tokenizer_from, name);
      options.side_files.push_back(p);
    }
  }
  // The built-in tokenizer is written inside the checkpoint's all-or-nothing write: written into OUT
  // afterwards, a failure (a full disk) left a checkpoint without it, or with a cut one.
  if (builtin_tokenizer) options.add_files = [](const fs::path& dir) { text::write_default_tokenizer(dir); };
  // The checkpoint must fit on the disk it goes to: refused now, with the sizes, rather than found by filling
  // the disk (a run stopped on the way left gigabytes of its partial directory behind).
  // Measured on the nearest folder that exists (OUT and its missing parents are made later; "OUT/" names OUT).
  const uint64_t need = model::tiny_checkpoint_bytes(config);
  std::error_code ec;
  fs::path existing = fs::absolute(fs::path(o.out), ec).lexically_normal();
  while (existing.has_relative_path() && !fs::exists(existing, ec)) existing = existing.parent_path();
  const fs::space_info space = fs::space(existing, ec);
  KIMIRT_CHECK(!ec, "{}: cannot tell the free space of {}: {}", o.out, existing.string(), ec.message());
  KIMIRT_CHECK(need <= space.available, "{}: the checkpoint's tensors take {}, more than the {} free in {}", o.out,
               format_bytes(need), format_bytes(space.available), existing.string());
  const Timer timer;
  const auto info = model::write_tiny_checkpoint(o.out, config, options);
  std::printf("%s: %s model, %lld layers, %lld experts (%s), %zu tensors, %s in %zu shard(s), %.1f s\n", o.out.c_str(),
              std::string(model::family_name(config.family)).c_str(), static_cast<long long>(config.num_layers),
              static_cast<long long>(config.num_experts), o.experts_format.c_str(), info.tensors,
              format_bytes(info.tensor_bytes).c_str(), info.shards, timer.seconds());
}

const RegisterCommand kMakeTiny("make-tiny", 70, [](CLI::App& app) {
  auto o = std::make_shared<MakeTinyOptions>();
  auto* cmd = app.add_subcommand("make-tiny", "Write a random checkpoint in the released layout (tests, benchmarks)");
  cmd->add_option("OUT", o->out, "checkpoint directory to create (must not exist, or be empty)")->required();
  cmd->add_option("--family", o->family, "model family")->check(CLI::IsMember({"k3", "kimi-linear"}));
  cmd->add_option("--experts-format", o->experts_format, "routed expert storage")
      ->check(CLI::IsMember({"mxfp4", "bf16", "fp8"}));
  cmd->add_option("--seed", o->seed, "random seed (each tensor depends only on it and its name)")
      ->check(decimal_at_most(std::numeric_limits<uint64_t>::max()));
  // Bounded so that the byte counts they become fit 64 bits (a double past that converts to anything).
  cmd->add_option("--shard-mb", o->shard_mb, "shard size in MiB (a larger tensor gets a shard of its own)")
      ->check(number_in(1.0 / 1024, 1024.0 * 1024 * 1024, false, "[1/1024, 2^30]"));
  auto* size_gb =
      cmd->add_option("--size-gb", o->size_gb, "grow the number of experts until the checkpoint holds this many GiB")
          ->check(number_in(1.0 / 1024, 1024.0 * 1024, false, "[1/1024, 2^20]"));
  cmd->add_option("--tokenizer-from", o->tokenizer_from,
                  "copy tiktoken.model and tokenizer_config.json from this directory (default for k3: the "
                  "built-in tokenizer, unless --vocab is given)");
  cmd->add_flag("--no-tokenizer", o->no_tokenizer, "write no tokenizer files")->excludes("--tokenizer-from");
  auto& d = o->dims;
  add_dim(cmd, "--hidden", d.hidden, "hidden size");
  add_dim(cmd, "--layers", d.layers, "decoder layers (MLA every --mla-period-th and the last, KDA elsewhere)");
  add_dim(cmd, "--mla-period", d.mla_period, "MLA layer period (default 4)");
  add_dim(cmd, "--vocab", d.vocab, "vocabulary size");
  add_dim(cmd, "--heads", d.heads, "KDA and MLA heads");
  add_dim(cmd, "--head-dim", d.head_dim, "KDA head dim, MLA v and nope head dims");
  add_dim(cmd, "--rope-dim", d.rope_dim, "MLA qk_rope_head_dim");
  add_dim(cmd, "--kv-lora-rank", d.kv_lora_rank, "MLA kv_lora_rank");
  add_dim(cmd, "--q-lora-rank", d.q_lora_rank, "MLA q_lora_rank (k3)");
  // --size-gb sets the expert count itself (an --experts beside it was ignored).
  add_dim(cmd, "--experts", d.experts, "routed experts per MoE layer")->excludes(size_gb);
  add_dim(cmd, "--top-k", d.top_k, "experts per token");
  add_dim(cmd, "--shared-experts", d.shared_experts, "shared experts", /*zero_ok=*/true);
  add_dim(cmd, "--intermediate", d.intermediate, "dense MLP width (layer 0)");
  add_dim(cmd, "--moe-intermediate", d.moe_intermediate, "routed and shared expert width");
  add_dim(cmd, "--latent", d.latent, "latent MoE width, routed_expert_hidden_size (k3)");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace kimirt::cli
