// One rank's engine in a parallel group, stepped in lockstep with the other ranks' (every rank runs one
// ParallelEngine over its own backend and the group's Comm). Each group step begins with an all-reduce of
// "this rank has work"; when no rank has any, every rank stops at the same step. Otherwise every rank steps,
// a rank without work of its own running the forward on zero tokens, so that each collective of the step
// finds every rank.
//
// What each rank must be given:
//   attention-DP off: the same requests (and cancellations), submitted in the same order before the same
//     group step (the ranks then schedule identical batches; sampling happens on rank 0 and is broadcast, so
//     they stay identical). A server will have to forward them from rank 0; the CLI submits before running;
//   attention-DP on: its own requests (any split; a rank may have none).
// A step that fails on one rank is rethrown there (the group is then unusable: abort its Comm); every rank whose
// step fails, itself or through the aborted Comm, first ends each request it holds with a kError event.
#pragma once

#include "kimirt/comm/comm.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/engine.h"

namespace kimirt::runtime {

class ParallelEngine {
 public:
  // comm: the whole group; backend and comm must outlive the engine. config.lockstep is set here.
  ParallelEngine(Backend& backend, Comm& comm, EngineConfig config, Engine::TokenCallback on_token);

  // Submit, cancel and read stats through the rank's engine.
  Engine& engine() { return engine_; }

  // One group step. Returns false, having run nothing, when no rank of the group has work. Collective.
  bool step();
  // Steps until no rank has work: every rank returns after the same step. Collective.
  void run_until_idle();
  // Group steps taken that ran a forward.
  int64_t steps() const { return steps_; }

 private:
  Comm& comm_;
  Engine engine_;
  int64_t steps_ = 0;
};

}  // namespace kimirt::runtime
