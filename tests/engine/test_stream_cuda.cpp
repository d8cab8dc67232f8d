// Streams, events and allocator events across two GPUs: an event is created on and recorded from
// the device of the stream it is recorded on, whichever device is current (engine/cuda_api.cu).
// Needs two devices; skips otherwise.
#include <gtest/gtest.h>

#include "engine/allocator.h"
#include "engine/cuda_api.h"
#include "engine/ops.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "testing/testing.h"

namespace leantune {
namespace {

class StreamTwoDevicesCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    LT_SKIP_WITHOUT_CUDA();
    if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  }
};

// Device 0 current, streams of device 1: waits, events and frees must not throw.
TEST_F(StreamTwoDevicesCuda, CrossDeviceWaitEventAndAllocatorFree) {
  cuda_set_device(0);
  Stream s0 = current_stream(Device::cuda(0));
  Stream s1 = new_stream(Device::cuda(1));
  Tensor x1 = Tensor::full({1 << 16}, 2.0, DType::kF32, Device::cuda(1));
  // s0 waits for s1 and s1 for s0 while device 0 is current.
  EXPECT_NO_THROW(s0.wait_stream(s1));
  cuda_set_device(0);
  EXPECT_NO_THROW(s1.wait_stream(s0));
  // An event of device 1 recorded on its stream while device 0 is current.
  Event e(Device::cuda(1));
  cuda_set_device(0);
  EXPECT_NO_THROW(e.record(s1));
  e.synchronize();
  EXPECT_TRUE(e.query());
  // A device-1 block used on a device-0 stream (peer read), freed with device 0 current.
  Allocator& a1 = allocator(Device::cuda(1));
  Block* b = a1.allocate(4096, MemTag::kWorkspace, s1);
  a1.record_stream(b, s0);
  cuda_set_device(0);
  EXPECT_NO_THROW(a1.free(b));
  // A pinned block read by a device-1 stream, freed with device 0 current.
  Allocator& pinned = pinned_allocator();
  Stream host = current_stream(Device::cpu());
  Block* hb = pinned.allocate(4096, MemTag::kWorkspace, host);
  pinned.record_stream(hb, s1);
  cuda_set_device(0);
  EXPECT_NO_THROW(pinned.free(hb));
  s1.synchronize();
  s0.synchronize();
  EXPECT_EQ(x1.to_f64()[123], 2.0);
}

}  // namespace
}  // namespace leantune
