#include "kimirt/runtime/cpu_backend.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "kimirt/base/error.h"
#include "kimirt/cpu/attn_res.h"
#include "kimirt/cpu/embedding.h"
#include "kimirt/cpu/kda.h"
#include "kimirt/cpu/lm_head.h"
#include "kimirt/cpu/mla.h"
#include "kimirt/cpu/mlp.h"
#include "kimirt/cpu/norm.h"

namespace kimirt::runtime {
namespace {

// Checks made before any weight is copied: a mismatch here would otherwise surface as wrong numbers.
const model::ParallelMapping& checked_mapping(const model::ParallelMapping& mapping, const Comm& comm,
                                              const model::ModelConfig& config, MoeComm moe_comm) {
  mapping.validate(config);
  ParallelConfig{mapping.tp_size, mapping.ep_size, mapping.attention_dp, moe_comm}.validate(config);
  KIMIRT_CHECK(comm.size() == mapping.tp_size && comm.rank() == mapping.tp_rank,
               "CPU backend: the communicator is rank {} of {}, the parallel mapping says {}", comm.rank(), comm.size(),
               mapping.str());
  return mapping;
}

const CacheConfig& checked_cache(const CacheConfig& cache) {
  KIMIRT_CHECK(cache.max_sequences >= 1, "cache: max_sequences must be >= 1, got {}", cache.max_sequences);
  KIMIRT_CHECK(cache.block_size >= 1, "cache: block_size must be >= 1, got {}", cache.block_size);
  KIMIRT_CHECK(cache.num_blocks >= 0, "cache: num_blocks must be >= 0, got {}", cache.num_blocks);
  return cache;
}

}  // namespace

CpuBackend::CpuBackend(const model::ModelConfig& config, const model::ParamStore& params, Comm& comm,
                       const model::ParallelMapping& mapping, const CacheConfig& cache, MoeComm moe_comm)
    : config_(config),
      cache_(checked_cache(cache)),
      comm_(comm),
      mapping_(checked_mapping(mapping, comm, config_, moe_comm)),
      weights_(config_, params, mapping_),
      caches_(config_, weights_.dims().kda, weights_.dims().mla, cache_),
      moe_(config_, weights_.dims(), mapping_, moe_comm, comm_) {
  const int dense_tp = weights_.dims().dense_tp;
  if (dense_tp == comm_.size()) {
    dense_comm_ = &comm_;
  } else if (dense_tp > 1) {
    // Ranks r with the same r / dense_tp hold the shards 0 .. dense_tp - 1 between them (shard = r mod dense_tp).
    dense_group_ = comm_.split(comm_.rank() / dense_tp, comm_.rank());
    dense_comm_ = dense_group_.get();
  }
}

CpuBackend::~CpuBackend() = default;

Act CpuBackend::alloc(int64_t rows, int64_t cols) {
  KIMIRT_ASSERT(rows >= 0 && cols >= 0);
  size_t i = 0;
  while (i < buffers_.size() && buffers_[i].used) ++i;
  if (i == buffers_.size()) buffers_.emplace_back();
  Buffer& b = buffers_[i];
  b.data.resize(static_cast<size_t>(rows * cols));
  b.rows = rows;
  b.cols = cols;
  b.used = true;
  return Act{static_cast<int32_t>(i)};
}

void CpuBackend::release(Act a) {
  if (a.id >= 0 && static_cast<size_t>(a.id) < buffers_.size()) buffers_[static_cast<size_t>(a.id)].used = false;
}

const CpuBackend::Buffer& CpuBackend::buf(Act a) const {
  KIMIRT_ASSERT(a.id >= 0 && static_cast<size_t>(a.id) < buffers_.size() && buffers_[static_cast<size_t>(a.id)].used);
  return buffers_[static_cast<size_t>(a.id)];
}

CpuBackend::Buffer& CpuBackend::buf(Act a) {
  return buffers_[static_cast<size_t>(&std::as_const(*this).buf(a) - buffers_.data())];
}

int64_t CpuBackend::rows(Act a) const { return buf(a).rows; }
int64_t CpuBackend::cols(Act a) const { return buf(a).cols; }

float* CpuBackend::data(Act a, int64_t rows, int64_t cols) {
  Buffer& b = buf(a);
  KIMIRT_ASSERT(b.rows == rows && b.cols == cols);
  return b.data.data();
}

const StepBatch& CpuBackend::batch() const {
  KIMIRT_ASSERT(batch_ != nullptr);
  return *batch_;
}

void CpuBackend::begin_step(const StepBatch& batch) {
  KIMIRT_ASSERT(batch_ == nullptr);
  const int64_t T = batch.num_tokens(), bs = cache_.block_size;
  std::vector<char> slot_used(static_cast<size_t>(cache_.max_sequences), 0);
  std::vector<char> block_used(static_cast<size_t>(cache_.num_blocks), 0);
  int64_t next = 0, logit_rows = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const StepSequence& s = batch.sequences[i];
    KIMIRT_CHECK(s.first_token == next && s.num_tokens > 0 && s.first_token + s.num_tokens <= T,
                 "step batch: sequence {} covers tokens [{}, {}), expected to start at {} within {} tokens", i,
                 s.first_token, s.first_token + s.num_tokens, next, T);
    KIMIRT_CHECK(s.kda_slot >= 0 && s.kda_slot < cache_.max_sequences,
                 "step batch: sequence {} has KDA slot {}, outside [0, {})", i, s.kda_slot, cache_.max_sequences);
    KIMIRT_CHECK(!slot_used[static_cast<size_t>(s.kda_slot)], "step batch: sequence {} reuses KDA slot {}", i,
                 s.kda_slot);
    slot_used[static_cast<size_t>(s.kda_slot)] = 1;
    KIMIRT_CHECK(s.start_position >= 0, "step batch: sequence {} starts at position {}", i, s.start_position);
    const int64_t need = s.start_position + s.num_tokens;
    const int64_t blocks_needed = (need + bs - 1) / bs;
    KIMIRT_CHECK(static_cast<int64_t>(s.blocks.size()) >= blocks_needed,
                 "step batch: sequence {} needs {} cache blocks for {} tokens, its block table has {}", i,
                 blocks_needed, need, s.blocks.size());
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = s.blocks[static_cast<size_t>(b)];
      KIMIRT_CHECK(id >= 0 && id < cache_.num_blocks, "step batch: sequence {} uses cache block {}, outside [0, {})", i,
                   id, cache_.num_blocks);
      KIMIRT_CHECK(!block_used[static_cast<size_t>(id)], "step batch: cache block {} is used twice (sequence {})", id,
                   i);
      block_used[static_cast<size_t>(id)] = 1;
    }
    KIMIRT_CHECK(s.first_logit_row == logit_rows, "step batch: sequence {} has logits row {}, expected {}", i,
                 s.first_logit_row, logit_rows);
    logit_rows += s.num_logit_rows();
    next += s.num_tokens;
  }
  KIMIRT_CHECK(next == T, "step batch: the sequences cover {} of {} tokens", next, T);
  KIMIRT_CHECK(logit_rows == batch.logit_rows, "step batch: {} logits rows declared, the sequences ask for {}",
               batch.logit_rows, logit_rows);
  for (const StepSequence& s : batch.sequences) {
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      const int32_t id = batch.tokens[static_cast<size_t>(s.first_token + t)];
      KIMIRT_CHECK(id >= 0 && id < config_.vocab_size,
                   "step batch: token {} of sequence at position {} is id {}, outside the vocabulary [0, {})", t,
                   s.start_position + t, id, config_.vocab_size);
    }
  }
  batch_ = &batch;
}

void CpuBackend::embed(Act out) {
  const StepBatch& b = batch();
  cpu::embedding_gather(weights_.embed(), config_.vocab_size, config_.hidden_size, b.tokens,
                        data(out, b.num_tokens(), config_.hidden_size));
}

void CpuBackend::add(Act a, Act b, Act out) {
  const int64_t r = rows(a), c = cols(a);
  const float* x = data(a, r, c);
  const float* y = data(b, r, c);
  float* z = data(out, r, c);
  for (int64_t i = 0; i < r * c; ++i) z[i] = x[i] + y[i];
}

void CpuBackend::attn_res_mix(int layer, ResSite site, std::span<const Act> candidates, Act out) {
  const int64_t T = batch().num_tokens(), H = config_.hidden_size;
  const cpu::AttnResWeights& w = site == ResSite::kOutput  ? weights_.output_res()
                                 : site == ResSite::kMixer ? weights_.layer(layer).mixer_res
                                                           : weights_.layer(layer).ffn_res;
  std::vector<const float*> v;
  for (Act c : candidates) v.push_back(data(c, T, H));
  cpu::attn_res_mix(v, T, H, w, weights_.dims().rms_norm_eps, data(out, T, H));
}

void CpuBackend::rms_norm(int layer, NormSite site, Act x, Act out) {
  const int64_t T = batch().num_tokens(), H = config_.hidden_size;
  const float* w = site == NormSite::kFinal   ? weights_.final_norm()
                   : site == NormSite::kInput ? weights_.layer(layer).input_norm
                                              : weights_.layer(layer).post_attention_norm;
  cpu::rms_norm(data(x, T, H), w, data(out, T, H), T, H, weights_.dims().rms_norm_eps);
}

void CpuBackend::kda_mixer(int layer, Act x, Act out) {
  const StepBatch& b = batch();
  const int64_t T = b.num_tokens(), H = config_.hidden_size;
  const float* in = data(x, T, H);
  float* o = data(out, T, H);
  for (const StepSequence& s : b.sequences) {
    if (s.start_position == 0) caches_.reset_kda(layer, s.kda_slot);
    cpu::kda_forward(weights_.dims().kda, weights_.layer(layer).kda, in + s.first_token * H, s.num_tokens,
                     caches_.kda_state(layer, s.kda_slot), o + s.first_token * H);
  }
  // o_proj partials over the head shards; under attention-DP this rank ran every head.
  if (!mapping_.attention_dp) comm_.all_reduce_sum(o, static_cast<size_t>(T * H), DType::kF32);
}

void CpuBackend::mla_mixer(int layer, Act x, Act out) {
  const StepBatch& b = batch();
  const int64_t T = b.num_tokens(), H = config_.hidden_size, lw = caches_.latent_width();
  const float* in = data(x, T, H);
  float* o = data(out, T, H);
  for (const StepSequence& s : b.sequences) {
    mla_cached_.resize(static_cast<size_t>(s.start_position * lw));
    caches_.gather_latent(layer, s.blocks, s.start_position, mla_cached_.data());
    mla_fresh_.resize(static_cast<size_t>(s.num_tokens * lw));
    cpu::mla_forward(weights_.dims().mla, weights_.layer(layer).mla, in + s.first_token * H, s.num_tokens,
                     mla_cached_.data(), s.start_position, o + s.first_token * H, mla_fresh_.data());
    caches_.write_latent(layer, s.blocks, s.start_position, s.num_tokens, mla_fresh_.data());
  }
  if (!mapping_.attention_dp) comm_.all_reduce_sum(o, static_cast<size_t>(T * H), DType::kF32);
}

void CpuBackend::dense_mlp(int layer, Act x, Act out) {
  const int64_t T = batch().num_tokens(), H = config_.hidden_size;
  float* o = data(out, T, H);
  cpu::gated_mlp({H, weights_.dims().dense_intermediate}, weights_.layer(layer).dense, weights_.dims().act,
                 data(x, T, H), T, o);
  if (dense_comm_) dense_comm_->all_reduce_sum(o, static_cast<size_t>(T * H), DType::kF32);
}

void CpuBackend::moe_block(int layer, Act x, Act out, RouteTrace* trace) {
  const int64_t T = batch().num_tokens(), H = config_.hidden_size;
  moe_.forward(layer, weights_.layer(layer), data(x, T, H), T, data(out, T, H), trace, tracer_);
}

void CpuBackend::gather_rows(Act x, std::span<const int64_t> rows, Act out) {
  const int64_t r = this->rows(x), c = cols(x), n = static_cast<int64_t>(rows.size());
  const float* src = data(x, r, c);
  float* dst = data(out, n, c);
  for (int64_t i = 0; i < n; ++i) {
    KIMIRT_ASSERT(rows[static_cast<size_t>(i)] >= 0 && rows[static_cast<size_t>(i)] < r);
    std::copy_n(src + rows[static_cast<size_t>(i)] * c, c, dst + i * c);
  }
}

void CpuBackend::lm_head(Act x, Act logits) {
  const int64_t n = rows(x), H = config_.hidden_size, V = config_.vocab_size, Vl = weights_.dims().vocab_rows;
  const int ranks = comm_.size();
  const float* in = data(x, n, H);
  float* out = data(logits, n, V);
  if (ranks == 1) {
    cpu::lm_head(in, weights_.lm_head(), n, H, V, out);
    return;
  }
  if (mapping_.attention_dp) {
    lm_head_gathered(in, n, out);
    return;
  }
  head_local_.resize(static_cast<size_t>(n * Vl));
  head_all_.resize(static_cast<size_t>(ranks * n * Vl));
  cpu::lm_head(in, weights_.lm_head(), n, H, Vl, head_local_.data());
  // Every rank holds a contiguous vocabulary shard; the gather lands them rank after rank.
  comm_.all_gather(head_local_.data(), head_all_.data(), head_local_.size(), DType::kF32);
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(head_all_.data() + (r * n + i) * Vl, Vl, out + i * V + r * Vl);
    }
  }
}

void CpuBackend::lm_head_gathered(const float* x, int64_t n, float* out) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size, Vl = weights_.dims().vocab_rows;
  const auto ranks = static_cast<size_t>(comm_.size());
  head_counts_.resize(ranks);
  const int64_t mine = n;
  comm_.all_gather(&mine, head_counts_.data(), 1, DType::kI64);
  const int64_t most = *std::max_element(head_counts_.begin(), head_counts_.end());
  // Every rank's rows, each rank's padded to the longest, in rank order.
  head_x_.assign(static_cast<size_t>(most * H), 0.0f);
  std::copy_n(x, n * H, head_x_.data());
  head_all_.resize(ranks * static_cast<size_t>(most * H));
  comm_.all_gather(head_x_.data(), head_all_.data(), head_x_.size(), DType::kF32);
  // This rank's vocabulary shard for every rank's rows, back to back in rank order; each rank gets its own.
  int64_t total = 0;
  for (int64_t c : head_counts_) total += c;
  head_local_.resize(static_cast<size_t>(total * Vl));
  head_send_.resize(ranks);
  head_recv_.resize(ranks);
  int64_t offset = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t c = head_counts_[r];
    cpu::lm_head(head_all_.data() + static_cast<int64_t>(r) * most * H, weights_.lm_head(), c, H, Vl,
                 head_local_.data() + offset * Vl);
    head_send_[r] = static_cast<size_t>(c * Vl);
    head_recv_[r] = static_cast<size_t>(n * Vl);
    offset += c;
  }
  head_x_.resize(ranks * static_cast<size_t>(n * Vl));  // now: every shard of this rank's rows, by rank
  comm_.all_to_all_v(head_local_.data(), head_send_, head_x_.data(), head_recv_, DType::kF32);
  for (size_t r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(head_x_.data() + (static_cast<int64_t>(r) * n + i) * Vl, Vl,
                  out + i * V + static_cast<int64_t>(r) * Vl);
    }
  }
}

void CpuBackend::sample(Act logits, std::span<const int64_t> rows, std::span<Sampler* const> samplers,
                        std::span<int32_t> tokens) {
  KIMIRT_ASSERT(rows.size() == samplers.size() && rows.size() == tokens.size());
  const int64_t n = this->rows(logits), V = cols(logits);
  // With shared logits, rank 0 samples and the others take its tokens: the group feeds back the same tokens
  // whatever the last bits of each rank's logits or its samplers' seeds.
  const bool shared = tokens_shared();
  if (!shared || comm_.rank() == 0) {
    const float* src = data(logits, n, V);
    sample_row_.resize(static_cast<size_t>(V));
    for (size_t i = 0; i < rows.size(); ++i) {
      KIMIRT_ASSERT(rows[i] >= 0 && rows[i] < n);
      const float* row = src + rows[i] * V;
      if (std::none_of(row, row + V, [](float l) { return l > -std::numeric_limits<float>::infinity(); })) {
        tokens[i] = kNoToken;  // NaN compares false: all NaN or -inf
        continue;
      }
      std::copy_n(row, V, sample_row_.data());  // the sampler edits its copy (penalties, temperature)
      tokens[i] = samplers[i]->sample(sample_row_);
    }
  }
  if (shared) {
    comm_.broadcast(tokens.data(), tokens.size(), DType::kI32, 0);
    if (comm_.rank() != 0) {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (tokens[i] != kNoToken) samplers[i]->record(tokens[i]);  // penalties see the same history
      }
    }
  }
}

void CpuBackend::to_host(Act a, int64_t first_row, int64_t n, std::span<float> out) const {
  const Buffer& b = buf(a);
  KIMIRT_ASSERT(first_row >= 0 && n >= 0 && first_row + n <= b.rows && out.size() >= static_cast<size_t>(n * b.cols));
  std::copy_n(b.data.data() + first_row * b.cols, n * b.cols, out.data());
}

}  // namespace kimirt::runtime
