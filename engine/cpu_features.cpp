// See cpu_features.h. Bits from Intel's SDM vol. 2A (CPUID) and AMD's APM vol. 3: leaf 1 ECX
// (SSE3 0, FMA 12, OSXSAVE 27, AVX 28), leaf 7 subleaf 0 EBX (AVX2 5, AVX512F 16, DQ 17, CD 28,
// BW 30, VL 31), leaf 7 subleaf 1 EAX (AVX512-BF16 5); XCR0 bits 1-2 (SSE, AVX state) and 5-7
// (opmask, ZMM0-15 upper halves, ZMM16-31).
#include "engine/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstring>
#include <vector>

namespace leantune {

namespace {

#if defined(__x86_64__)
bool bit(unsigned reg, int n) { return ((reg >> n) & 1u) != 0; }

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures read_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = static_cast<int>((a >> 8) & 0xf);
  const int base_model = static_cast<int>((a >> 4) & 0xf);
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? (static_cast<int>((a >> 16) & 0xf) << 4) + base_model
                : base_model;
  f.sse3 = bit(c, 0);
  const bool osxsave = bit(c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6) == 0x6;
  const bool os_avx512 = (xcr & 0xe6) == 0xe6;
  f.avx = bit(c, 28) && os_avx;
  f.fma = bit(c, 12) && os_avx;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub = a;
    f.avx2 = bit(b, 5) && os_avx;
    f.avx512f = bit(b, 16) && os_avx512;
    f.avx512dq = bit(b, 17) && os_avx512;
    f.avx512cd = bit(b, 28) && os_avx512;
    f.avx512bw = bit(b, 30) && os_avx512;
    f.avx512vl = bit(b, 31) && os_avx512;
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512_bf16 = bit(a, 5) && os_avx512;
    }
  }
  return f;
}
#else
CpuFeatures read_features() { return {}; }
#endif

}  // namespace

std::string CpuFeatures::summary() const {
  std::vector<const char*> have;
  if (avx2) have.push_back("AVX2");
  if (fma) have.push_back("FMA");
  if (avx512f) have.push_back("AVX-512F");
  if (avx512bw) have.push_back("AVX-512BW");
  if (avx512vl) have.push_back("AVX-512VL");
  if (avx512_bf16) have.push_back("AVX512-BF16");
  std::string s = (vendor.empty() ? std::string("unknown CPU") : vendor) + " family " +
                  std::to_string(family) + " model " + std::to_string(model);
  if (!have.empty()) {
    s += " (";
    for (size_t i = 0; i < have.size(); ++i) s += (i ? ", " : "") + std::string(have[i]);
    s += ")";
  }
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_features();
  return f;
}

}  // namespace leantune
