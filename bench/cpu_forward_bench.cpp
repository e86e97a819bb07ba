// CPU forward throughput (not a test): prefill and decode tokens/s of the CPU backend on a make-tiny Kimi K3
// of about 1 B parameters, next to two ceilings measured in the same run with the same threads: sgemm
// GFLOP/s on a prefill-shaped product (prefill is compute-bound) and the rate at which the threads can
// stream fp32 memory (decode reads every active weight once per token). Figures go to docs/PERF.md.
//
//   cpu forward bench: --dir /tmp/kimirt-cpu-forward-bench [--threads 2] [--prompt 512] [--decode 64] [--keep]
//
// The checkpoint is generated into --dir when it is not there (hidden 2048, 8 layers, 16 heads of 128, 64
// experts top-4 of width 512 in a 1024-wide latent, MXFP4 experts: 1.08 B parameters, 1.04 GiB) and removed at
// the end unless --keep. Work per token counts the weights a token touches: everything but the embedding
// table, with only top-k of the routed experts.
//
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench_registry.h"
#include "kimirt/base/error.h"
#include "kimirt/base/progress.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/base/timer.h"
#include "kimirt/comm/comm.h"
#include "kimirt/cpu/lm_head.h"
#include "kimirt/cpu/matmul.h"
#include "kimirt/model/loader.h"
#include "kimirt/model/tiny_checkpoint.h"
#include "kimirt/runtime/cpu_backend.h"
#include "kimirt/runtime/forward.h"

namespace kimirt::bench {
namespace {

namespace fs = std::filesystem;

model::ModelConfig bench_config() {
  model::TinyDims d;
  d.hidden = 2048;
  d.layers = 8;
  d.vocab = 32768;
  d.heads = 16;
  d.head_dim = 128;
  d.rope_dim = 64;
  d.kv_lora_rank = 512;
  d.q_lora_rank = 768;
  d.experts = 64;
  d.top_k = 4;
  d.shared_experts = 1;
  d.intermediate = 4096;
  d.moe_intermediate = 512;
  d.latent = 1024;
  return model::tiny_config(model::ModelFamily::kKimiK3, d);
}

// fp32 weights one token reads: all but the embedding table, only top_k of each MoE layer's experts.
double active_weight_bytes(const model::ModelConfig& c, uint64_t backend_bytes) {
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
  const double expert = 3.0 * static_cast<double>(c.moe_intermediate_size * c.expert_hidden_size()) * 4.0;
  const double unused =
      static_cast<double>(moe_layers) * static_cast<double>(c.num_experts - c.num_experts_per_token) * expert;
  return static_cast<double>(backend_bytes) - static_cast<double>(c.vocab_size * c.hidden_size) * 4.0 - unused;
}

// Best-of-three sgemm GFLOP/s for [512, 2048] · [2048, 2048]ᵀ through cpu::matmul.
double sgemm_gflops() {
  const int64_t m = 512, n = 2048, k = 2048;
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), w(static_cast<size_t>(n * k), 0.25f);
  std::vector<float> y(static_cast<size_t>(m * n));
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const Timer t;
    cpu::matmul(x.data(), w.data(), y.data(), m, n, k);
    best = std::min(best, t.seconds());
  }
  return 2.0 * static_cast<double>(m * n * k) / best / 1e9;
}

// Best-of-three GB/s of the pool's threads summing a 512 MiB fp32 array.
double stream_gbps() {
  const int64_t n = int64_t{128} << 20;
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  auto& pool = ThreadPool::global();
  std::atomic<double> sink{0.0};  // keeps the sums alive
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const Timer t;
    pool.parallel_for(n, n / static_cast<int64_t>(pool.num_threads()), [&](int64_t b, int64_t e) {
      float s[8] = {};
      for (int64_t j = b; j + 8 <= e; j += 8) {
        for (int l = 0; l < 8; ++l) s[l] += a[static_cast<size_t>(j + l)];
      }
      double total = 0.0;
      for (float v : s) total += v;
      sink.fetch_add(total);
    });
    best = std::min(best, t.seconds());
  }
  KIMIRT_CHECK(sink.load() > 0.0, "stream ceiling: nothing was read");
  return static_cast<double>(n) * 4.0 / best / 1e9;
}

}  // namespace

int run_cpu_forward_bench(int argc, char** argv) {
  CLI::App app{"kimirt CPU forward benchmark: prefill and decode tokens/s of a ~1 B K3", "cpu-forward-bench"};
  std::string dir = "/tmp/kimirt-cpu-forward-bench";
  size_t threads = 2;
  int64_t prompt = 512;
  int64_t decode = 64;
  bool keep = false;
  app.add_option("--dir", dir, "checkpoint directory (generated when missing)");
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--prompt", prompt, "prompt tokens (one prefill)")->check(CLI::PositiveNumber);
  app.add_option("--decode", decode, "decode steps")->check(CLI::PositiveNumber);
  app.add_flag("--keep", keep, "keep the checkpoint afterwards");
  CLI11_PARSE(app, argc, argv);
  try {
    ThreadPool::set_global_threads(threads);
    bool generated = false;
    if (!fs::exists(dir)) {
      const Timer t;
      const auto info = model::write_tiny_checkpoint(dir, bench_config());
      std::printf("generated %s: %s in %zu shards, %.1f s\n", dir.c_str(), format_bytes(info.tensor_bytes).c_str(),
                  info.shards, t.seconds());
      generated = true;
    }
    const Timer load_timer;
    model::LoadOptions options;
    options.progress = false;
    model::LoadedModel loaded = model::load_model(dir, {}, options);
    const model::ModelConfig& c = loaded.config;
    runtime::CacheConfig cache{1, 64, static_cast<int>((prompt + decode + 63) / 64)};
    SingleComm comm;
    runtime::CpuBackend backend(c, loaded.params, comm, {}, cache);
    loaded.params = model::ParamStore();
    const double active = active_weight_bytes(c, backend.weights().bytes());
    std::printf("model: %.2f B parameters (fp32 in the backend: %s), %.0f M touched per token; ready in %.1f s\n",
                static_cast<double>(backend.weights().bytes()) / 4e9, format_bytes(backend.weights().bytes()).c_str(),
                active / 4e6, load_timer.seconds());

    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab_size - 1));
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (auto& v : ids) v = id(rng);
    std::vector<int32_t> blocks;
    for (int b = 0; b < cache.num_blocks; ++b) blocks.push_back(b);
    runtime::Forward forward(backend);
    std::vector<float> row(static_cast<size_t>(c.vocab_size));

    runtime::StepBatch pre;
    pre.add(ids, 0, 0, blocks, runtime::LogitRows::kLast);
    const Timer prefill_timer;
    runtime::ActBuffer logits = forward.run(pre);
    backend.to_host(logits.get(), 0, 1, row);
    const double prefill_s = prefill_timer.seconds();

    const Timer decode_timer;
    for (int64_t i = 0; i < decode; ++i) {
      const int32_t next = cpu::argmax(row.data(), c.vocab_size);
      runtime::StepBatch step;
      step.add(std::vector<int32_t>{next}, prompt + i, 0, blocks, runtime::LogitRows::kLast);
      logits = forward.run(step);
      backend.to_host(logits.get(), 0, 1, row);
    }
    const double decode_s = decode_timer.seconds();

    const double gflops = sgemm_gflops(), gbps = stream_gbps();
    const double prefill_rate = static_cast<double>(prompt) / prefill_s;
    const double decode_rate = static_cast<double>(decode) / decode_s;
    const double prefill_gflops = prefill_rate * active / 4.0 * 2.0 / 1e9;
    const double decode_gbps = decode_rate * active / 1e9;
    std::printf("threads %zu; ceilings: sgemm %.1f GFLOP/s, fp32 stream %.1f GB/s\n", threads, gflops, gbps);
    std::printf("prefill %lld tokens: %8.1f tok/s  %7.1f GFLOP/s  %.2f of sgemm\n", static_cast<long long>(prompt),
                prefill_rate, prefill_gflops, prefill_gflops / gflops);
    std::printf("decode  %lld tokens: %8.2f tok/s  %7.1f GB/s     %.2f of stream\n", static_cast<long long>(decode),
                decode_rate, decode_gbps, decode_gbps / gbps);
    if (generated && !keep) fs::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu-forward-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace kimirt::bench

namespace {
const kimirt::bench::RegisterSuite kCpuForwardSuite("cpu-forward", "CPU prefill/decode tokens/s of a make-tiny model",
                                                    kimirt::bench::run_cpu_forward_bench);
}  // namespace
