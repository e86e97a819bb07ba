// Checkpoint loading throughput (not a test): loads a >= 8 GiB make-tiny checkpoint from the page cache and
// cold, and runs `cat FILES > /dev/null` on the same files in the same run as the ceiling. Figures go to
// docs/PERF.md.
//
//   kimirt-bench load --dir /tmp/kimirt-load-bench [--size-gb 8] [--staging-mb 1024] [--threads 4] [--repeats 3]
//               [--keep]
//
// The checkpoint is generated into --dir when it is not there (K3 layout, real expert dimensions: latent
// 3584, expert width 3072, so each expert is the release's 17.5 MB) and removed at the end unless --keep.
// "Cold" means after posix_fadvise(DONTNEED) on every file, which drops clean cached pages; the loader itself
// drops each file's pages when done, so every warm run is preceded by an untimed cat.
//
// Two loads are timed each way: into a host ParamStore (what the CPU backend gets: reading plus copying into
// freshly allocated tensors) and into a target that discards the bytes (the read path a device target's
// uploads would overlap with).

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_registry.h"
#include "kimirt/base/error.h"
#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/model/loader.h"
#include "kimirt/model/tiny_checkpoint.h"

namespace kimirt::bench {
namespace {

namespace fs = std::filesystem;

class DiscardTarget final : public model::LoadTarget {
 public:
  void begin(const model::LoadPlan&) override {}
  void write(const model::StagedWrite& w) override { bytes_ += w.width * w.rows; }
  void finish() override {}
  void abandon() noexcept override {}
  uint64_t bytes() const { return bytes_; }

 private:
  std::atomic<uint64_t> bytes_{0};
};

std::vector<fs::path> shard_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void drop_cache(const std::vector<fs::path>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    KIMIRT_CHECK(fd >= 0, "{}: cannot open", f.string());
    (void)::fdatasync(fd);  // dirty pages (a fresh checkpoint) cannot be dropped until written
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double run_cat(const std::vector<fs::path>& files) {
  std::string command = "cat";
  for (const auto& f : files) command += " '" + f.string() + "'";
  command += " > /dev/null";
  const Timer timer;
  KIMIRT_CHECK(std::system(command.c_str()) == 0, "cat failed");
  return timer.seconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

model::ModelConfig bench_config(double size_gb) {
  model::TinyDims d;
  d.hidden = 2048;
  d.layers = 8;
  d.vocab = 32768;
  d.heads = 16;
  d.head_dim = 128;
  d.rope_dim = 64;
  d.q_lora_rank = 768;
  d.kv_lora_rank = 256;
  d.intermediate = 8192;
  d.moe_intermediate = 3072;
  d.latent = 3584;
  d.top_k = 8;
  auto config = model::tiny_config(model::ModelFamily::kKimiK3, d);
  model::scale_experts_to_size(config, static_cast<uint64_t>(size_gb * double(1ull << 30)));
  return config;
}

}  // namespace

int run_load_bench(int argc, char** argv) {
  CLI::App app{"kimirt load benchmark: checkpoint loading vs cat, warm and cold", "load-bench"};
  std::string dir = "/tmp/kimirt-load-bench";
  double size_gb = 8.0;
  double staging_mb = 1024;
  int threads = 4;
  bool keep = false;
  int repeats = 3;
  app.add_option("--dir", dir, "checkpoint directory (generated when missing)");
  app.add_option("--size-gb", size_gb, "size of the generated checkpoint in GiB")->check(CLI::PositiveNumber);
  app.add_option("--staging-mb", staging_mb, "staging budget in MiB")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "I/O threads")->check(CLI::PositiveNumber);
  app.add_flag("--keep", keep, "keep the checkpoint afterwards");
  app.add_option("--repeats", repeats, "measurements of each figure (the median is reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    bool generated = false;
    if (!fs::exists(dir)) {
      const auto config = bench_config(size_gb);
      const Timer timer;
      const auto info = model::write_tiny_checkpoint(dir, config, {});
      std::printf("generated %s: %zu tensors, %s in %zu shards, %lld experts/layer, %.1f s\n", dir.c_str(),
                  info.tensors, format_bytes(info.tensor_bytes).c_str(), info.shards,
                  static_cast<long long>(config.num_experts), timer.seconds());
      generated = true;
      struct rusage usage {};
      ::getrusage(RUSAGE_SELF, &usage);
      std::printf("peak RSS while generating: %s\n",
                  format_bytes(static_cast<uint64_t>(usage.ru_maxrss) * 1024).c_str());
    }
    const auto files = shard_files(dir);
    const io::Checkpoint checkpoint = io::Checkpoint::open(dir);
    const auto config = model::ModelConfig::from_json(checkpoint.config());
    const model::Schema schema = model::Schema::for_checkpoint(config, model::checkpoint_keys(checkpoint));
    const model::LoadPlan plan = model::LoadPlan::build(checkpoint, schema, model::ParallelMapping{});
    uint64_t file_bytes = 0;
    for (const auto& f : files) file_bytes += fs::file_size(f);
    model::LoadOptions options;
    options.staging_bytes = static_cast<uint64_t>(staging_mb * double(1 << 20));
    options.io_threads = threads;
    options.progress = false;
    std::printf("checkpoint: %zu files, %s on disk, %s of tensors, %zu reads; staging %s, %d I/O threads, %u cores\n",
                files.size(), format_bytes(file_bytes).c_str(), format_bytes(plan.read_bytes()).c_str(),
                plan.reads().size(), format_bytes(options.staging_bytes).c_str(), threads,
                std::thread::hardware_concurrency());

    auto host_load = [&] {
      model::ParamStoreTarget target;
      const Timer t;
      const auto stats = model::execute_plan(plan, target, options);
      const double s = t.seconds();
      const auto store = target.take();
      KIMIRT_CHECK(store.total_bytes() == plan.dest_bytes(), "host load delivered {} of {} bytes", store.total_bytes(),
                   plan.dest_bytes());
      std::printf("  (host load: %llu preads, %s buffers, peak staging %s)\n",
                  static_cast<unsigned long long>(stats.read.preads), format_bytes(stats.read.buffer_bytes).c_str(),
                  format_bytes(stats.read.peak_staging_bytes).c_str());
      return s;
    };
    auto discard_load = [&] {
      DiscardTarget target;
      const Timer t;
      model::execute_plan(plan, target, options);
      const double s = t.seconds();
      KIMIRT_CHECK(target.bytes() == plan.dest_bytes(), "discard load delivered {} of {} bytes", target.bytes(),
                   plan.dest_bytes());
      return s;
    };

    // The disk of a VM, and its memory, vary from run to run: each figure is measured `repeats` times,
    // interleaved, and compared with the cat measured right before it; medians are printed.
    const uint64_t bytes = plan.read_bytes();
    std::map<std::string, std::vector<double>> seconds;
    auto record = [&](const std::string& what, double s, uint64_t n, double cat_s) {
      seconds[what].push_back(s);
      const double r = (static_cast<double>(n) / s) / (static_cast<double>(file_bytes) / cat_s);
      std::printf("  %-36s %7.2f s %7.2f GB/s  %.2fx the cat before it\n", what.c_str(), s,
                  static_cast<double>(n) / s / 1e9, r);
      std::fflush(stdout);
    };
    for (int rep = 0; rep < repeats; ++rep) {
      std::printf("repetition %d\n", rep + 1);
      run_cat(files);  // warm: every timed warm run starts with all files cached
      double cat = run_cat(files);
      record("cat, page cache", cat, file_bytes, cat);
      record("load -> host ParamStore, page cache", host_load(), bytes, cat);
      run_cat(files);
      cat = run_cat(files);
      record("load -> discard, page cache", discard_load(), bytes, cat);
      drop_cache(files);
      cat = run_cat(files);
      record("cat, cold", cat, file_bytes, cat);
      drop_cache(files);
      record("load -> host ParamStore, cold", host_load(), bytes, cat);
      drop_cache(files);
      cat = run_cat(files);
      drop_cache(files);
      record("load -> discard, cold", discard_load(), bytes, cat);
    }
    // The summary compares medians of rates: on a VM disk two consecutive cold cats can differ 3x, so a
    // single pair says little.
    auto rate = [&](const std::string& what) {
      const uint64_t n = what.starts_with("cat") ? file_bytes : bytes;
      return static_cast<double>(n) / median(seconds[what]) / 1e9;
    };
    std::printf("medians over %d repetitions (%s of tensors, staging <= %s):\n", repeats, format_bytes(bytes).c_str(),
                format_bytes(options.staging_bytes).c_str());
    for (const char* temp : {"page cache", "cold"}) {
      const double cat = rate(std::string("cat, ") + temp);
      std::printf("  %-36s %7.2f GB/s\n", (std::string("cat, ") + temp).c_str(), cat);
      for (const char* target : {"host ParamStore", "discard"}) {
        const std::string what = std::string("load -> ") + target + ", " + temp;
        std::printf("  %-36s %7.2f GB/s   %.2fx cat\n", what.c_str(), rate(what), rate(what) / cat);
      }
    }
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    std::printf("peak RSS %s\n", format_bytes(static_cast<uint64_t>(usage.ru_maxrss) * 1024).c_str());
    if (generated && !keep) fs::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "load-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace kimirt::bench

namespace {
const kimirt::bench::RegisterSuite kLoadSuite("load", "checkpoint load GB/s, warm and cold, next to cat on the same files",
                                              kimirt::bench::run_load_bench);
}  // namespace
