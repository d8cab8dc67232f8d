// 8-bit AdamW, bit-compatible with bitsandbytes' AdamW8bit (transformers' adamw_8bit /
// adamw_bnb_8bit), and the blockwise quantization of its states.
//
// A parameter of at least kOptim8bitMinSize elements keeps both moments as u8 codes in blocks
// of 256 (state1: signed dynamic map kDynamicMap, state2: unsigned map kDynamicMapUnsigned)
// with one f32 absmax per block: 2 bytes + 8/256 per element. Smaller parameters keep f32
// moments (bnb's min_8bit_size). There is no f32 master copy: the parameter is read as f32,
// updated, and rounded back to its dtype (as bnb does; a bf16 parameter with stochastic rounding
// by default, AdamW8bitOptions), so a bf16 model costs about 2 bytes of optimizer state per
// parameter.
//
// One step of an 8-bit parameter, per element in f32, operation for operation as bnb's CPU
// optimizer_update_8bit_blockwise (fma(a, b, c) is one rounding, as torch's vectorised add with
// alpha and addcmul):
//   g = f32(grad) * f32(grad_scale)
//   m = kDynamicMap[q1] * absmax1[b];  v = kDynamicMapUnsigned[q2] * absmax2[b]
//   m = fma(g, f32(1 - b1), m * f32(b1));  v = fma(f32(1 - b2) * g, g, v * f32(b2))
//   denom = sqrt(v) / f32(sqrt(1 - b2^t)) + f32(eps)
//   p = p * f32(1 - lr wd)             (only when wd > 0)
//   p = p + (f32(-lr / (1 - b1^t)) * m) / denom
// then m and v are requantized per block: absmax = max |x| over the block; a full block scales
// by f32(1 / max(absmax, 1e-38)) and stores absmax; a short last block divides by
// a = max(absmax, 1e-38) and stores a; the scaled value is clamped to [-1, 1] and its code is
// the number of f32 midpoints (map[i] + map[i+1]) / 2 below it (bnb's default kernel and its
// CUDA kernel: the nearest code, ties to the lower one).
// A parameter below the size threshold follows bnb's optimizer_update_32bit:
//   m, v as above (f32 states);  p = p * f32(1 - lr wd) (wd > 0)
//   p = fma(m / (sqrt(v) + f32(eps sqrt(1 - b2^t))), f32(-lr sqrt(1 - b2^t) / (1 - b1^t)), p)
// Fixtures: tests/fixtures/gen_optim_fixtures.py (bitsandbytes 0.50.2).
// Devices: CPU (OpenMP over blocks) and CUDA (adamw8bit_step_cuda, one thread block per 256
// elements), same operations and rounding.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/optim.h"
#include "engine/stream.h"
#include "engine/tensor.h"

namespace leantune::kernels {

inline constexpr int64_t kOptim8bitBlock = 256;
inline constexpr int64_t kOptim8bitMinSize = 4096;
// Paged optimizers stage the states through the device in slabs of this many elements (a
// multiple of kOptim8bitBlock): 16 MiB of 8-bit states, 64 MiB of 32-bit ones per slab.
inline constexpr int64_t kPagedSlabElements = int64_t{8} << 20;
extern const float kDynamicMapUnsigned[256];

// x f32 [n] (host) -> q u8 [n], absmax f32 [ceil(n / 256)], with the signed (state1) or
// unsigned (state2) map, by the rule above. dequantize: out[i] = map[q[i]] * absmax[i / 256].
void optim8_quantize(const Tensor& x, bool signed_map, const Tensor& q, const Tensor& absmax);
void optim8_dequantize(const Tensor& q, const Tensor& absmax, bool signed_map, const Tensor& out);

// One parameter's view of the step. 8-bit: state1/state2 u8 [n], absmax1/absmax2 f32 [blocks].
// 32-bit: state1/state2 f32 [n], absmax undefined. param f32/bf16/f16, grad any float dtype.
// stochastic_round: a bf16 param is written back with stochastic rounding, its random bits
// optim_random_bits(seed, step, index_offset + i) for element i of the view (index_offset: where
// the view starts in the whole parameter, so slabs draw the parameter's bits).
struct Adam8Tensor {
  Tensor param;
  Tensor grad;
  Tensor state1;
  Tensor state2;
  Tensor absmax1;
  Tensor absmax2;
  double weight_decay = 0.0;
  bool stochastic_round = false;
  uint64_t seed = 0;
  int64_t index_offset = 0;
};

// 32 random bits for element i of a parameter at an optimizer step: splitmix64's finaliser of
// (seed, step, i), a counter-based generator, so any thread, slab or device draws the same bits.
LT_HD uint32_t optim_random_bits(uint64_t seed, int64_t step, int64_t i) {
  uint64_t z = seed ^ (static_cast<uint64_t>(step) << 40) ^ static_cast<uint64_t>(i);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 32);
}

// Stochastic rounding of an f32 (bits u) to bf16: the 16 dropped bits plus 16 random bits carry
// into the kept ones with probability dropped / 2^16, so the rounding is unbiased. NaN and
// infinity round as bf16_from_bits32 does.
LT_HD uint16_t bf16_stochastic_from_bits32(uint32_t u, uint32_t r) {
  if ((u & 0x7f800000u) == 0x7f800000u) return bf16_from_bits32(u);
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// The step's scalars in f32, shared by the CPU and CUDA paths: each formed in double, then
// rounded once. c1 = 1 - beta1^step, c2 = sqrt(1 - beta2^step); omb = 1 - beta; step_size =
// -lr / c1 (8-bit update); eps_c2 = eps c2 and step_size32 = -lr c2 / c1 (32-bit update); gs the
// gradient scale.
struct AdamScalars {
  float b1, omb1, b2, omb2, c2, eps, step_size, gs, eps_c2, step_size32;
};

inline AdamScalars adam_scalars(const AdamWStepArgs& a) {
  const double c1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double c2 = std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step)));
  return AdamScalars{static_cast<float>(a.beta1),    static_cast<float>(1.0 - a.beta1),
                     static_cast<float>(a.beta2),    static_cast<float>(1.0 - a.beta2),
                     static_cast<float>(c2),         static_cast<float>(a.eps),
                     static_cast<float>(-a.lr / c1), static_cast<float>(a.grad_scale),
                     static_cast<float>(a.eps * c2), static_cast<float>(-a.lr * c2 / c1)};
}

void adamw8bit_step(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args);
void adamw8bit_step_cpu(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args);
void adamw8bit_step_cuda(const std::vector<Adam8Tensor>& tensors, const AdamWStepArgs& args);

// eight_bit false: every parameter takes the 32-bit path (bnb's AdamW with optim_bits=32).
// paged (bnb's paged optimizers; transformers' paged_adamw_8bit / paged_adamw_32bit): the states
// of a parameter on a CUDA device live in pinned host memory (tag kOptimizer on the pinned
// allocator) and are paged through the device in slabs of slab_elements for the step
// (PagedStates: two staging buffers, the copy of the next slab overlapping the update of this
// one). Per element the step is the unpaged one. On the host there is nothing to page: states
// in ordinary host memory, the unpaged step, unless stage_on_host, which runs the same staging
// pipeline with host buffers (the CPU twin of the CUDA path, for tests).
// stochastic_round: bf16 parameters (which have no f32 master) are written back with stochastic
// rounding, so that updates below half a bf16 ulp still move them in expectation (torchao's
// bf16_stochastic_round). bitsandbytes rounds to nearest; on the tiny model's 200 bf16 steps
// that ends 32% above adamw_torch, stochastic rounding within 2%. f16 and f32 parameters round to
// nearest. Each parameter's seed is an FNV-1a hash of its name: runs and resumes are
// reproducible.
struct AdamW8bitOptions {
  bool eight_bit = true;
  bool paged = false;
  int64_t slab_elements = kPagedSlabElements;  // a multiple of kOptim8bitBlock
  bool stage_on_host = false;
  bool stochastic_round = true;
};

// The staging pipeline (optim_8bit_paged.cpp). step(): `host` holds each parameter's view with
// its states in host memory and param/grad on `device`; each is updated in slabs of `slab`
// elements staged on `device`, the states written back to the host asynchronously. wait()
// blocks until the last write-back has landed (before the host states are read or written).
class PagedStates {
 public:
  void step(const std::vector<Adam8Tensor>& host, const AdamWStepArgs& args, Device device,
            int64_t slab);
  void wait() const;

 private:
  std::unique_ptr<Event> done_;
};

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<Param> params, AdamWConfig cfg, AdamW8bitOptions opt = {});
  // Waits for the last write-back of paged states (host memory the copies still target).
  ~AdamW8bit() override;
  size_t num_params() const override { return params_.size(); }
  const Param& param(size_t i) const override { return params_[i]; }
  // "<name>.state1", "<name>.state2", and for 8-bit parameters "<name>.absmax1/.absmax2".
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) override;
  int64_t state_bytes() const override;
  // Row blocks must start and end on the 256-element blocks of 8-bit states (or at the end).
  bool supports_row_updates() const override { return true; }
  void update_rows(size_t i, int64_t row0, const Tensor& grad_rows, double lr) override;

 private:
  void update(const std::vector<size_t>& which, double lr, double grad_scale) override;
  void ensure_state(size_t i);
  // Runs the step on tensors (direct, or through the paging pipeline when staged).
  void run(std::vector<Adam8Tensor> tensors, const AdamWStepArgs& args);
  // Whether the states of a parameter on d are staged (paged and on a device, or stage_on_host).
  bool staged(Device d) const;
  std::vector<Param> params_;
  AdamWConfig cfg_;
  AdamW8bitOptions opt_;
  std::vector<Adam8Tensor> state_;
  PagedStates paging_;
};

}  // namespace leantune::kernels
