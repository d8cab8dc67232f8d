// engine/device_peaks.h: the GPU peak table by CUDA's device names (dense bf16), unknown and
// ambiguous names give no peak, and the per-token model FLOPs of full and adapter training.
#include <gtest/gtest.h>

#include "engine/device_peaks.h"

namespace leantune {
namespace {

TEST(DevicePeaks, KnownNamesGiveTheDatasheetDenseRate) {
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA H200"), 989.5e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989.5e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA H100 PCIe"), 756.5e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA A100 80GB PCIe"), 312e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA GH200 480GB"), 989.5e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA L40S"), 362.05e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA L4"), 121e12);
  EXPECT_DOUBLE_EQ(peak_bf16_flops("NVIDIA A10"), 125e12);
}

TEST(DevicePeaks, UnknownOrAmbiguousNamesGiveNone) {
  for (const char* name : {"", "NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA A10G",
                           "NVIDIA GeForce RTX 4090", "NVIDIA L40", "Tesla V100-SXM2-16GB"})
    EXPECT_EQ(peak_bf16_flops(name), 0.0) << name;
}

TEST(DevicePeaks, TrainingFlopsPerToken) {
  EXPECT_DOUBLE_EQ(training_flops_per_token(1e9, 1e9), 6e9);     // full fine-tuning: 6 N
  EXPECT_DOUBLE_EQ(training_flops_per_token(1e9, 1e7), 4.02e9);  // adapters: 4 N + 2 N_lora
  EXPECT_DOUBLE_EQ(training_flops_per_token(1e9, 0), 4e9);
}

}  // namespace
}  // namespace leantune
