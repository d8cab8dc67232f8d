// 8-bit AdamW (bitsandbytes AdamW8bit): the CPU step, the standalone blockwise quantization of
// its states and the optimizer object. The arithmetic contract is in optim_8bit.h.
// Scratch: none; each 256-element block is dequantized, updated and requantized in registers
// (a thread's stack arrays), blocks in parallel.
#include "kernels/optim_8bit.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <unordered_map>

#include "engine/cpu_kernels.h"
#include "engine/ops.h"
#include "kernels/quant.h"

namespace leantune::kernels {

// bitsandbytes 0.50.2 create_dynamic_map(signed=False): the map of AdamW8bit's second moment
// (tests/fixtures/optim/adamw8bit.safetensors qmap2 checks it).
const float kDynamicMapUnsigned[256] = {0.0f,
                                        0x1.5cf754p-22f,
                                        0x1.a01330p-21f,
                                        0x1.1d3670p-19f,
                                        0x1.2599ecp-18f,
                                        0x1.bc98a2p-18f,
                                        0x1.29cbaap-17f,
                                        0x1.0624dcp-16f,
                                        0x1.c2e340p-16f,
                                        0x1.3fd0d0p-15f,
                                        0x1.9e3000p-15f,
                                        0x1.fc8f34p-15f,
                                        0x1.2d7732p-14f,
                                        0x1.5ca6c8p-14f,
                                        0x1.8bd662p-14f,
                                        0x1.0cb296p-13f,
                                        0x1.82a994p-13f,
                                        0x1.f8a092p-13f,
                                        0x1.374bc8p-12f,
                                        0x1.724744p-12f,
                                        0x1.ad42c6p-12f,
                                        0x1.e83e44p-12f,
                                        0x1.119ce2p-11f,
                                        0x1.2f1aa0p-11f,
                                        0x1.4c9860p-11f,
                                        0x1.6a1620p-11f,
                                        0x1.8793dep-11f,
                                        0x1.a511a0p-11f,
                                        0x1.c28f5ep-11f,
                                        0x1.e00d1cp-11f,
                                        0x1.fd8adcp-11f,
                                        0x1.2b020cp-10f,
                                        0x1.74bc6ap-10f,
                                        0x1.be76c8p-10f,
                                        0x1.041894p-9f,
                                        0x1.28f5c2p-9f,
                                        0x1.4dd2f0p-9f,
                                        0x1.72b020p-9f,
                                        0x1.978d4ep-9f,
                                        0x1.bc6a80p-9f,
                                        0x1.e147aep-9f,
                                        0x1.03126ep-8f,
                                        0x1.158104p-8f,
                                        0x1.27ef9ep-8f,
                                        0x1.3a5e34p-8f,
                                        0x1.4cccccp-8f,
                                        0x1.5f3b64p-8f,
                                        0x1.71a9fap-8f,
                                        0x1.841894p-8f,
                                        0x1.96872ap-8f,
                                        0x1.a8f5c2p-8f,
                                        0x1.bb645cp-8f,
                                        0x1.cdd2f0p-8f,
                                        0x1.e0418ap-8f,
                                        0x1.f2b01ep-8f,
                                        0x1.028f5cp-7f,
                                        0x1.0bc6a8p-7f,
                                        0x1.14fdf2p-7f,
                                        0x1.1e3540p-7f,
                                        0x1.276c8ap-7f,
                                        0x1.30a3d6p-7f,
                                        0x1.39db24p-7f,
                                        0x1.43126ep-7f,
                                        0x1.5eb854p-7f,
                                        0x1.8ccccep-7f,
                                        0x1.bae146p-7f,
                                        0x1.e8f5c4p-7f,
                                        0x1.0b851ep-6f,
                                        0x1.228f5ep-6f,
                                        0x1.39999ap-6f,
                                        0x1.50a3d6p-6f,
                                        0x1.67ae16p-6f,
                                        0x1.7eb852p-6f,
                                        0x1.95c28ep-6f,
                                        0x1.accccep-6f,
                                        0x1.c3d70ep-6f,
                                        0x1.dae146p-6f,
                                        0x1.f1eb86p-6f,
                                        0x1.047ae0p-5f,
                                        0x1.100000p-5f,
                                        0x1.1b851ep-5f,
                                        0x1.270a3ep-5f,
                                        0x1.328f5ep-5f,
                                        0x1.3e147ap-5f,
                                        0x1.49999ap-5f,
                                        0x1.551eb8p-5f,
                                        0x1.60a3d6p-5f,
                                        0x1.6c28f6p-5f,
                                        0x1.77ae14p-5f,
                                        0x1.833334p-5f,
                                        0x1.8eb850p-5f,
                                        0x1.9a3d70p-5f,
                                        0x1.a5c28ep-5f,
                                        0x1.b147aep-5f,
                                        0x1.bccccep-5f,
                                        0x1.c851eep-5f,
                                        0x1.d3d70ep-5f,
                                        0x1.df5c2ap-5f,
                                        0x1.eae146p-5f,
                                        0x1.f66666p-5f,
                                        0x1.00f5c4p-4f,
                                        0x1.06b854p-4f,
                                        0x1.0c7ae2p-4f,
                                        0x1.123d70p-4f,
                                        0x1.180000p-4f,
                                        0x1.1dc290p-4f,
                                        0x1.238520p-4f,
                                        0x1.2947aep-4f,
                                        0x1.2f0a3ep-4f,
                                        0x1.34cccep-4f,
                                        0x1.3a8f5ep-4f,
                                        0x1.4051ecp-4f,
                                        0x1.46147cp-4f,
                                        0x1.4bd70ap-4f,
                                        0x1.51999ap-4f,
                                        0x1.575c2ap-4f,
                                        0x1.5d1eb8p-4f,
                                        0x1.62e148p-4f,
                                        0x1.68a3d6p-4f,
                                        0x1.6e6666p-4f,
                                        0x1.7428f6p-4f,
                                        0x1.79eb86p-4f,
                                        0x1.7fae16p-4f,
                                        0x1.8570a4p-4f,
                                        0x1.8b3334p-4f,
                                        0x1.90f5c4p-4f,
                                        0x1.96b852p-4f,
                                        0x1.a80000p-4f,
                                        0x1.c4ccccp-4f,
                                        0x1.e1999ap-4f,
                                        0x1.fe6666p-4f,
                                        0x1.0d9998p-3f,
                                        0x1.1c0000p-3f,
                                        0x1.2a6668p-3f,
                                        0x1.38ccccp-3f,
                                        0x1.473334p-3f,
                                        0x1.559998p-3f,
                                        0x1.640000p-3f,
                                        0x1.726668p-3f,
                                        0x1.80ccccp-3f,
                                        0x1.8f3334p-3f,
                                        0x1.9d9998p-3f,
                                        0x1.ac0000p-3f,
                                        0x1.ba6668p-3f,
                                        0x1.c8ccccp-3f,
                                        0x1.d73334p-3f,
                                        0x1.e59998p-3f,
                                        0x1.f40000p-3f,
                                        0x1.013332p-2f,
                                        0x1.086666p-2f,
                                        0x1.0f999ap-2f,
                                        0x1.16ccccp-2f,
                                        0x1.1e0000p-2f,
                                        0x1.253334p-2f,
                                        0x1.2c6666p-2f,
                                        0x1.339998p-2f,
                                        0x1.3accccp-2f,
                                        0x1.420000p-2f,
                                        0x1.493334p-2f,
                                        0x1.506666p-2f,
                                        0x1.579998p-2f,
                                        0x1.5eccccp-2f,
                                        0x1.660000p-2f,
                                        0x1.6d3334p-2f,
                                        0x1.746666p-2f,
                                        0x1.7b9998p-2f,
                                        0x1.82ccccp-2f,
                                        0x1.8a0000p-2f,
                                        0x1.913334p-2f,
                                        0x1.986666p-2f,
                                        0x1.9f9998p-2f,
                                        0x1.a6ccccp-2f,
                                        0x1.ae0000p-2f,
                                        0x1.b53334p-2f,
                                        0x1.bc6666p-2f,
                                        0x1.c39998p-2f,
                                        0x1.caccccp-2f,
                                        0x1.d20000p-2f,
                                        0x1.d93334p-2f,
                                        0x1.e06666p-2f,
                                        0x1.e79998p-2f,
                                        0x1.eeccccp-2f,
                                        0x1.f60000p-2f,
                                        0x1.fd3332p-2f,
                                        0x1.023334p-1f,
                                        0x1.05ccccp-1f,
                                        0x1.096666p-1f,
                                        0x1.0d0000p-1f,
                                        0x1.109998p-1f,
                                        0x1.143334p-1f,
                                        0x1.17ccccp-1f,
                                        0x1.1b6668p-1f,
                                        0x1.1f0000p-1f,
                                        0x1.22999ap-1f,
                                        0x1.263334p-1f,
                                        0x1.29ccccp-1f,
                                        0x1.2d6668p-1f,
                                        0x1.310000p-1f,
                                        0x1.34999ap-1f,
                                        0x1.383334p-1f,
                                        0x1.3bccccp-1f,
                                        0x1.3f6668p-1f,
                                        0x1.430000p-1f,
                                        0x1.46999ap-1f,
                                        0x1.4a3334p-1f,
                                        0x1.4dccccp-1f,
                                        0x1.516668p-1f,
                                        0x1.550000p-1f,
                                        0x1.58999ap-1f,
                                        0x1.5c3334p-1f,
                                        0x1.5fccccp-1f,
                                        0x1.636668p-1f,
                                        0x1.670000p-1f,
                                        0x1.6a999ap-1f,
                                        0x1.6e3334p-1f,
                                        0x1.71ccccp-1f,
                                        0x1.756668p-1f,
                                        0x1.790000p-1f,
                                        0x1.7c999ap-1f,
                                        0x1.803334p-1f,
                                        0x1.83ccccp-1f,
                                        0x1.876668p-1f,
                                        0x1.8b0000p-1f,
                                        0x1.8e9998p-1f,
                                        0x1.923334p-1f,
                                        0x1.95ccccp-1f,
                                        0x1.996668p-1f,
                                        0x1.9d0000p-1f,
                                        0x1.a09998p-1f,
                                        0x1.a43334p-1f,
                                        0x1.a7ccccp-1f,
                                        0x1.ab6668p-1f,
                                        0x1.af0000p-1f,
                                        0x1.b29998p-1f,
                                        0x1.b63334p-1f,
                                        0x1.b9ccccp-1f,
                                        0x1.bd6668p-1f,
                                        0x1.c10000p-1f,
                                        0x1.c49998p-1f,
                                        0x1.c83334p-1f,
                                        0x1.cbccccp-1f,
                                        0x1.cf6668p-1f,
                                        0x1.d30000p-1f,
                                        0x1.d69998p-1f,
                                        0x1.da3334p-1f,
                                        0x1.ddccccp-1f,
                                        0x1.e16668p-1f,
                                        0x1.e50000p-1f,
                                        0x1.e89998p-1f,
                                        0x1.ec3334p-1f,
                                        0x1.efccccp-1f,
                                        0x1.f36668p-1f,
                                        0x1.f70000p-1f,
                                        0x1.fa9998p-1f,
                                        0x1.fe3334p-1f,
                                        0x1.000000p+0f};

namespace {

struct Midpoints {
  float m[255];
  explicit Midpoints(const float* map) {
    for (int i = 0; i < 255; ++i) m[i] = (map[i] + map[i + 1]) / 2.0f;
  }
};

const Midpoints& midpoints(bool signed_map) {
  static const Midpoints s(kDynamicMap), u(kDynamicMapUnsigned);
  return signed_map ? s : u;
}

// torch.bucketize(x, mids): the number of midpoints strictly below x.
uint8_t code_of(const Midpoints& mids, float x) {
  return static_cast<uint8_t>(std::lower_bound(mids.m, mids.m + 255, x) - mids.m);
}

// Quantizes x[0..len) of one block into q; returns the absmax stored for it.
float quantize_block(const float* x, int64_t len, bool full, const Midpoints& mids, uint8_t* q) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const float clamped = std::max(absmax, 1e-38f);
  const float inv = 1.0f / clamped;
  for (int64_t i = 0; i < len; ++i) {
    const float s = full ? x[i] * inv : x[i] / clamped;
    q[i] = code_of(mids, std::min(std::max(s, -1.0f), 1.0f));
  }
  return full ? absmax : clamped;
}

struct Consts : AdamScalars {
  int64_t step;
};

// The updated parameter value written back: stochastically rounded for a bf16 param when the
// tensor asks for it, else rounded to nearest.
template <typename P>
inline void store_param(P* p, int64_t i, float w, const Adam8Tensor& t, int64_t step) {
  if constexpr (std::is_same_v<P, bf16_t>) {
    if (t.stochastic_round) {
      p[i].bits = bf16_stochastic_from_bits32(f32_bits(w),
                                              optim_random_bits(t.seed, step, t.index_offset + i));
      return;
    }
  }
  cpu::store(p, i, w);
}

Consts consts_of(const AdamWStepArgs& a) { return Consts{adam_scalars(a), a.step}; }

template <typename P, typename G>
void step_8bit(const Adam8Tensor& t, const Consts& c, float decay) {
  const int64_t n = t.param.numel();
  const int64_t blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
  P* p = static_cast<P*>(t.param.data_ptr());
  const G* g = static_cast<const G*>(t.grad.data_ptr());
  uint8_t* q1 = t.state1.data<uint8_t>();
  uint8_t* q2 = t.state2.data<uint8_t>();
  float* a1 = t.absmax1.data<float>();
  float* a2 = t.absmax2.data<float>();
  const Midpoints& mid1 = midpoints(true);
  const Midpoints& mid2 = midpoints(false);
  const bool wd = t.weight_decay > 0.0;
  cpu::parallel_for(blocks, cpu::grain_for(kOptim8bitBlock * 8), [&](int64_t b) {
    const int64_t start = b * kOptim8bitBlock, len = std::min(kOptim8bitBlock, n - start);
    float m[kOptim8bitBlock], v[kOptim8bitBlock];
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = start + k;
      const float gi = static_cast<float>(cpu::load(g, i)) * c.gs;
      float mi = kDynamicMap[q1[i]] * a1[b];
      float vi = kDynamicMapUnsigned[q2[i]] * a2[b];
      mi = std::fma(gi, c.omb1, mi * c.b1);
      vi = std::fma(c.omb2 * gi, gi, vi * c.b2);
      const float denom = std::sqrt(vi) / c.c2 + c.eps;
      float w = static_cast<float>(cpu::load(p, i));
      if (wd) w = w * decay;
      w = w + (c.step_size * mi) / denom;
      store_param(p, i, w, t, c.step);
      m[k] = mi;
      v[k] = vi;
    }
    const bool full = len == kOptim8bitBlock;
    a1[b] = quantize_block(m, len, full, mid1, q1 + start);
    a2[b] = quantize_block(v, len, full, mid2, q2 + start);
  });
}

template <typename P, typename G>
void step_32bit(const Adam8Tensor& t, const Consts& c, float decay) {
  const int64_t n = t.param.numel();
  P* p = static_cast<P*>(t.param.data_ptr());
  const G* g = static_cast<const G*>(t.grad.data_ptr());
  float* m = t.state1.data<float>();
  float* v = t.state2.data<float>();
  const bool wd = t.weight_decay > 0.0;
  cpu::parallel_for(n, cpu::grain_for(8), [&](int64_t i) {
    const float gi = static_cast<float>(cpu::load(g, i)) * c.gs;
    const float mi = std::fma(gi, c.omb1, m[i] * c.b1);
    const float vi = std::fma(c.omb2 * gi, gi, v[i] * c.b2);
    m[i] = mi;
    v[i] = vi;
    float w = static_cast<float>(cpu::load(p, i));
    if (wd) w = w * decay;
    w = std::fma(mi / (std::sqrt(vi) + c.eps_c2), c.step_size32, w);
    store_param(p, i, w, t, c.step);
  });
}

void check_tensor(const Adam8Tensor& t) {
  const int64_t n = t.param.numel();
  LT_CHECK(t.param.is_contiguous() && t.grad.is_contiguous() && t.grad.numel() == n &&
               (t.param.dtype() == DType::kF32 || t.param.dtype() == DType::kBF16 ||
                t.param.dtype() == DType::kF16) &&
               dtype_is_floating(t.grad.dtype()),
           "adamw8bit: param ", t.param.str(), " grad ", t.grad.str());
  const bool q = t.absmax1.defined();
  const DType sdt = q ? DType::kU8 : DType::kF32;
  LT_CHECK(t.state1.dtype() == sdt && t.state2.dtype() == sdt && t.state1.numel() == n &&
               t.state2.numel() == n,
           "adamw8bit: states ", t.state1.str(), ", ", t.state2.str(), " for ", t.param.str());
  if (q) {
    const int64_t blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
    LT_CHECK(t.absmax1.dtype() == DType::kF32 && t.absmax2.dtype() == DType::kF32 &&
                 t.absmax1.numel() == blocks && t.absmax2.numel() == blocks,
             "adamw8bit: absmax ", t.absmax1.str(), ", ", t.absmax2.str(), " for ", t.param.str());
  }
}

}  // namespace

void optim8_quantize(const Tensor& x, bool signed_map, const Tensor& q, const Tensor& absmax) {
  const int64_t n = x.numel(), blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
  LT_CHECK(x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous() &&
               q.device().is_cpu() && q.dtype() == DType::kU8 && q.numel() == n &&
               absmax.device().is_cpu() && absmax.dtype() == DType::kF32 &&
               absmax.numel() == blocks,
           "optim8_quantize: x ", x.str(), " q ", q.str(), " absmax ", absmax.str());
  const float* xp = x.data<float>();
  cpu::parallel_for(blocks, cpu::grain_for(kOptim8bitBlock), [&](int64_t b) {
    const int64_t start = b * kOptim8bitBlock, len = std::min(kOptim8bitBlock, n - start);
    absmax.data<float>()[b] = quantize_block(xp + start, len, len == kOptim8bitBlock,
                                             midpoints(signed_map), q.data<uint8_t>() + start);
  });
}

void optim8_dequantize(const Tensor& q, const Tensor& absmax, bool signed_map, const Tensor& out) {
  const int64_t n = q.numel();
  LT_CHECK(q.device().is_cpu() && q.dtype() == DType::kU8 && out.device().is_cpu() &&
               out.dtype() == DType::kF32 && out.numel() == n && absmax.dtype() == DType::kF32 &&
               absmax.numel() == (n + kOptim8bitBlock - 1) / kOptim8bitBlock,
           "optim8_dequantize: q ", q.str(), " absmax ", absmax.str(), " out ", out.str());
  const float* map = signed_map ? kDynamicMap : kDynamicMapUnsigned;
  const uint8_t* qp = q.data<uint8_t>();
  const float* ap = absmax.data<float>();
  float* op = out.data<float>();
  cpu::parallel_for(n, cpu::grain_for(1),
                    [&](int64_t i) { op[i] = map[qp[i]] * ap[i / kOptim8bitBlock]; });
}

void adamw8bit_step_cpu(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args) {
  LT_CHECK(args.step >= 1, "adamw8bit: step ", args.step, " (1-based)");
  const Consts c = consts_of(args);
  for (const Adam8Tensor& t : tensors) {
    check_tensor(t);
    const float decay = static_cast<float>(1.0 - args.lr * t.weight_decay);
    LT_DISPATCH_FLOAT(t.param.dtype(), P, {
      LT_DISPATCH_FLOAT(t.grad.dtype(), G, {
        if (t.absmax1.defined())
          step_8bit<P, G>(t, c, decay);
        else
          step_32bit<P, G>(t, c, decay);
      });
    });
  }
}

void adamw8bit_step(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args) {
  if (tensors.empty()) return;
  if (tensors[0].param.device().is_cuda()) {
    adamw8bit_step_cuda(tensors, args);
    return;
  }
  adamw8bit_step_cpu(tensors, args);
}

AdamW8bit::AdamW8bit(std::vector<Param> params, AdamWConfig cfg, AdamW8bitOptions opt)
    : params_(std::move(params)), cfg_(cfg), opt_(opt), state_(params_.size()) {
  for (const Param& p : params_)
    LT_CHECK_INPUT(p.tensor.dtype() == DType::kF32 || p.tensor.dtype() == DType::kBF16 ||
                       p.tensor.dtype() == DType::kF16,
                   "adamw_8bit: parameter ", p.name, " is ", dtype_name(p.tensor.dtype()),
                   " (f32, bf16 or f16 only)");
  LT_CHECK(opt_.slab_elements > 0 && opt_.slab_elements % kOptim8bitBlock == 0,
           "adamw_8bit: slab of ", opt_.slab_elements, " elements is not a positive multiple of ",
           kOptim8bitBlock);
}

AdamW8bit::~AdamW8bit() {
  try {
    paging_.wait();
  } catch (const std::exception&) {
    // A failed device cannot finish the copies; nothing is left to protect.
  }
}

void AdamW8bit::ensure_state(size_t i) {
  Adam8Tensor& s = state_[i];
  if (s.state1.defined()) return;
  const Tensor& p = params_[i].tensor;
  const int64_t n = p.numel();
  // Staged states live in pinned host memory, others on the parameter's device.
  const bool pinned = staged(p.device());
  auto zeros = [&](int64_t len, DType dt) {
    Tensor t = pinned ? Tensor::empty_pinned({len}, dt, MemTag::kOptimizer)
                      : Tensor::empty({len}, dt, p.device(), MemTag::kOptimizer);
    t.zero_();
    return t;
  };
  s.param = p;
  s.weight_decay = params_[i].decay ? cfg_.weight_decay : 0.0;
  s.stochastic_round = opt_.stochastic_round && p.dtype() == DType::kBF16;
  uint64_t seed = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (unsigned char ch : params_[i].name) seed = (seed ^ ch) * 0x100000001b3ull;
  s.seed = seed;
  if (opt_.eight_bit && n >= kOptim8bitMinSize) {
    // Zero codes with zero absmax decode to 0, as bnb initialises them.
    const int64_t blocks = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
    s.state1 = zeros(n, DType::kU8);
    s.state2 = zeros(n, DType::kU8);
    s.absmax1 = zeros(blocks, DType::kF32);
    s.absmax2 = zeros(blocks, DType::kF32);
  } else {
    s.state1 = zeros(n, DType::kF32);
    s.state2 = zeros(n, DType::kF32);
  }
}

bool AdamW8bit::staged(Device d) const { return opt_.paged && (!d.is_cpu() || opt_.stage_on_host); }

void AdamW8bit::run(std::vector<Adam8Tensor> tensors, const AdamWStepArgs& args) {
  std::vector<Adam8Tensor> direct, paged;
  for (Adam8Tensor& t : tensors) {
    (staged(t.param.device()) ? paged : direct).push_back(std::move(t));
  }
  adamw8bit_step(direct, args);
  // One pipeline per device (a model lives on one; the loop keeps mixed lists correct).
  while (!paged.empty()) {
    const Device d = paged[0].param.device();
    std::vector<Adam8Tensor> here, rest;
    for (Adam8Tensor& t : paged) (t.param.device() == d ? here : rest).push_back(std::move(t));
    paging_.step(here, args, d, opt_.slab_elements);
    paged = std::move(rest);
  }
}

void AdamW8bit::update(const std::vector<size_t>& which, double lr, double grad_scale) {
  std::vector<Adam8Tensor> batch;
  for (size_t i : which) {
    Tensor g = params_[i].tensor.grad();
    if (!g.defined()) continue;
    ensure_state(i);
    Adam8Tensor t = state_[i];
    t.grad = g.is_contiguous() ? g : g.contiguous();
    batch.push_back(std::move(t));
  }
  run(std::move(batch), AdamWStepArgs{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, step_, grad_scale});
}

void AdamW8bit::update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) {
  ensure_state(i);
  const Adam8Tensor& s = state_[i];
  const Tensor rows = param_rows(s.param, row0, grad_rows, params_[i].name);
  const int64_t n = rows.numel(), total = s.param.numel();
  const int64_t e0 = n == 0 ? 0 : row0 * (total / std::max<int64_t>(s.param.size(0), 1));
  Adam8Tensor t = s;
  t.param = s.param.flatten().narrow(0, e0, n);
  t.grad = (grad_rows.is_contiguous() ? grad_rows : grad_rows.contiguous()).flatten();
  t.index_offset = s.index_offset + e0;
  t.state1 = s.state1.narrow(0, e0, n);
  t.state2 = s.state2.narrow(0, e0, n);
  if (s.absmax1.defined()) {
    LT_CHECK(e0 % kOptim8bitBlock == 0 && (n % kOptim8bitBlock == 0 || e0 + n == total),
             "adamw_8bit: rows [", row0, ", ", row0 + grad_rows.size(0), ") of ", params_[i].name,
             " do not fall on its ", kOptim8bitBlock, "-element state blocks");
    const int64_t b0 = e0 / kOptim8bitBlock, nb = (n + kOptim8bitBlock - 1) / kOptim8bitBlock;
    t.absmax1 = s.absmax1.narrow(0, b0, nb);
    t.absmax2 = s.absmax2.narrow(0, b0, nb);
  }
  run({t}, AdamWStepArgs{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, step_, 1.0});
}

std::vector<std::pair<std::string, Tensor>> AdamW8bit::state_tensors() const {
  paging_.wait();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Adam8Tensor& s = state_[i];
    if (!s.state1.defined()) continue;
    const std::string& name = params_[i].name;
    out.emplace_back(name + ".state1", s.state1);
    out.emplace_back(name + ".state2", s.state2);
    if (s.absmax1.defined()) {
      out.emplace_back(name + ".absmax1", s.absmax1);
      out.emplace_back(name + ".absmax2", s.absmax2);
    }
  }
  return out;
}

void AdamW8bit::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  paging_.wait();
  std::unordered_map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    if (!by_name.count(name + ".state1")) continue;  // never updated before the checkpoint
    ensure_state(i);
    Adam8Tensor& s = state_[i];
    load_state_entry(by_name, name + ".state1", s.state1);
    load_state_entry(by_name, name + ".state2", s.state2);
    if (s.absmax1.defined()) {
      load_state_entry(by_name, name + ".absmax1", s.absmax1);
      load_state_entry(by_name, name + ".absmax2", s.absmax2);
    }
  }
}

int64_t AdamW8bit::state_bytes() const {
  int64_t b = 0;
  for (const Adam8Tensor& s : state_)
    for (const Tensor* t : {&s.state1, &s.state2, &s.absmax1, &s.absmax2})
      if (t->defined()) b += t->nbytes();
  return b;
}

}  // namespace leantune::kernels
