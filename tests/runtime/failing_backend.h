// A backend that delegates every op to another one, and whose KDA mixer fails while `fail` is set: for the
// tests of what a failing step does to the engine and to a parallel group.
#pragma once

#include <string_view>

#include "kimirt/base/error.h"
#include "runtime/delegating_backend.h"

namespace kimirt::runtime::testing {

class FailingBackend final : public DelegatingBackend {
 public:
  explicit FailingBackend(Backend& inner) : DelegatingBackend(inner) {}
  bool fail = false;
  std::string_view name() const override { return "failing"; }
  void kda_mixer(int l, Act x, Act o) override {
    KIMIRT_CHECK(!fail, "injected failure in layer {}", l);
    DelegatingBackend::kda_mixer(l, x, o);
  }
};

}  // namespace kimirt::runtime::testing
