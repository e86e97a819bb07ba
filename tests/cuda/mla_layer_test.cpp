// The composed MLA mixer (projections + cache + attention + W_UV + gate + o_proj) against the CPU
// reference kimirt::cpu::mla_forward on the same bf16-rounded weights, inputs and cached rows. The GPU
// path rounds to bf16 after every projection (q_lat, q, q_abs, ō, o, gate): about six roundings in a row,
// within the ops' 1e-2.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/cpu/mla.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/mla_cache.h"
#include "kimirt/cuda/mla_decode.h"
#include "kimirt/cuda/mla_layer.h"
#include "kimirt/cuda/stream.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

// Captures capture() on `stream` as a CUDA graph, replays it once and waits for it.
template <typename F>
void replay_once(Stream& stream, F capture) {
  const test::CapturedGraph graph(stream, capture);
  graph.launch();
  stream.synchronize();
}

struct Weight {
  std::vector<float> host;
  DeviceBuffer dev;
  Weight(int64_t rows, int64_t cols, uint32_t seed, float lo, float hi) {
    host = test::random_vec(rows * cols, seed, lo, hi);
    dev = upload(test::to_bf16(host));
  }
  const __nv_bfloat16* d() const { return dev.as<__nv_bfloat16>(); }
};

struct MlaSetup {
  explicit MlaSetup(int64_t hidden_ = 1024, int64_t heads_ = 8) : hidden(hidden_), heads(heads_) {}
  int64_t hidden = 1024, heads = 8, q_lora = 1536;
  Weight q_a{q_lora, hidden, 1, -0.05f, 0.05f}, q_a_norm{1, q_lora, 2, 0.5f, 1.5f},
      q_b{heads * 192, q_lora, 3, -0.03f, 0.03f}, kv_a{576, hidden, 4, -0.05f, 0.05f}, kv_a_norm{1, 512, 5, 0.5f, 1.5f},
      kv_b{heads * 256, 512, 6, -0.06f, 0.06f}, g{heads * 128, hidden, 7, -0.05f, 0.05f},
      o{hidden, heads * 128, 8, -0.03f, 0.03f};
  cpu::MlaDims cdims() const {
    cpu::MlaDims d;
    d.hidden = hidden, d.num_heads = heads, d.q_lora_rank = q_lora, d.kv_lora_rank = 512, d.qk_nope_head_dim = 128,
    d.qk_rope_head_dim = 64, d.v_head_dim = 128, d.output_gate = true, d.latent_norm_eps = 1e-6f;
    return d;
  }
  cpu::MlaWeights cweights() const {
    cpu::MlaWeights w;
    w.q_a_proj = q_a.host.data(), w.q_a_norm = q_a_norm.host.data(), w.q_b_proj = q_b.host.data(),
    w.kv_a_proj = kv_a.host.data(), w.kv_a_norm = kv_a_norm.host.data(), w.kv_b_proj = kv_b.host.data(),
    w.g_proj = g.host.data(), w.o_proj = o.host.data();
    return w;
  }
  MlaLayerDims gdims() const { return MlaLayerDims{hidden, heads, q_lora, true, 1e-6f}; }
  MlaLayerWeights gweights() const {
    MlaLayerWeights w;
    w.q_a_proj = q_a.d(), w.q_a_norm = q_a_norm.d(), w.q_b_proj = q_b.d(), w.kv_a_proj = kv_a.d(),
    w.kv_a_norm = kv_a_norm.d(), w.kv_b_proj = kv_b.d(), w.g_proj = g.d(), w.o_proj = o.d();
    return w;
  }
};

// Cache of batch · per_seq pages of 64 rows; sequence b owns pages [b·per_seq, (b+1)·per_seq) in order.
struct Cache {
  static constexpr int kPage = 64;
  int per_seq, batch;
  std::vector<float> host;
  DeviceBuffer dev, table;
  Cache(int batch_, int per_seq_, uint32_t seed) : per_seq(per_seq_), batch(batch_) {
    host = test::random_vec(size_t(batch) * per_seq * kPage * 576, seed, -1.5f, 1.5f);
    dev = upload(test::to_bf16(host));
    std::vector<int32_t> t(batch * per_seq);
    for (int i = 0; i < batch * per_seq; ++i) t[i] = i;
    table = upload(t);
  }
  MlaCacheView view() const {
    return MlaCacheView{dev.as<__nv_bfloat16>(), kPage, table.as<int32_t>(), per_seq, int64_t{batch} * per_seq};
  }
  const float* rows(int b) const { return host.data() + size_t(b) * per_seq * kPage * 576; }
  int slot(int b, int pos) const { return b * per_seq * kPage + pos; }
};

// A prefill chunk over `cache`: sequence b has cached[b] rows there and fresh[b] new tokens (random hidden states),
// its new rows going to the slots after its cached ones; with the CPU's expanded-path outputs and new latent rows
// per sequence.
struct PrefillChunk {
  struct Host {
    std::vector<int> cached, fresh;
    std::vector<int32_t> cu_q{0}, cu_k{0};
    std::vector<float> x;
    std::vector<std::vector<float>> refs, new_latents;
  } host;
  int64_t tokens = 0;
  DeviceBuffer dx, dcq, dck, ds;
  PrefillChunk(const MlaSetup& s, const Cache& cache, std::vector<int> cached, std::vector<int> fresh, uint32_t seed) {
    host.cached = std::move(cached), host.fresh = std::move(fresh);
    const auto& [c, f, cu_q, cu_k, x, refs, new_latents] = host;
    std::vector<int32_t> slots;
    for (size_t b = 0; b < c.size(); ++b) {
      host.cu_q.push_back(cu_q.back() + f[b]);
      host.cu_k.push_back(cu_k.back() + c[b] + f[b]);
      for (int i = 0; i < f[b]; ++i) slots.push_back(cache.slot(static_cast<int>(b), c[b] + i));
    }
    tokens = cu_q.back();
    host.x = test::random_vec(tokens * s.hidden, seed);
    dx = upload(test::to_bf16(host.x)), dcq = upload(host.cu_q), dck = upload(host.cu_k), ds = upload(slots);
    for (size_t b = 0; b < c.size(); ++b) {
      std::vector<float> ref(f[b] * s.hidden), new_latent(f[b] * 576);
      cpu::mla_forward(s.cdims(), s.cweights(), x.data() + cu_q[b] * s.hidden, f[b],
                       c[b] ? cache.rows(static_cast<int>(b)) : nullptr, c[b], ref.data(), new_latent.data(),
                       cpu::MlaPath::kExpanded);
      host.refs.push_back(std::move(ref));
      host.new_latents.push_back(std::move(new_latent));
    }
  }
};

// The GEMM state of a main stream and of a side stream (each its own Linear and workspaces), and the side
// stream's events: what a two-stream decode step needs (MlaSideStream).
struct TwoStreams {
  DeviceBuffer ws{32 << 20}, sws{8 << 20}, side_ws{32 << 20}, side_sws{8 << 20};
  GemmLt lt{ws.data(), ws.size()}, side_lt{side_ws.data(), side_ws.size()};
  int sms = query_device(0).sm_count;
  Linear linear{lt, sws.data(), sws.size(), sms}, side_linear{side_lt, side_sws.data(), side_sws.size(), sms};
  Stream stream, side_stream;
  Event fork, kv_ready, gate_ready;
  // The step's scratch and both split-K workspaces as NaN, queued on the main stream (the step forks the side
  // stream from it, so the side stream's work follows the poison too).
  void poison_scratch(DeviceArena& arena) {
    test::poison_free_step(arena, stream);
    poison(sws.data(), sws.size(), stream);
    poison(side_sws.data(), side_sws.size(), stream);
  }
  MlaSideStream side(int gate_sms = kMlaGateSmsAuto) {
    return MlaSideStream{side_stream, &side_linear, fork.get(), kv_ready.get(), gate_ready.get(), gate_sms};
  }
};

TEST(MlaLayer, DecodeStepMatchesCpuAbsorbedPath) {
  KIMIRT_REQUIRE_GPU();
  // A small hidden size, and K3's (7168: the projections at the shapes, and so the GEMM paths, of the model).
  for (const int64_t hidden : {int64_t{1024}, int64_t{7168}}) {
    SCOPED_TRACE(testing::Message() << "hidden " << hidden);
    MlaSetup s(hidden, 8);
    const std::vector<int> ctx = {70, 130, 0};
    const int batch = ctx.size();
    Cache cache(batch, 3, 11);
    std::vector<float> x = test::random_vec(batch * s.hidden, 12);
    DeviceBuffer dx = upload(test::to_bf16(x));
    std::vector<int32_t> slots, lens;
    for (int b = 0; b < batch; ++b) slots.push_back(cache.slot(b, ctx[b])), lens.push_back(ctx[b] + 1);
    DeviceBuffer ds = upload(slots), dl = upload(lens);
    DeviceArena arena(0, 256 << 20);
    DeviceBuffer ws(32 << 20), sws(8 << 20);
    GemmLt lt(ws.data(), ws.size());
    const int sms = query_device(0).sm_count;
    Linear linear(lt, sws.data(), sws.size(), sms);
    DeviceBuffer w_uk_t(s.heads * 512 * 128 * 2);
    mla_transpose_uk(nullptr, s.kv_b.d(), s.heads, w_uk_t.as<__nv_bfloat16>());
    for (int skinny_absorb = 0; skinny_absorb < 2; ++skinny_absorb) {
      // The cache as it was: the append check below must see this run's rows, not the previous run's.
      cache.dev = upload(test::to_bf16(cache.host));
      MlaLayerWeights gw = s.gweights();
      if (skinny_absorb) gw.w_uk_t = w_uk_t.as<__nv_bfloat16>();
      DeviceBuffer out = test::poisoned(batch * s.hidden * 2);
      test::poison_free_step(arena, nullptr);
      poison(sws.data(), sws.size(), nullptr);
      mla_decode_step(linear, arena, nullptr, s.gdims(), gw, cache.view(), dx.as<__nv_bfloat16>(), batch,
                      ds.as<int32_t>(), dl.as<int32_t>(), 131, out.as<__nv_bfloat16>());
      const auto got = test::from_bf16(download<uint16_t>(out.data(), batch * s.hidden));
      const auto cache_after = test::from_bf16(download<uint16_t>(cache.dev.data(), cache.host.size()));
      SCOPED_TRACE(skinny_absorb ? "absorption through w_uk_t (skinny)" : "absorption through kv_b (cuBLASLt)");
      for (int b = 0; b < batch; ++b) {
        std::vector<float> ref(s.hidden), new_latent(576);
        cpu::mla_forward(s.cdims(), s.cweights(), x.data() + b * s.hidden, 1, ctx[b] ? cache.rows(b) : nullptr, ctx[b],
                         ref.data(), new_latent.data(), cpu::MlaPath::kAbsorbed);
        EXPECT_LE(test::rel_err(test::part(got, b * s.hidden, s.hidden), ref), 1e-2)
            << "sequence " << b << " context " << ctx[b];
        EXPECT_LE(test::rel_err(test::part(cache_after, int64_t{slots[b]} * 576, 576), new_latent), 1e-2)
            << "appended latent of sequence " << b;
      }
    }
    EXPECT_EQ(arena.step_used(), 0u) << "scratch released";
  }
}

// One pass over the whole context, and passes over the cached rows merged by their lse (max_expanded_keys):
// the 220 cached rows of the three sequences laid end to end (150 of sequence 0, none of sequence 1, 70 of
// sequence 2) take four passes of 59 keys (the third straddles sequences 0 and 2) or two of 200; then the
// default, sized by the step region: an arena too small for one pass, and one too small for any.
TEST(MlaLayer, ChunkedPrefillMatchesCpuExpandedPath) {
  KIMIRT_REQUIRE_GPU();
  MlaSetup s;
  const int batch = 3;
  Cache cache(batch, 4, 21);
  const PrefillChunk chunk(s, cache, {150, 0, 70}, {30, 20, 9}, 22);
  const auto& [cached, fresh, cu_q, cu_k, x, refs, new_latents] = chunk.host;
  const int64_t tokens = chunk.tokens;
  const DeviceBuffer &dx = chunk.dx, &dcq = chunk.dcq, &dck = chunk.dck, &ds = chunk.ds;
  DeviceArena arena(0, 256 << 20);
  DeviceBuffer ws(32 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  // Every call appends the same rows to the same slots, so the cache the next one reads is the same.
  // The split-K workspace NaN before every call, and the step region's free bytes too except in `first` (its
  // high-water mark is measured; the same one-pass call then runs over NaN scratch in `arena`).
  const auto run = [&](DeviceArena& on, int64_t max_keys, bool gate = true, bool poison_scratch = true) {
    SCOPED_TRACE("max_expanded_keys " + std::to_string(max_keys) + ", step region " +
                 std::to_string(on.step_capacity()) + (gate ? "" : ", no output gate"));
    MlaLayerDims dims = s.gdims();
    dims.output_gate = gate;
    DeviceBuffer out = test::poisoned(tokens * s.hidden * 2);
    if (poison_scratch) test::poison_free_step(on, nullptr);
    poison(sws.data(), sws.size(), nullptr);
    mla_prefill_step(linear, on, nullptr, dims, s.gweights(), cache.view(), dx.as<__nv_bfloat16>(), tokens, batch,
                     dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), 30, 180, ds.as<int32_t>(),
                     out.as<__nv_bfloat16>(), false, max_keys);
    const auto got = test::from_bf16(download<uint16_t>(out.data(), tokens * s.hidden));
    for (int b = 0; b < batch; ++b) {
      std::vector<float> ref = refs[b];
      if (!gate) {
        cpu::MlaDims cd = s.cdims();
        cd.output_gate = false;
        std::vector<float> new_latent(fresh[b] * 576);
        cpu::mla_forward(cd, s.cweights(), x.data() + cu_q[b] * s.hidden, fresh[b], cached[b] ? cache.rows(b) : nullptr,
                         cached[b], ref.data(), new_latent.data(), cpu::MlaPath::kExpanded);
      }
      EXPECT_LE(test::rel_err(test::part(got, cu_q[b] * s.hidden, (cu_q[b + 1] - cu_q[b]) * s.hidden), ref), 1e-2)
          << "sequence " << b;
    }
    EXPECT_EQ(on.step_used(), 0u) << "scratch released";
  };
  DeviceArena first(0, 256 << 20);
  run(first, 0, true, false);
  // One pass took `one_pass` bytes, of which each context key's latent row, K and V `key_bytes`: a step region
  // a third of the keys short of it has room for passes only (one pass would fail to allocate).
  const uint64_t one_pass = first.step_high_water(), key_bytes = (576 + s.heads * 256) * 2;
  // Passes of 75 keys end exactly where sequence 0's cached rows do (150), beside the empty sequence 1.
  for (const int64_t max_keys : {int64_t{0}, int64_t{59}, int64_t{75}, int64_t{200}}) run(arena, max_keys);
  // Without the output gate: the last merge only normalizes (and one pass has no gate to apply).
  for (const int64_t max_keys : {int64_t{0}, int64_t{59}}) run(arena, max_keys, false);
  // The chunk's rows were appended to the cache (the slots held random rows before the first call).
  const auto cache_after = test::from_bf16(download<uint16_t>(cache.dev.data(), cache.host.size()));
  for (int b = 0; b < batch; ++b) {
    std::vector<float> rows;
    for (int i = 0; i < fresh[b]; ++i) {
      const size_t slot = static_cast<size_t>(cache.slot(b, cached[b] + i));
      rows.insert(rows.end(), cache_after.begin() + slot * 576, cache_after.begin() + (slot + 1) * 576);
    }
    EXPECT_LE(test::rel_err(rows, new_latents[b]), 1e-2) << "appended rows of sequence " << b;
  }
  DeviceArena small(0, one_pass - cu_k.back() / 3 * key_bytes);
  run(small, 0);
  // Room for fewer keys than the chunk has tokens once the passes' buffers are taken: refused after scratch
  // was taken, which is given back.
  DeviceArena tiny(0, one_pass - (cu_k.back() - tokens / 2) * key_bytes);
  DeviceBuffer refused(tokens * s.hidden * 2);
  EXPECT_THROW(mla_prefill_step(linear, tiny, nullptr, s.gdims(), s.gweights(), cache.view(), dx.as<__nv_bfloat16>(),
                                tokens, batch, dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), 30, 180,
                                ds.as<int32_t>(), refused.as<__nv_bfloat16>()),
               kimirt::Error);
  EXPECT_GT(tiny.step_high_water(), 0u) << "the step had taken scratch before it was refused";
  EXPECT_EQ(tiny.step_used(), 0u) << "and gave it back";
  // Fewer keys per pass than the chunk has tokens: its own keys cannot be expanded at once.
  DeviceBuffer out(tokens * s.hidden * 2);
  EXPECT_THROW(mla_prefill_step(linear, arena, nullptr, s.gdims(), s.gweights(), cache.view(), dx.as<__nv_bfloat16>(),
                                tokens, batch, dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), 30, 180,
                                ds.as<int32_t>(), out.as<__nv_bfloat16>(), false, 58),
               kimirt::Error);
  EXPECT_EQ(arena.step_used(), 0u) << "refused before any scratch was taken";
  // Host bounds that could not hold the batch (they size the kernels' grids) are refused, not run short.
  for (const auto& [max_q, max_k] : {std::pair{0, 180}, std::pair{30, 0}, std::pair{19, 180}, std::pair{30, 59}}) {
    EXPECT_THROW(mla_prefill_step(linear, arena, nullptr, s.gdims(), s.gweights(), cache.view(), dx.as<__nv_bfloat16>(),
                                  tokens, batch, dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), max_q, max_k,
                                  ds.as<int32_t>(), out.as<__nv_bfloat16>()),
                 kimirt::Error)
        << "max_q " << max_q << ", max_k " << max_k;
  }
  // A cache view the gather or the attention would refuse is refused before the chunk's rows are written:
  // the cache is as it was. (The cache first back to its rows before any append: the runs above wrote these
  // very rows, so a write now would not change a byte.)
  cache.dev = upload(test::to_bf16(cache.host));
  const auto cache_before = download<uint16_t>(cache.dev.data(), cache.host.size());
  MlaCacheView no_table = cache.view(), misaligned = cache.view(), short_rows = cache.view();
  no_table.block_table = nullptr;
  misaligned.cache += 1;
  short_rows.ld_block_table = 2;  // 128 rows: max_k 180 would look up the next sequence's pages
  for (const auto& [bad, needle] : {std::pair{no_table, "block table null"}, std::pair{misaligned, "not 16-byte"},
                                    std::pair{short_rows, "max_k 180 needs 3 pages of 64 rows"}}) {
    try {
      mla_prefill_step(linear, arena, nullptr, s.gdims(), s.gweights(), bad, dx.as<__nv_bfloat16>(), tokens, batch,
                       dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), 30, 180, ds.as<int32_t>(),
                       out.as<__nv_bfloat16>());
      ADD_FAILURE() << needle << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(download<uint16_t>(cache.dev.data(), cache.host.size()), cache_before) << "the cache was written";
}

// The prefill step at K3's 96 heads per GPU (attention-data-parallel, or one GPU): the projections' widths (q_b
// 18432, kv_b 24576), the expansion of every context key into 96 heads' K and V and the attention's head grid at
// the size the engine runs, in one pass and in passes of 64 keys, against the CPU's expanded path.
TEST(MlaLayer, ChunkedPrefillAtK3HeadsMatchesCpu) {
  KIMIRT_REQUIRE_GPU();
  const MlaSetup s(1024, 96);
  const int batch = 2;
  Cache cache(batch, 3, 31);
  const PrefillChunk chunk(s, cache, {100, 0}, {40, 17}, 32);
  const auto& [cached, fresh, cu_q, cu_k, x, refs, new_latents] = chunk.host;
  const int64_t tokens = chunk.tokens;
  const DeviceBuffer &dx = chunk.dx, &dcq = chunk.dcq, &dck = chunk.dck, &ds = chunk.ds;
  DeviceArena arena(0, 512 << 20);
  DeviceBuffer ws(32 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  for (const int64_t max_keys : {int64_t{0}, int64_t{64}}) {
    SCOPED_TRACE("max_expanded_keys " + std::to_string(max_keys));
    DeviceBuffer out = test::poisoned(tokens * s.hidden * 2);
    test::poison_free_step(arena, nullptr);
    poison(sws.data(), sws.size(), nullptr);
    mla_prefill_step(linear, arena, nullptr, s.gdims(), s.gweights(), cache.view(), dx.as<__nv_bfloat16>(), tokens,
                     batch, dcq.as<int32_t>(), dck.as<int32_t>(), cu_k.back(), 40, 140, ds.as<int32_t>(),
                     out.as<__nv_bfloat16>(), false, max_keys);
    const auto got = test::from_bf16(download<uint16_t>(out.data(), tokens * s.hidden));
    for (int b = 0; b < batch; ++b) {
      EXPECT_LE(test::rel_err(test::part(got, cu_q[b] * s.hidden, fresh[b] * s.hidden), refs[b]), 1e-2)
          << "sequence " << b;
    }
    EXPECT_EQ(arena.step_used(), 0u) << "scratch released";
  }
}

// The decode step is meant to be captured in a CUDA graph: no allocation or synchronization inside, every
// pointer fixed. A captured replay must give the eager result bit for bit.
TEST(MlaLayer, DecodeStepReplaysFromACudaGraph) {
  KIMIRT_REQUIRE_GPU();
  MlaSetup s;
  const int batch = 2;
  Cache cache(batch, 2, 31);
  std::vector<float> x = test::random_vec(batch * s.hidden, 32);
  DeviceBuffer dx = upload(test::to_bf16(x));
  const std::vector<int32_t> slots = {cache.slot(0, 50), cache.slot(1, 90)}, lens = {51, 91};
  DeviceBuffer ds = upload(slots), dl = upload(lens);
  DeviceArena arena(0, 64 << 20);
  DeviceBuffer w_uk_t(s.heads * 512 * 128 * 2);
  mla_transpose_uk(nullptr, s.kv_b.d(), s.heads, w_uk_t.as<__nv_bfloat16>());
  MlaLayerWeights gw = s.gweights();
  gw.w_uk_t = w_uk_t.as<__nv_bfloat16>();
  TwoStreams t;
  Linear& linear = t.linear;
  Stream& stream = t.stream;
  DeviceBuffer eager = test::poisoned(batch * s.hidden * 2), replay = test::poisoned(batch * s.hidden * 2);
  auto step = [&](DeviceBuffer& out) {
    mla_decode_step(linear, arena, stream, s.gdims(), gw, cache.view(), dx.as<__nv_bfloat16>(), batch, ds.as<int32_t>(),
                    dl.as<int32_t>(), 91, out.as<__nv_bfloat16>());
  };
  step(eager);  // first call: plans and kernel attributes are set up outside the capture
  stream.synchronize();
  t.poison_scratch(arena);  // the replay must write its scratch itself, not find the eager call's
  replay_once(stream, [&] { step(replay); });
  EXPECT_EQ(download<uint16_t>(eager.data(), batch * s.hidden), download<uint16_t>(replay.data(), batch * s.hidden));

  // With the latent and gate branches on a side stream: the same kernels on the same inputs, so the same
  // bits, eagerly and replayed (the capture forks to the side stream and joins back).
  const MlaSideStream side = t.side();
  DeviceBuffer side_eager = test::poisoned(batch * s.hidden * 2), side_replay = test::poisoned(batch * s.hidden * 2);
  auto side_step = [&](DeviceBuffer& out) {
    mla_decode_step(linear, arena, stream, s.gdims(), gw, cache.view(), dx.as<__nv_bfloat16>(), batch, ds.as<int32_t>(),
                    dl.as<int32_t>(), 91, out.as<__nv_bfloat16>(), false, &side);
  };
  t.poison_scratch(arena);
  side_step(side_eager);
  stream.synchronize();
  EXPECT_EQ(download<uint16_t>(side_eager.data(), batch * s.hidden),
            download<uint16_t>(eager.data(), batch * s.hidden));
  t.poison_scratch(arena);
  replay_once(stream, [&] { side_step(side_replay); });
  EXPECT_EQ(download<uint16_t>(side_replay.data(), batch * s.hidden),
            download<uint16_t>(eager.data(), batch * s.hidden));
}

// What a server does with the graph: capture the step once, for the cache's capacity, then replay it step
// after step with new tokens, slots and lengths written into the same buffers: longer contexts, then both
// sequences replaced by new requests (one with an empty context). Every replay must give the bits of an
// eager step on the same inputs (so nothing per-step was baked into the graph at capture) and agree with the
// CPU reference; with the latent and gate branches on a side stream as well.
TEST(MlaLayer, DecodeStepGraphReplaysAcrossSteps) {
  KIMIRT_REQUIRE_GPU();
  MlaSetup s;
  const int batch = 2, capacity = 3 * Cache::kPage;
  Cache cache(batch, 3, 33);
  DeviceBuffer dx = test::poisoned(batch * s.hidden * 2), ds = test::poisoned(batch * 4),
               dl = test::poisoned(batch * 4);
  DeviceArena arena(0, 64 << 20);
  TwoStreams t;
  Linear& linear = t.linear;
  Stream& stream = t.stream;
  const MlaSideStream side = t.side();
  DeviceBuffer w_uk_t(s.heads * 512 * 128 * 2);
  mla_transpose_uk(nullptr, s.kv_b.d(), s.heads, w_uk_t.as<__nv_bfloat16>());
  const std::vector<uint16_t> cache_bits = [&] {
    std::vector<float> c = cache.host;
    return test::to_bf16(c);
  }();
  // The steps run on non-blocking streams, which the legacy stream's work (the buffers' poison, the W_UK
  // transpose, a cudaMemcpy from pageable memory, which may return before its DMA lands) does not order: each
  // input write is waited for on the whole device.
  auto copy_in = [&](DeviceBuffer& dst, const void* src, size_t bytes) {
    KIMIRT_CUDA_CHECK(cudaMemcpy(dst.data(), src, bytes, cudaMemcpyHostToDevice));
    KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  // One stream with the absorption through kv_b (cuBLASLt); two streams through w_uk_t (skinny kernels).
  for (const MlaSideStream* sp : {static_cast<const MlaSideStream*>(nullptr), &side}) {
    SCOPED_TRACE(sp ? "two streams, w_uk_t" : "one stream, kv_b");
    MlaLayerWeights gw = s.gweights();
    if (sp) gw.w_uk_t = w_uk_t.as<__nv_bfloat16>();
    DeviceBuffer eager = test::poisoned(batch * s.hidden * 2), replayed = test::poisoned(batch * s.hidden * 2);
    auto step = [&](DeviceBuffer& out) {
      mla_decode_step(linear, arena, stream, s.gdims(), gw, cache.view(), dx.as<__nv_bfloat16>(), batch,
                      ds.as<int32_t>(), dl.as<int32_t>(), capacity, out.as<__nv_bfloat16>(), false, sp);
    };
    // Plans and kernel attributes are set up by a first eager call, outside the capture.
    const std::vector<int32_t> first_slots = {cache.slot(0, 0), cache.slot(1, 0)}, first_lens = {1, 1};
    copy_in(ds, first_slots.data(), batch * 4);
    copy_in(dl, first_lens.data(), batch * 4);
    step(eager);
    stream.synchronize();
    const test::CapturedGraph graph(stream, [&] { step(replayed); });
    const std::vector<std::vector<int>> contexts = {{40, 150}, {41, 151}, {0, 5}, {capacity - 1, 63}};
    for (size_t k = 0; k < contexts.size(); ++k) {
      const std::vector<int>& ctx = contexts[k];
      SCOPED_TRACE("step " + std::to_string(k) + ": contexts " + std::to_string(ctx[0]) + ", " +
                   std::to_string(ctx[1]));
      std::vector<float> x = test::random_vec(batch * s.hidden, 300 + k);
      const std::vector<uint16_t> x_bits = test::to_bf16(x);
      std::vector<int32_t> slots, lens;
      for (int b = 0; b < batch; ++b) slots.push_back(cache.slot(b, ctx[b])), lens.push_back(ctx[b] + 1);
      copy_in(dx, x_bits.data(), x_bits.size() * 2);
      copy_in(ds, slots.data(), batch * 4);
      copy_in(dl, lens.data(), batch * 4);
      // Each run appends this step's latent at the slots: the cache is restored so both see the same rows.
      copy_in(cache.dev, cache_bits.data(), cache_bits.size() * 2);
      poison(eager.data(), eager.size(), stream);
      t.poison_scratch(arena);
      step(eager);
      stream.synchronize();
      copy_in(cache.dev, cache_bits.data(), cache_bits.size() * 2);
      poison(replayed.data(), replayed.size(), stream);
      t.poison_scratch(arena);
      graph.launch();
      stream.synchronize();
      const auto want = download<uint16_t>(eager.data(), batch * s.hidden);
      EXPECT_EQ(download<uint16_t>(replayed.data(), batch * s.hidden), want) << "replay against eager";
      const auto got = test::from_bf16(want);
      for (int b = 0; b < batch; ++b) {
        std::vector<float> ref(s.hidden), new_latent(576);
        cpu::mla_forward(s.cdims(), s.cweights(), x.data() + b * s.hidden, 1, ctx[b] ? cache.rows(b) : nullptr, ctx[b],
                         ref.data(), new_latent.data(), cpu::MlaPath::kAbsorbed);
        EXPECT_LE(test::rel_err(test::part(got, b * s.hidden, s.hidden), ref), 1e-2) << "sequence " << b;
      }
    }
  }
  EXPECT_EQ(arena.step_used(), 0u) << "scratch released";
}

// The two-stream step's joins: the side stream held back (a host function sleeping 2 ms queued on it before the step),
// the new tokens' cache slots and the step's scratch filled with NaN. The attention must wait for the side stream's
// append (else it reads the NaN slots) and W_UV for its gate projection (else it reads NaN gates): the output
// then matches the CPU reference. Run for the default gate placement and with the gate on SMs of its own.
TEST(MlaLayer, DecodeStepWaitsForTheSideStream) {
  KIMIRT_REQUIRE_GPU();
  MlaSetup s(2304, 8);  // hidden 2304: the gate projection can keep SMs (a rows-kernel GEMV, k > 2048)
  const int batch = 1;
  Cache cache(batch, 2, 41);
  const std::vector<int> ctx = {100};
  std::vector<float> x = test::random_vec(batch * s.hidden, 42);
  DeviceBuffer dx = upload(test::to_bf16(x));
  const std::vector<int32_t> slots = {cache.slot(0, ctx[0])}, lens = {ctx[0] + 1};
  DeviceBuffer ds = upload(slots), dl = upload(lens);
  DeviceArena arena(0, 64 << 20);
  TwoStreams t;
  std::vector<float> ref(s.hidden), new_latent(576);
  cpu::mla_forward(s.cdims(), s.cweights(), x.data(), 1, cache.rows(0), ctx[0], ref.data(), new_latent.data(),
                   cpu::MlaPath::kAbsorbed);
  // On one SM the gate projection (4.7 MB) takes longer than the attention and absorption after the append:
  // a W_UV that did not wait for it would read the NaN gates.
  for (const int gate_sms : {kMlaGateSmsAuto, 48 * t.sms / 132, 1}) {
    SCOPED_TRACE("gate_sms " + std::to_string(gate_sms));
    const MlaSideStream side = t.side(gate_sms);
    const auto step = [&](DeviceBuffer& out) {
      mla_decode_step(t.linear, arena, t.stream, s.gdims(), s.gweights(), cache.view(), dx.as<__nv_bfloat16>(), batch,
                      ds.as<int32_t>(), dl.as<int32_t>(), ctx[0] + 1, out.as<__nv_bfloat16>(), false, &side);
    };
    // A first step without the hold: plans tuned and kernels loaded, both of which may synchronize the host
    // with the held stream (and so would hide a missing wait).
    DeviceBuffer warm(batch * s.hidden * 2);
    step(warm);
    t.stream.synchronize();  // the step joins the side stream: its append and gate are done before the poison
    // The scratch the step will take, and the slot it appends to, hold NaN.
    const uint64_t scratch = 16 << 20;
    poison(arena.allocate_step(scratch, "test.poison"), scratch, nullptr);
    arena.rewind(0);
    KIMIRT_CUDA_CHECK(cudaMemset(cache.dev.as<__nv_bfloat16>() + int64_t{slots[0]} * 576, 0xff, 576 * 2));
    DeviceBuffer out = test::poisoned(batch * s.hidden * 2);
    KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
    test::hold_stream(t.side_stream, 2000);
    ASSERT_EQ(cudaStreamQuery(t.side_stream), cudaErrorNotReady) << "the side stream is held";
    step(out);
    // The premise of the test: the whole step was queued while the side stream was still held.
    EXPECT_EQ(cudaStreamQuery(t.side_stream), cudaErrorNotReady) << "the host waited for the side stream";
    t.stream.synchronize();
    const auto got = test::from_bf16(download<uint16_t>(out.data(), batch * s.hidden));
    EXPECT_LE(test::rel_err(got, ref), 1e-2);
  }
}

// The gate projection on SMs of its own (MlaSideStream::gate_sms) beside an attention planned for the rest:
// hidden 2304 so that the gate is a rows-kernel GEMV (k > 2048). The attention's split then differs from the
// single-stream step's, so the two agree to rounding, each with the CPU reference; a graph replay repeats
// the eager side-stream step bit for bit.
// What the attention would refuse is refused before the step queues anything on either stream: a cache that
// is not 16-byte aligned, a length the attention's planner cannot split into int32 keys. Checked inside a
// stream capture: the captured graph has no node.
TEST(MlaLayer, DecodeStepRefusesBeforeQueuing) {
  KIMIRT_REQUIRE_GPU();
  MlaSetup s;
  Cache cache(1, 4, 51);
  std::vector<float> x = test::random_vec(s.hidden, 52);
  DeviceBuffer dx = upload(test::to_bf16(x)), out = test::poisoned(s.hidden * 2);
  const std::vector<int32_t> slots = {cache.slot(0, 100)}, lens = {101};
  DeviceBuffer ds = upload(slots), dl = upload(lens);
  DeviceArena arena(0, 64 << 20);
  TwoStreams t;
  MlaCacheView misaligned = cache.view(), short_rows = cache.view(), wide_rows = cache.view();
  misaligned.cache += 1;               // 2 bytes off
  short_rows.ld_block_table = 1;       // 64 rows: sequence 0's row 100 would be looked up past its row
  wide_rows.ld_block_table = 1 << 30;  // so that INT32_MAX rows pass the table check and meet the plan's
  struct Bad {
    MlaCacheView view;
    int max_seq_len;
    const char* needle;
  };
  for (const bool two_streams : {false, true}) {
    for (const Bad& b :
         {Bad{misaligned, 101, "cache not 16-byte aligned"}, Bad{wide_rows, INT32_MAX, "too long"},
          Bad{short_rows, 101, "max_seq_len 101 needs 2 pages of 64 rows, more than a block table row"}}) {
      SCOPED_TRACE(testing::Message() << b.needle << (two_streams ? ", two streams" : ", one stream"));
      const MlaSideStream side = t.side();
      const auto [what, nodes] = test::queued_by(t.stream, [&] {
        mla_decode_step(t.linear, arena, t.stream, s.gdims(), s.gweights(), b.view, dx.as<__nv_bfloat16>(), 1,
                        ds.as<int32_t>(), dl.as<int32_t>(), b.max_seq_len, out.as<__nv_bfloat16>(), false,
                        two_streams ? &side : nullptr);
      });
      EXPECT_NE(what.find(b.needle), std::string::npos) << what;
      EXPECT_EQ(nodes, 0u) << "work queued before the refusal";
    }
  }
}

TEST(MlaLayer, DecodeStepWithTheGateOnItsOwnSms) {
  KIMIRT_REQUIRE_GPU();
  const int sms = query_device(0).sm_count;
  // 8 heads with a share given explicitly (the attention, kMma16, planned for the other SMs), and K3's 96
  // heads per GPU with the measured choice (kSeesaw beside the gate on mla_gate_sms's share).
  for (const auto& [heads, gate_sms] : {std::pair<int64_t, int>{8, sms / 3}, {96, kMlaGateSmsAuto}}) {
    SCOPED_TRACE(testing::Message() << heads << " heads, gate_sms " << gate_sms);
    MlaSetup s(2304, heads);
    // Long enough that the attention's plan on the remaining SMs has fewer splits than on all of them.
    // (At 8000 rows both plans of 8 heads rounded to the same 84 chunks of 96 rows.)
    const int ctx = 16000;
    Cache cache(1, 252, 41);
    std::vector<float> x = test::random_vec(s.hidden, 42);
    DeviceBuffer dx = upload(test::to_bf16(x));
    const std::vector<int32_t> slots = {cache.slot(0, ctx)}, lens = {ctx + 1};
    DeviceBuffer ds = upload(slots), dl = upload(lens);
    DeviceArena arena(0, 64 << 20);
    TwoStreams t;
    Linear &linear = t.linear, &side_linear = t.side_linear;
    Stream& stream = t.stream;
    MlaSideStream side = t.side(gate_sms);
    const MlaLayerWeights gw = s.gweights();
    const int share = gate_sms < 0 ? mla_gate_sms(sms, heads, 1) : gate_sms;
    ASSERT_GT(share, 0);
    EXPECT_LT(plan_mla_decode(1, static_cast<int>(heads), ctx + 1, sms - share).splits,
              plan_mla_decode(1, static_cast<int>(heads), ctx + 1, sms).splits);
    {
      DeviceBuffer g = test::poisoned(heads * 128 * 2);  // the gate's shape takes the capped grid
      EXPECT_TRUE(side_linear.on_sms(nullptr, dx.as<__nv_bfloat16>(), gw.g_proj, g.data(), OutType::kBF16, 1,
                                     heads * 128, s.hidden, share));
    }
    auto step = [&](DeviceBuffer& out, const MlaSideStream* sp) {
      mla_decode_step(linear, arena, stream, s.gdims(), gw, cache.view(), dx.as<__nv_bfloat16>(), 1, ds.as<int32_t>(),
                      dl.as<int32_t>(), ctx + 1, out.as<__nv_bfloat16>(), false, sp);
    };
    DeviceBuffer one = test::poisoned(s.hidden * 2), kept = test::poisoned(s.hidden * 2),
                 replay = test::poisoned(s.hidden * 2);
    t.poison_scratch(arena);
    step(one, nullptr);
    t.poison_scratch(arena);
    step(kept, &side);
    stream.synchronize();
    std::vector<float> ref(s.hidden), new_latent(576);
    cpu::mla_forward(s.cdims(), s.cweights(), x.data(), 1, cache.rows(0), ctx, ref.data(), new_latent.data(),
                     cpu::MlaPath::kAbsorbed);
    const auto got_one = test::from_bf16(download<uint16_t>(one.data(), s.hidden));
    const auto got_kept = test::from_bf16(download<uint16_t>(kept.data(), s.hidden));
    EXPECT_LE(test::rel_err(got_one, ref), 1e-2);
    EXPECT_LE(test::rel_err(got_kept, ref), 1e-2);
    EXPECT_LE(test::rel_err(got_kept, got_one), 1e-2);

    t.poison_scratch(arena);
    replay_once(stream, [&] { step(replay, &side); });
    EXPECT_EQ(download<uint16_t>(replay.data(), s.hidden), download<uint16_t>(kept.data(), s.hidden));

    // A share of every SM is an error naming the field.
    side.gate_sms = sms;
    try {
      step(replay, &side);
      ADD_FAILURE() << "gate_sms = every SM was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gate_sms"), std::string::npos) << e.what();
    }
  }
  // The measured choice: none at 8 heads (the attention is memory-bound) or past one token.
  EXPECT_EQ(mla_gate_sms(sms, 8, 1), 0);
  EXPECT_EQ(mla_gate_sms(132, 96, 1), 48);
  EXPECT_EQ(mla_gate_sms(132, 96, 2), 0);
}

}  // namespace
}  // namespace kimirt::cuda
