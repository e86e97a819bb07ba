#include "kimirt/runtime/parallel_engine.h"

#include <string>
#include <utility>

namespace kimirt::runtime {
namespace {

EngineConfig lockstep(EngineConfig config) {
  config.lockstep = true;
  return config;
}

}  // namespace

ParallelEngine::ParallelEngine(Backend& backend, Comm& comm, EngineConfig config, Engine::TokenCallback on_token)
    : comm_(comm), engine_(backend, lockstep(std::move(config)), std::move(on_token)) {}

bool ParallelEngine::step() {
  int64_t busy = engine_.idle() ? 0 : 1;
  try {
    comm_.all_reduce_sum(&busy, 1, DType::kI64);
  } catch (const std::exception& e) {
    // Another rank failed and aborted the group: this rank's requests end here too, each with an event.
    engine_.fail_all(std::string("the group's step failed: ") + e.what());
    throw;
  }
  if (busy == 0) return false;
  engine_.step();
  ++steps_;
  return true;
}

void ParallelEngine::run_until_idle() {
  while (step()) {
  }
}

}  // namespace kimirt::runtime
