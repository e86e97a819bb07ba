#include "kimirt/model/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "kimirt/model/expert_stream.h"
#include "kimirt/tensor/float_convert.h"
#include "loader_test_util.h"

namespace kimirt::model {
namespace {

using loadtest::bytes_of;
using loadtest::error_of;
using loadtest::RecordingTarget;
using loadtest::Scratch;
using quant::Region;
using ::testing::HasSubstr;

std::filesystem::path testdata(const std::string& rel) { return std::filesystem::path(KIMIRT_TESTDATA_DIR) / rel; }

LoadOptions quiet(uint64_t staging = 1ull << 30, int threads = 4) {
  LoadOptions o;
  o.staging_bytes = staging;
  o.io_threads = threads;
  o.progress = false;
  return o;
}

struct Opened {
  io::Checkpoint checkpoint;
  ModelConfig config;
  std::unique_ptr<Schema> schema;
};

Opened open(const std::filesystem::path& dir) {
  io::Checkpoint c = io::Checkpoint::open(dir);
  ModelConfig config = ModelConfig::from_json(c.config());
  auto schema = std::make_unique<Schema>(Schema::for_checkpoint(config, checkpoint_keys(c)));
  return {std::move(c), std::move(config), std::move(schema)};
}

void expect_same_store(const ParamStore& a, const ParamStore& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, p] : a.params()) {
    const LoadedParam* q = b.find(name);
    ASSERT_NE(q, nullptr) << name;
    ASSERT_EQ(p.component_ids, q->component_ids) << name;
    for (size_t i = 0; i < p.components.size(); ++i) {
      EXPECT_EQ(p.components[i].dtype(), q->components[i].dtype()) << name;
      EXPECT_EQ(p.components[i].shape(), q->components[i].shape()) << name;
      EXPECT_TRUE(bytes_of(p.components[i]) == bytes_of(q->components[i])) << name << " component " << i;
    }
  }
}

// Loaded at tp = 1, every parameter holds exactly the stored bytes: its sources' tensors (read here through
// the checkpoint's own reader) concatenated in order, A_log without its padding.
void expect_loads_exactly(const std::filesystem::path& dir) {
  const LoadedModel m = load_model(dir, ParallelMapping{}, quiet());
  const io::Checkpoint c = io::Checkpoint::open(dir);
  EXPECT_EQ(m.params.size(), m.schema->params().size());
  uint64_t stored = 0;
  for (const auto& spec : m.schema->params()) {
    const LoadedParam& p = m.params.at(spec.name);
    EXPECT_EQ(p.spec, &spec);
    EXPECT_EQ(p.shape, spec.shape) << spec.name;
    const auto keys = m.schema->checkpoint_keys(spec);
    const size_t per_source = p.components.size();
    ASSERT_EQ(keys.size(), per_source * spec.sources.size()) << spec.name;
    for (size_t ci = 0; ci < per_source; ++ci) {
      std::vector<uint8_t> want;
      for (size_t s = 0; s < spec.sources.size(); ++s) {
        const auto bytes = bytes_of(c.read_tensor(keys[s * per_source + ci]));
        want.insert(want.end(), bytes.begin(), bytes.end());
        if (spec.role != ParamRole::kLmHead || !m.config.tie_word_embeddings) stored += bytes.size();
      }
      if (spec.role == ParamRole::kKdaALog) want.resize(p.components[ci].nbytes());
      EXPECT_TRUE(bytes_of(p.components[ci]) == want) << spec.name << " component " << ci;
    }
  }
  EXPECT_EQ(stored, c.tensor_bytes());
}

TEST(Loader, KimiLinearTinyLoadsCompletely) { expect_loads_exactly(testdata("kl-tiny")); }
TEST(Loader, K3TinyLoadsCompletely) { expect_loads_exactly(testdata("k3-tiny")); }

// For every held parameter of every rank: the local tensor is the rule applied to the tp = 1 tensor, and the
// ranks together cover every element of it, so the slices reassemble it exactly.
void expect_ranks_reassemble(const Opened& o, const ParamStore& full, int tp, int ep, bool attention_dp) {
  SCOPED_TRACE(::testing::Message() << "tp " << tp << " ep " << ep << (attention_dp ? " attention-DP" : ""));
  const auto whole = slice_all(*o.schema, ParallelMapping{});
  std::map<std::string, Tensor> covered;  // per "param#component": 0xff where some rank holds the byte
  for (int r = 0; r < tp; ++r) {
    const ParallelMapping m = ParallelMapping::make(tp, r, ep, attention_dp);
    // 8 KiB staging buffers: most tensors arrive in pieces that cut through their rows.
    const ParamStore store = load_params(o.checkpoint, *o.schema, m, quiet(16 << 10, 2));
    const auto slices = slice_all(*o.schema, m);
    size_t held = 0;
    for (size_t i = 0; i < slices.size(); ++i) {
      const ParamSlice& slice = slices[i];
      if (!slice.held()) continue;
      ++held;
      const std::string& name = slice.spec->name;
      const LoadedParam& local = store.at(name);
      const LoadedParam& ref = full.at(name);
      EXPECT_EQ(local.shape, slice.local_shape) << name;
      for (size_t k = 0; k < slice.components.size(); ++k) {
        const ComponentSlice& cs = slice.components[k];
        const Tensor* mine = local.component(cs.component);
        const Tensor* all = ref.component(cs.component);
        ASSERT_TRUE(mine && all) << name;
        // The tp = 1 tensor stacks the sources; source s sits at the rows of whole[i]'s copy of s.
        std::vector<TensorView> sources;
        for (const auto& copy : whole[i].components[k].rule.copies) {
          sources.push_back(all->view().rank() == 0
                                ? all->view()
                                : all->view().slice_rows(copy.dst.begin[0], copy.dst.begin[0] + copy.dst.extent[0]));
        }
        const Tensor expected = quant::apply_slice(sources, cs.rule);
        EXPECT_TRUE(bytes_of(*mine) == bytes_of(expected)) << name << " rank " << r;
        Tensor& mask =
            covered.try_emplace(name + "#" + std::to_string(cs.component), all->dtype(), all->shape()).first->second;
        Tensor ones(mine->dtype(), mine->shape());
        std::memset(ones.data(), 0xff, ones.nbytes());
        for (const auto& copy : cs.rule.copies) {
          Region at = copy.src;
          const auto& d = whole[i].components[k].rule.copies[static_cast<size_t>(copy.source)].dst;
          for (size_t dim = 0; dim < at.begin.size(); ++dim) at.begin[dim] += d.begin[dim];
          quant::copy_region(ones.view(), copy.dst, mask.view(), at);
        }
      }
    }
    EXPECT_EQ(held, store.size());
  }
  for (const auto& [key, mask] : covered) {
    const auto b = bytes_of(mask);
    EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0xff; })) << key << " not covered";
  }
  // Every parameter is held by some rank.
  size_t params_covered = 0;
  for (const auto& spec : o.schema->params()) {
    params_covered += std::any_of(covered.begin(), covered.end(),
                                  [&](const auto& kv) { return kv.first.starts_with(spec.name + "#"); });
  }
  EXPECT_EQ(params_covered, o.schema->params().size());
}

TEST(Loader, KimiLinearTinyRankSlicesReassemble) {
  const Opened o = open(testdata("kl-tiny"));
  const ParamStore full = load_params(o.checkpoint, *o.schema, ParallelMapping{}, quiet());
  for (auto [tp, ep] : {std::pair{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {4, 4}}) {
    expect_ranks_reassemble(o, full, tp, ep, false);
  }
  expect_ranks_reassemble(o, full, 2, 2, true);
  expect_ranks_reassemble(o, full, 4, 4, true);
}

TEST(Loader, K3TinyRankSlicesReassemble) {
  const Opened o = open(testdata("k3-tiny"));
  const ParamStore full = load_params(o.checkpoint, *o.schema, ParallelMapping{}, quiet());
  for (auto [tp, ep] : {std::pair{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}})
    expect_ranks_reassemble(o, full, tp, ep, false);
  expect_ranks_reassemble(o, full, 4, 4, true);
  // MoE-TP 4 would cut w2's 64 columns into 16: half an MX scale group. Refused before a byte is read.
  EXPECT_THAT(error_of([&] { load_params(o.checkpoint, *o.schema, ParallelMapping::make(4, 0, 1), quiet()); }),
              HasSubstr("weight_scale"));
}

// The stub of the seed PR's review: an index and two shards, one expert's w1 in the first and its w2/w3 in the
// second. Each slot loads once, each layer is prepared and finalized once, in protocol order.
TEST(Loader, ExpertSplitAcrossTwoShardsLoadsEachSlotOnce) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  auto raw = loadtest::read_raw(loadtest::make_checkpoint(scratch / "src", config));
  const std::string a = "model-00001-of-00002.safetensors", b = "model-00002-of-00002.safetensors";
  const std::string e1 = "language_model.model.layers.1.block_sparse_moe.experts.1.";
  for (auto& [name, file] : raw.shard_of) {
    const bool second = name.starts_with(e1 + "w2.") || name.starts_with(e1 + "w3.") ||
                        name.starts_with("language_model.model.layers.2.block_sparse_moe.experts.");
    file = second ? b : a;
  }
  loadtest::write_raw(scratch / "split", raw);
  const Opened o = open(scratch / "split");
  ASSERT_EQ(o.checkpoint.shards().size(), 2u);
  EXPECT_EQ(*o.checkpoint.index()->file_of(e1 + "w1.weight_packed"), a);
  EXPECT_EQ(*o.checkpoint.index()->file_of(e1 + "w2.weight_scale"), b);
  const ParamStore reference = load_params(o.checkpoint, *o.schema, ParallelMapping{}, quiet());

  for (int ep : {1, 2}) {
    for (int rank = 0; rank < ep; ++rank) {
      // Small staging: pieces of one expert arrive from both files on two threads at once.
      RecordingTarget target;
      load_into(target, o.checkpoint, *o.schema, ParallelMapping::make(ep, rank, ep), quiet(8 << 10, 2));
      EXPECT_TRUE(target.protocol_errors.empty()) << target.protocol_errors.front();
      EXPECT_EQ(target.begins, 1);
      EXPECT_EQ(target.finishes, 1);
      EXPECT_EQ(target.abandons, 0);
      EXPECT_EQ(target.prepare_calls, (std::map<int32_t, int>{{1, 1}, {2, 1}}));
      EXPECT_EQ(target.finalize_calls, (std::map<int32_t, int>{{1, 1}, {2, 1}}));
      const int slots = 2 * 8 / ep;
      ASSERT_EQ(target.slot_calls.size(), static_cast<size_t>(slots));
      for (const auto& [slot, calls] : target.slot_calls) EXPECT_EQ(calls, 1) << "slot " << slot;
      const ParamStore store = target.take();
      if (ep == 1) expect_same_store(store, reference);
    }
  }
}

TEST(Loader, K3DenseMlpAtTp2Rank1GetsTheSecondHalfOfGateAndUp) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  const auto dir = loadtest::make_checkpoint(scratch / "k3", config);
  const auto raw = loadtest::read_raw(dir);
  const Opened o = open(dir);
  const ParamStore store = load_params(o.checkpoint, *o.schema, ParallelMapping::make(2, 1), quiet());
  const LoadedParam& gu = store.at("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_EQ(gu.shape, (Shape{128, 64}));  // intermediate 128: 64 gate rows, then 64 up rows
  const auto& gate = raw.tensors.at("language_model.model.layers.0.mlp.gate_proj.weight").bytes;
  const auto& up = raw.tensors.at("language_model.model.layers.0.mlp.up_proj.weight").bytes;
  const size_t row = 64 * 2, half = 64 * row;
  ASSERT_NE(std::vector<uint8_t>(gate.begin() + half, gate.end()), std::vector<uint8_t>(up.begin() + half, up.end()));
  const auto got = bytes_of(gu.components[0]);
  EXPECT_TRUE(std::equal(gate.begin() + half, gate.end(), got.begin()));
  EXPECT_TRUE(std::equal(up.begin() + half, up.end(), got.begin() + half));
  // down_proj [64, 128]: rank 1 holds columns [64, 128).
  const LoadedParam& down = store.at("model.layers.0.mlp.down_proj.weight");
  ASSERT_EQ(down.shape, (Shape{64, 64}));
  const auto& full_down = raw.tensors.at("language_model.model.layers.0.mlp.down_proj.weight").bytes;
  const auto got_down = bytes_of(down.components[0]);
  for (size_t r = 0; r < 64; ++r) {
    EXPECT_TRUE(
        std::equal(got_down.begin() + r * 128, got_down.begin() + (r + 1) * 128, full_down.begin() + r * 256 + 128))
        << "row " << r;
  }
}

// A tied lm_head reads the embedding: one read feeds two destinations, whole and sliced.
TEST(Loader, TiedLmHeadSharesTheEmbeddingRead) {
  Scratch scratch;
  ModelConfig config = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
  config.tie_word_embeddings = true;
  const auto dir = loadtest::make_checkpoint(scratch / "tied", config);
  const Opened o = open(dir);
  EXPECT_EQ(o.checkpoint.find("language_model.lm_head.weight"), nullptr);
  const LoadPlan plan = LoadPlan::build(o.checkpoint, *o.schema, ParallelMapping::make(2, 1));
  size_t embed_reads = 0;
  for (const auto& r : plan.reads()) embed_reads += r.key == "language_model.model.embed_tokens.weight";
  EXPECT_EQ(embed_reads, 1u);
  const ParamStore store = load_params(o.checkpoint, *o.schema, ParallelMapping::make(2, 1), quiet(16 << 10, 2));
  const auto embed = bytes_of(store.at("model.embed_tokens.weight").components[0]);
  const auto head = bytes_of(store.at("lm_head.weight").components[0]);
  ASSERT_EQ(embed.size(), 512u * 64 * 2);
  ASSERT_EQ(head.size(), embed.size() / 2);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), embed.begin() + static_cast<std::ptrdiff_t>(head.size())));
}

TEST(Loader, StagingStaysWithinItsBudget) {
  Scratch scratch;
  const ModelConfig config = tiny_config(ModelFamily::kKimiK3);  // 6.5 MB; the embedding alone is 512 KiB
  const auto dir = loadtest::make_checkpoint(scratch / "k3", config, 2 << 20);
  const Opened o = open(dir);
  const ParamStore reference = load_params(o.checkpoint, *o.schema, ParallelMapping{}, quiet());
  const LoadPlan plan = LoadPlan::build(o.checkpoint, *o.schema, ParallelMapping{});
  for (uint64_t budget : {uint64_t{64} << 10, uint64_t{200} << 10}) {
    ParamStoreTarget target;
    const LoadStats stats = execute_plan(plan, target, quiet(budget, 3));
    EXPECT_LE(stats.read.peak_staging_bytes, budget);
    EXPECT_GT(stats.read.peak_staging_bytes, 0u);
    EXPECT_GT(plan.read_bytes(), 30 * budget);
    EXPECT_EQ(stats.read.range_bytes, plan.read_bytes());
    EXPECT_GT(stats.read.preads, plan.read_bytes() / stats.read.buffer_bytes);  // large tensors came in pieces
    expect_same_store(target.take(), reference);
  }
}

// A target that says its writes are asynchronous: the engine must fence a staging buffer before refilling it.
class AsyncTarget : public ParamStoreTarget {
 public:
  bool writes_async() const override { return true; }
  void write(const StagedWrite& w) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (w.staging_slot >= 0) pending_.insert(w.staging_slot);
    }
    ParamStoreTarget::write(w);
  }
  void fence(int slot) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(slot);
    ++fences;
  }
  std::mutex mutex_;
  std::set<int> pending_;
  int fences = 0;
};

TEST(Loader, AsynchronousTargetsAreFencedBeforeBuffersAreReused) {
  const Opened o = open(testdata("k3-tiny"));
  const ParamStore reference = load_params(o.checkpoint, *o.schema, ParallelMapping{}, quiet());
  const LoadPlan plan = LoadPlan::build(o.checkpoint, *o.schema, ParallelMapping{});
  AsyncTarget target;
  const LoadStats stats = execute_plan(plan, target, quiet(64 << 10, 2));
  EXPECT_LE(stats.read.peak_staging_bytes, uint64_t{64} << 10);
  EXPECT_GT(target.fences, 0);
  EXPECT_TRUE(target.pending_.empty());  // all fenced before the buffers were freed
  expect_same_store(target.take(), reference);
}

// --- The read engine under the loader. ---

// Records every piece; checks that pieces of a range arrive in order and cover it exactly once.
class PieceLog : public io::ReadSink {
 public:
  void consume(const io::Piece& p) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& got = received[p.id];
    EXPECT_EQ(p.range_offset, got.size()) << "range " << p.id << " out of order";
    got.insert(got.end(), p.data, p.data + p.size);
  }
  std::mutex mutex_;
  std::map<uint64_t, std::vector<uint8_t>> received;
};

TEST(ReadEngine, CoalescesNearbyRangesAndSplitsLongOnes) {
  Scratch scratch;
  std::vector<uint8_t> bytes(100000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + i / 251);
  io::SafetensorsWriter w;
  w.add("blob", DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes);
  w.write(scratch / "f.safetensors");
  const auto file = io::SafetensorsFile::open(scratch / "f.safetensors");
  const uint64_t base = file.data_offset();
  // Two ranges 100 bytes apart (one pread), one 50000 bytes further (its own), one of 20000 bytes (split).
  io::FileRanges fr{&file,
                    {{base + 0, 1000, 0},
                     {base + 1100, 900, 1},
                     {base + 52000, 8000, 2},
                     {base + 70000, 20000, 3},
                     {base + 95000, 0, 4}}};
  io::ReadOptions o;
  o.staging_bytes = 8192;
  o.max_gap_bytes = 4096;
  o.io_threads = 2;
  PieceLog log;
  const io::ReadStats stats = io::read_ranges(std::span(&fr, 1), log, o);
  EXPECT_EQ(stats.buffer_bytes, 8192u);
  EXPECT_EQ(stats.range_bytes, 1000u + 900 + 8000 + 20000);
  EXPECT_EQ(stats.bytes_read, stats.range_bytes + 100);  // the 100-byte gap was read and dropped
  EXPECT_EQ(stats.preads, 1u + 1 + 3);                   // [0, 2000) | 8000 | 20000 in 8 KiB pieces
  EXPECT_LE(stats.peak_staging_bytes, 8192u);
  for (const auto& r : fr.ranges) {
    if (r.length == 0) continue;
    const std::vector<uint8_t> want(bytes.begin() + static_cast<std::ptrdiff_t>(r.offset - base),
                                    bytes.begin() + static_cast<std::ptrdiff_t>(r.offset - base + r.length));
    EXPECT_TRUE(log.received[r.id] == want) << "range " << r.id;
  }
  // Ranges must be ordered, apart, and inside the file.
  io::FileRanges bad{&file, {{base + 10, 100, 0}, {base + 50, 10, 1}}};
  EXPECT_THAT(error_of([&] { io::read_ranges(std::span(&bad, 1), log, o); }), HasSubstr("overlap or are out of order"));
  bad.ranges = {{base + 99990, 100, 0}};
  EXPECT_THAT(error_of([&] { io::read_ranges(std::span(&bad, 1), log, o); }), HasSubstr("lies outside the"));
  o.staging_bytes = 100;
  EXPECT_THAT(error_of([&] { io::read_ranges(std::span(&fr, 1), log, o); }), HasSubstr("too small"));
}

TEST(ReadEngine, ASinkErrorStopsEveryThreadAndIsRethrown) {
  const Opened o = open(testdata("k3-tiny"));
  const LoadPlan plan = LoadPlan::build(o.checkpoint, *o.schema, ParallelMapping{});
  struct Failing : io::ReadSink {
    void consume(const io::Piece&) override {
      if (++calls == 5) fail("sink gave up");
    }
    std::atomic<int> calls{0};
  } sink;
  io::ReadOptions ro;
  ro.staging_bytes = 64 << 10;
  const auto files = plan.file_ranges();
  EXPECT_THAT(error_of([&] { io::read_ranges(files, sink, ro); }), HasSubstr("sink gave up"));
  EXPECT_LT(sink.calls.load(), static_cast<int>(plan.reads().size()));
}

// --- Faults: each a clear error naming the file or tensor, and nothing half-loaded. ---

class LoaderFault : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = tiny_config(ModelFamily::kKimiK3, loadtest::small_k3_dims());
    good_ = loadtest::read_raw(loadtest::make_checkpoint(scratch_ / "good", config_));
  }
  std::filesystem::path write(const std::string& name, const loadtest::RawCheckpoint& raw,
                              const std::map<std::string, std::string>& extra_index = {}) {
    loadtest::write_raw(scratch_ / name, raw, extra_index);
    return scratch_ / name;
  }
  std::string load_error(const std::filesystem::path& dir) {
    return error_of([&] { load_model(dir, ParallelMapping{}, quiet()); });
  }

  Scratch scratch_;
  ModelConfig config_;
  loadtest::RawCheckpoint good_;
  const std::string q_ = "language_model.model.layers.1.self_attn.q_proj.weight";
  const std::string a_log_ = "language_model.model.layers.0.self_attn.A_log";
};

TEST_F(LoaderFault, TruncatedShard) {
  const auto dir = write("trunc", good_);
  const std::string shard = good_.shard_of.at(q_);
  std::filesystem::resize_file(dir / shard, std::filesystem::file_size(dir / shard) - 100);
  EXPECT_THAT(load_error(dir), HasSubstr(shard));
}

TEST_F(LoaderFault, ShardTruncatedAfterOpenIsAShortRead) {
  const auto dir = write("short", good_);
  const Opened o = open(dir);
  const std::string shard = good_.shard_of.at(q_);
  std::filesystem::resize_file(dir / shard, std::filesystem::file_size(dir / shard) / 2);
  RecordingTarget target;
  try {
    load_into(target, o.checkpoint, *o.schema, ParallelMapping{}, quiet());
    FAIL() << "no error";
  } catch (const io::SafetensorsError& e) {
    EXPECT_EQ(e.kind(), io::SafetensorsError::Kind::kTruncated);
    EXPECT_THAT(e.what(), HasSubstr(shard));
    EXPECT_THAT(e.tensor(), HasSubstr("language_model.model.")) << "names a tensor the read was for: " << e.what();
  }
  EXPECT_EQ(target.abandons, 1);
  EXPECT_EQ(target.finishes, 0);
  EXPECT_EQ(target.take().size(), 0u);
}

// A shard rewritten in place (its size kept) between the open and the read: the load is refused as a whole, naming
// the shard, rather than loading weights that may mix two versions.
TEST_F(LoaderFault, ShardRewrittenInPlaceAfterOpenIsRefused) {
  const auto dir = write("rewritten", good_);
  const Opened o = open(dir);
  const std::string shard = good_.shard_of.at(q_);
  const auto path = dir / shard;
  const auto size = std::filesystem::file_size(path);
  const auto written = std::filesystem::last_write_time(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 1));
    f.put('\x7f');
  }
  std::filesystem::last_write_time(path, written + std::chrono::seconds(2));
  ASSERT_EQ(std::filesystem::file_size(path), size);
  RecordingTarget target;
  try {
    load_into(target, o.checkpoint, *o.schema, ParallelMapping{}, quiet());
    FAIL() << "no error";
  } catch (const io::SafetensorsError& e) {
    EXPECT_EQ(e.kind(), io::SafetensorsError::Kind::kChanged);
    EXPECT_THAT(e.what(), HasSubstr(shard));
  }
  EXPECT_EQ(target.abandons, 1);
  EXPECT_EQ(target.finishes, 0);
  EXPECT_EQ(target.take().size(), 0u);
}

TEST_F(LoaderFault, CorruptedHeader) {
  const auto dir = write("header", good_);
  const std::string shard = good_.shard_of.at(q_);
  std::fstream f(dir / shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.put('[');
  f.close();
  EXPECT_THAT(load_error(dir), HasSubstr(shard));
}

// A target's own error (a failed device copy) cannot say what it was copying: the loader names the shard and
// the tensor.
TEST_F(LoaderFault, AFailingWriteNamesTheShardAndTensor) {
  const Opened o = open(write("write", good_));
  struct Failing : ParamStoreTarget {
    void write(const StagedWrite&) override { fail("copy engine on fire"); }
  } target;
  const std::string error = error_of([&] { load_into(target, o.checkpoint, *o.schema, ParallelMapping{}, quiet()); });
  EXPECT_THAT(error, HasSubstr("copy engine on fire"));
  bool named = false;
  for (const auto& [key, shard] : good_.shard_of)
    named = named || error.find(shard + ": " + key + ": ") != std::string::npos;
  EXPECT_TRUE(named) << error;
  EXPECT_EQ(target.take().size(), 0u);
}

TEST_F(LoaderFault, MissingKey) {
  auto raw = good_;
  raw.tensors.erase(q_);
  EXPECT_THAT(load_error(write("missing", raw)), HasSubstr("1 tensor(s) that this rank (tp 0/1, ep 0/1, moe_tp 1, "
                                                           "attention-DP off) needs are missing from the checkpoint: " +
                                                           q_));
}

TEST_F(LoaderFault, WrongShape) {
  auto raw = good_;
  raw.tensors[q_].shape = {64, 32};
  raw.tensors[q_].bytes.resize(64 * 32 * 2);
  EXPECT_THAT(load_error(write("shape", raw)), HasSubstr(q_ + ": shape [64, 32] != expected [64, 64]"));
}

TEST_F(LoaderFault, WrongDtype) {
  auto raw = good_;
  raw.tensors[q_].dtype = DType::kI16;
  EXPECT_THAT(load_error(write("dtype", raw)), HasSubstr(q_ + " is I16 with no scales"));
  const std::string norm = "language_model.model.norm.weight";
  raw = good_;
  raw.tensors[norm].dtype = DType::kU16;
  EXPECT_THAT(load_error(write("dtype2", raw)), HasSubstr(norm));
}

TEST_F(LoaderFault, Fp8WeightWithoutScale) {
  auto raw = good_;
  raw.tensors[q_].dtype = DType::kF8E4M3;
  raw.tensors[q_].bytes.resize(64 * 64);
  const std::string e = load_error(write("fp8", raw));
  EXPECT_THAT(e, HasSubstr(q_ + " is F8_E4M3 but has no block scale (language_model.model.layers.1.self_attn.q_proj."
                                "weight_scale_inv or language_model.model.layers.1.self_attn.q_proj.weight_scale): "
                                "refusing to load it as if it were unquantized"));
  EXPECT_THAT(e, HasSubstr(good_.shard_of.at(q_) + ": ")) << "names the shard";
}

// Turns the float weight `base`.weight of `raw` into FP8 (every value 1.0) with an F32 weight_scale_inv of ones.
void make_fp8(loadtest::RawCheckpoint& raw, const std::string& base) {
  loadtest::RawTensor& w = raw.tensors.at(base + ".weight");
  ASSERT_EQ(w.shape.size(), 2u);
  w.dtype = DType::kF8E4M3;
  w.bytes.assign(static_cast<size_t>(w.shape[0] * w.shape[1]), 0x38);  // 1.0 in E4M3
  const Shape scale_shape = {(w.shape[0] + 127) / 128, (w.shape[1] + 127) / 128};
  const float one = 1.0f;
  std::vector<uint8_t> scale(static_cast<size_t>(scale_shape[0] * scale_shape[1]) * sizeof(float));
  for (size_t i = 0; i < scale.size(); i += sizeof(float)) std::memcpy(scale.data() + i, &one, sizeof one);
  raw.tensors[base + ".weight_scale_inv"] = loadtest::RawTensor{DType::kF32, scale_shape, scale};
  raw.shard_of[base + ".weight_scale_inv"] = raw.shard_of.at(base + ".weight");
}

// A quantized gate/up pair with one half missing: the error lists the missing half's tensors (weight and
// block scale), not a format mismatch between the halves. Either half.
TEST_F(LoaderFault, MissingHalfOfAnFp8GateUpPairIsNamed) {
  const std::string mlp = "language_model.model.layers.0.mlp.";
  auto fp8 = good_;
  for (const char* half : {"gate_proj", "up_proj"}) make_fp8(fp8, mlp + half);
  EXPECT_EQ(load_error(write("fp8-pair", fp8)), "(no error)") << "the FP8 pair itself loads";
  for (const char* gone : {"gate_proj", "up_proj"}) {
    auto raw = fp8;
    for (const char* suffix : {".weight", ".weight_scale_inv"}) {
      raw.tensors.erase(mlp + gone + suffix);
      raw.shard_of.erase(mlp + gone + suffix);
    }
    const std::string e = load_error(write(std::string("fp8-no-") + gone, raw));
    EXPECT_THAT(e, HasSubstr("2 tensor(s) that this rank")) << gone;
    EXPECT_THAT(e, HasSubstr(mlp + gone + ".weight")) << gone;
    EXPECT_THAT(e, HasSubstr(mlp + gone + ".weight_scale_inv")) << gone;
  }
}

// A block scale that decodes to NaN would make its whole group or block of weights NaN, silently (a negative
// one flip its signs): refused, naming the tensor, the scale's place and its code; nothing reaches the ParamStore.
// MXFP4 (E8M0 0xFF, checked piece by piece as the bytes pass) and FP8 (an F32 NaN or infinity, checked on the whole
// tensor).
TEST_F(LoaderFault, NanBlockScalesAreRefusedAndNamed) {
  std::string mx;
  for (const auto& [key, t] : good_.tensors) {
    if (key.ends_with(".weight_scale") && (t.dtype == DType::kU8 || t.dtype == DType::kF8E8M0)) mx = key;
  }
  ASSERT_FALSE(mx.empty()) << "the tiny K3 has MXFP4 experts";
  auto raw = good_;
  const int64_t cols = raw.tensors.at(mx).shape.at(1);
  raw.tensors.at(mx).bytes.at(static_cast<size_t>(cols + 1)) = 0xFF;
  const std::string fp8_base = "language_model.model.layers.0.mlp.down_proj";
  auto fp8 = good_;
  make_fp8(fp8, fp8_base);
  EXPECT_EQ(load_error(write("fp8-ok", fp8)), "(no error)");
  std::vector<std::pair<loadtest::RawCheckpoint, std::string>> cases = {
      {raw, fmt::format("{}: block scale {} (row 1, column 1) decodes to NaN ({} code 0xff): every weight it scales "
                        "would be so",
                        mx, cols + 1, dtype_name(raw.tensors.at(mx).dtype))}};
  for (const float bad : {std::nanf(""), -INFINITY}) {
    auto f = fp8;
    std::memcpy(f.tensors.at(fp8_base + ".weight_scale_inv").bytes.data(), &bad, sizeof bad);
    cases.emplace_back(f, fmt::format("{}.weight_scale_inv: block scale 0 (row 0, column 0) decodes to NaN or "
                                      "infinity (F32 {})",
                                      fp8_base, bad));
  }
  {
    // Scales so large that their weights overflow float: E8M0 2^127, an F32 of 1e37 (times 448).
    auto big = good_;
    big.tensors.at(mx).bytes.at(static_cast<size_t>(cols + 1)) = 0xFE;
    cases.emplace_back(big, fmt::format("{}: block scale {} (row 1, column 1) decodes to 2^127, so large that E2M1 "
                                        "values (up to 6) overflow ({} code 0xfe): every weight it scales would be "
                                        "infinite where large",
                                        mx, cols + 1, dtype_name(raw.tensors.at(mx).dtype)));
    auto f = fp8;
    const float huge = 1e37f;
    std::memcpy(f.tensors.at(fp8_base + ".weight_scale_inv").bytes.data(), &huge, sizeof huge);
    cases.emplace_back(f, fmt::format("{}.weight_scale_inv: block scale 0 (row 0, column 0) decodes to a number so "
                                      "large that E4M3 weights (up to 448) overflow (F32 {})",
                                      fp8_base, static_cast<double>(huge)));
  }
  {
    // A negative scale: no quantizer writes one, and it would flip its block's signs silently.
    auto f = fp8;
    const float bad = -0.5f;
    std::memcpy(f.tensors.at(fp8_base + ".weight_scale_inv").bytes.data(), &bad, sizeof bad);
    cases.emplace_back(f, fmt::format("{}.weight_scale_inv: block scale 0 (row 0, column 0) decodes to a negative "
                                      "number (F32 -0.5): every weight it scales would be sign-flipped",
                                      fp8_base));
  }
  int n = 0;
  for (const auto& [bad, want] : cases) {
    const Opened o = open(write("nan-scale-" + std::to_string(n++), bad));
    RecordingTarget target;
    const std::string e = error_of([&] { load_into(target, o.checkpoint, *o.schema, ParallelMapping{}, quiet()); });
    EXPECT_THAT(e, HasSubstr(want));
    EXPECT_EQ(target.abandons, 1) << e;
    EXPECT_EQ(target.finishes, 0) << e;
    EXPECT_EQ(target.take().size(), 0u);
  }
}

// E8M0 code 0x00 (2^-127 or zero, readers differ): loaded, and counted.
TEST_F(LoaderFault, E8m0ZeroScalesAreCounted) {
  auto raw = good_;
  int64_t zeros_before = 0;
  std::string mx;
  for (auto& [key, t] : raw.tensors) {
    if (!key.ends_with(".weight_scale") || !(t.dtype == DType::kU8 || t.dtype == DType::kF8E8M0)) continue;
    zeros_before += std::count(t.bytes.begin(), t.bytes.end(), uint8_t{0});
    mx = key;
  }
  ASSERT_FALSE(mx.empty());
  auto& bytes = raw.tensors.at(mx).bytes;
  const int64_t zeros_there = std::count(bytes.begin(), bytes.end(), uint8_t{0});
  for (size_t i : {size_t{0}, size_t{3}, bytes.size() - 1}) bytes.at(i) = 0;
  const int64_t added = std::count(bytes.begin(), bytes.end(), uint8_t{0}) - zeros_there;
  ASSERT_GT(added, 0);
  const Opened o = open(write("zero-scale", raw));
  const LoadPlan plan = LoadPlan::build(o.checkpoint, *o.schema, ParallelMapping{});
  ParamStoreTarget target;
  const LoadStats stats = execute_plan(plan, target, quiet(64 << 10, 2));
  EXPECT_EQ(stats.e8m0_zero_scales, static_cast<uint64_t>(zeros_before + added));
}

TEST_F(LoaderFault, NonZeroALogPadding) {
  auto raw = good_;
  const float one = 1.0f;
  std::memcpy(raw.tensors[a_log_].bytes.data() + 10 * sizeof(float), &one, sizeof one);
  const auto dir = write("alog", raw);
  const Opened o = open(dir);
  RecordingTarget target;
  const std::string e = error_of([&] { load_into(target, o.checkpoint, *o.schema, ParallelMapping{}, quiet()); });
  EXPECT_THAT(e, HasSubstr(a_log_ + ": padding entry 10 is 1 (entries past num_heads (4) must be exactly zero)"));
  EXPECT_THAT(e, HasSubstr(good_.shard_of.at(a_log_)));
  EXPECT_EQ(target.begins, 1);  // found while reading: the target is dropped, not finished
  EXPECT_EQ(target.abandons, 1);
  EXPECT_EQ(target.finishes, 0);
  EXPECT_EQ(target.take().size(), 0u);
}

TEST_F(LoaderFault, IndexNamingAMissingFile) {
  const auto dir = write("index", good_, {{"language_model.model.extra.weight", "model-00099-of-00099.safetensors"}});
  EXPECT_THAT(load_error(dir), HasSubstr("model-00099-of-00099.safetensors"));
}

TEST_F(LoaderFault, PlanErrorsNeverTouchTheTarget) {
  auto raw = good_;
  raw.tensors.erase(q_);
  const auto dir = write("missing", raw);
  const io::Checkpoint c = io::Checkpoint::open(dir);
  const Schema schema(config_, default_layout(config_));
  RecordingTarget target;
  EXPECT_THAT(error_of([&] { load_into(target, c, schema, ParallelMapping{}, quiet()); }), HasSubstr(q_));
  EXPECT_EQ(target.begins, 0);
}

// --- The protocol object on its own. ---

TEST(ExpertStream, FinalizesEachLayerOnceAfterItsLastSlot) {
  std::vector<ExpertSlot> slots = {{3, 0, 0, 10, {}}, {3, 1, 1, 20, {}}, {5, 0, 4, 5, {}}};
  struct Counting : LoadTarget {
    void begin(const LoadPlan&) override {}
    void write(const StagedWrite&) override {}
    void prepare_layer(int32_t l) override { calls.push_back("prepare " + std::to_string(l)); }
    void slot_loaded(const ExpertSlot& s) override { calls.push_back("slot " + std::to_string(s.expert)); }
    void finalize_layer(int32_t l) override { calls.push_back("finalize " + std::to_string(l)); }
    void finish() override {}
    void abandon() noexcept override {}
    std::vector<std::string> calls;
  } target;
  ExpertStream stream(slots, target);
  stream.arriving(1);
  stream.landed(1, 15);
  stream.arriving(0);
  stream.landed(0, 10);
  EXPECT_THAT(error_of([&] { stream.check_complete(); }),
              HasSubstr("layer 3: 1 of 2 expert slot(s) never completed: 1 (expert 1); layer 5: 1 of 1"));
  stream.landed(1, 5);
  stream.arriving(2);
  stream.landed(2, 5);
  stream.check_complete();
  EXPECT_EQ(target.calls, (std::vector<std::string>{"prepare 3", "slot 0", "slot 1", "finalize 3", "prepare 5",
                                                    "slot 4", "finalize 5"}));
  EXPECT_THAT(error_of([&] { stream.landed(2, 1); }), HasSubstr("layer 5 expert 4 (slot 0): 1 more bytes landed"));
}

}  // namespace
}  // namespace kimirt::model
