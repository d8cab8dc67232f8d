// The x86-64 CPU features that decide which BLAS kernel family can run here, read with cpuid.
//
// A feature counts only when the CPU has it AND the operating system saves its registers on a
// context switch (XCR0, read with xgetbv): AVX needs the SSE and AVX state, AVX-512 also the
// opmask and upper-ZMM state. A kernel that uses registers the OS does not save would compute
// garbage after the first context switch, so a CPU with AVX-512 under an OS without AVX-512
// state counts as an AVX2 CPU. On other architectures every flag is false.
#pragma once

#include <string>

namespace leantune {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", "HygonGenuine", ... ("" off x86-64)
  int family = 0;      // display family and model, as /proc/cpuinfo shows them
  int model = 0;
  bool sse3 = false;
  bool avx = false;
  bool fma = false;
  bool avx2 = false;
  bool avx512f = false;
  bool avx512dq = false;
  bool avx512cd = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;

  bool is_amd() const { return vendor == "AuthenticAMD" || vendor == "HygonGenuine"; }
  // "GenuineIntel family 6 model 207 (AVX2, FMA, AVX-512F, AVX-512BW, AVX-512VL, AVX512-BF16)"
  std::string summary() const;
};

// This CPU's features (read once; cheap to call again).
const CpuFeatures& cpu_features();

}  // namespace leantune
