// Stream and event lifetimes. Destructors do not throw: a failing destroy (device already lost) is ignored,
// the error having been reported by whichever call met it first.
#include "kimirt/cuda/stream.h"

#include <utility>

#include "kimirt/cuda/check.h"

namespace kimirt::cuda {

Stream::Stream(int priority) {
  KIMIRT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (stream_) (void)cudaStreamDestroy(stream_);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  std::swap(stream_, other.stream_);
  return *this;
}

void Stream::synchronize() const { KIMIRT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  KIMIRT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}

Event& Event::operator=(Event&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}

void Event::record(cudaStream_t stream) { KIMIRT_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::wait_on(cudaStream_t stream) const { KIMIRT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }

void Event::synchronize() const { KIMIRT_CUDA_CHECK(cudaEventSynchronize(event_)); }

bool Event::done() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  KIMIRT_CUDA_CHECK(err);
  return true;
}

float elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0.0f;
  KIMIRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

}  // namespace kimirt::cuda
