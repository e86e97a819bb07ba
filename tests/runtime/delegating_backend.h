// A backend that passes every op to another one: the base of the test backends that change or watch one op
// (failing_backend.h, the AttnRes recorder of forward_test.cpp).
#pragma once

#include <span>
#include <string_view>

#include "kimirt/runtime/backend.h"

namespace kimirt::runtime::testing {

class DelegatingBackend : public Backend {
 public:
  explicit DelegatingBackend(Backend& inner) : inner_(inner) {}
  std::string_view name() const override { return inner_.name(); }
  const model::ModelConfig& config() const override { return inner_.config(); }
  const CacheConfig& cache_config() const override { return inner_.cache_config(); }
  Act alloc(int64_t r, int64_t c) override { return inner_.alloc(r, c); }
  void release(Act a) override { inner_.release(a); }
  int64_t rows(Act a) const override { return inner_.rows(a); }
  int64_t cols(Act a) const override { return inner_.cols(a); }
  void begin_step(const StepBatch& b) override { inner_.begin_step(b); }
  void end_step() override { inner_.end_step(); }
  void embed(Act o) override { inner_.embed(o); }
  void add(Act a, Act b, Act o) override { inner_.add(a, b, o); }
  void attn_res_mix(int l, ResSite s, std::span<const Act> c, Act o) override { inner_.attn_res_mix(l, s, c, o); }
  void rms_norm(int l, NormSite s, Act x, Act o) override { inner_.rms_norm(l, s, x, o); }
  void kda_mixer(int l, Act x, Act o) override { inner_.kda_mixer(l, x, o); }
  void mla_mixer(int l, Act x, Act o) override { inner_.mla_mixer(l, x, o); }
  void dense_mlp(int l, Act x, Act o) override { inner_.dense_mlp(l, x, o); }
  void moe_block(int l, Act x, Act o, RouteTrace* t) override { inner_.moe_block(l, x, o, t); }
  void gather_rows(Act x, std::span<const int64_t> r, Act o) override { inner_.gather_rows(x, r, o); }
  void lm_head(Act x, Act o) override { inner_.lm_head(x, o); }
  void sample(Act l, std::span<const int64_t> r, std::span<Sampler* const> s, std::span<int32_t> t) override {
    inner_.sample(l, r, s, t);
  }
  void to_host(Act a, int64_t f, int64_t n, std::span<float> o) const override { inner_.to_host(a, f, n, o); }

 private:
  Backend& inner_;
};

}  // namespace kimirt::runtime::testing
