// Owning wrappers for CUDA streams and events. Streams are non-blocking (they never serialize against the
// legacy default stream), so work from different streams overlaps unless an event orders it.
#pragma once

#include <cuda_runtime_api.h>

namespace kimirt::cuda {

class Stream {
 public:
  // Creates a non-blocking stream; priority 0 is the default (lower numbers are higher priority).
  explicit Stream(int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  operator cudaStream_t() const { return stream_; }  // NOLINT: meant to pass straight to launches
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  // timing = false makes record/wait cheaper (no timestamp).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device) for the work recorded before this event.
  void wait_on(cudaStream_t stream) const;
  void synchronize() const;
  bool done() const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds between two recorded timing events (start must precede stop on the device).
float elapsed_ms(const Event& start, const Event& stop);

}  // namespace kimirt::cuda
