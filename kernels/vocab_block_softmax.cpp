// vocab_block_softmax on the CPU: see the header. One row per task (OpenMP); f32 math for f32
// logits, f64 for f64, exp and log from <cmath>.
#include "kernels/vocab_block_softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/check.h"
#include "engine/cpu_kernels.h"
#include "kernels/cross_entropy.h"

namespace leantune::kernels {

namespace {

void check_block(const char* op, const Tensor& z, const Tensor& targets, int64_t v0,
                 const Tensor& lse) {
  LT_CHECK(
      z.dim() == 2 && (z.dtype() == DType::kF32 || z.dtype() == DType::kF64) && z.is_contiguous(),
      op, ": z ", z.str(), " must be contiguous [T, nb] f32|f64");
  LT_CHECK(targets.dim() == 1 && targets.numel() == z.size(0) && targets.dtype() == DType::kI64 &&
               targets.is_contiguous() && targets.device() == z.device(),
           op, ": targets ", targets.str(), " for z ", z.str(), " (want [T] i64 on its device)");
  LT_CHECK(lse.shape() == (Shape{z.size(0)}) && lse.dtype() == z.dtype() && lse.is_contiguous() &&
               lse.device() == z.device(),
           op, ": lse ", lse.str(), " for z ", z.str());
  LT_CHECK(v0 >= 0, op, ": block start ", v0, " is negative");
}

template <typename A>
void lse_update_rows(const Tensor& z, const int64_t* y, int64_t v0, const Tensor& lse,
                     const Tensor& zy) {
  const int64_t rows = z.size(0), nb = z.size(1);
  const A* pz = static_cast<const A*>(z.data_ptr());
  A* pl = static_cast<A*>(lse.data_ptr());
  A* py = static_cast<A*>(zy.data_ptr());
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  cpu::parallel_for(rows, cpu::grain_for(nb), [&](int64_t r) {
    if (y[r] == kIgnoreIndex || nb == 0) return;
    const A* row = pz + r * nb;
    A m = kNegInf;
    for (int64_t j = 0; j < nb; ++j) m = std::max(m, row[j]);
    double s = 0;  // double: a float running sum over a wide block drops its small terms
    for (int64_t j = 0; j < nb; ++j) s += std::exp(row[j] - m);
    const A b = m + static_cast<A>(std::log(s));
    // logaddexp(lse, b), exact when lse is still -inf (the first block).
    const A hi = std::max(pl[r], b), lo = std::min(pl[r], b);
    pl[r] = lo == kNegInf ? hi : hi + std::log1p(std::exp(lo - hi));
    if (y[r] >= v0 && y[r] < v0 + nb) py[r] = row[y[r] - v0];
  });
}

template <typename A>
void softmax_grad_rows(const Tensor& z, const int64_t* y, int64_t v0, const Tensor& lse,
                       double scale, const Tensor& dz) {
  const int64_t rows = z.size(0), nb = z.size(1);
  const A* pz = static_cast<const A*>(z.data_ptr());
  const A* pl = static_cast<const A*>(lse.data_ptr());
  A* pd = static_cast<A*>(dz.data_ptr());
  const A k = static_cast<A>(scale);
  cpu::parallel_for(rows, cpu::grain_for(nb), [&](int64_t r) {
    const A* row = pz + r * nb;
    A* out = pd + r * nb;
    if (y[r] == kIgnoreIndex) {
      std::fill(out, out + nb, A(0));
      return;
    }
    const A l = pl[r];
    const int64_t t = y[r] - v0;
    for (int64_t j = 0; j < nb; ++j) {
      const A p = std::exp(row[j] - l);
      out[j] = (j == t ? p - A(1) : p) * k;
    }
  });
}

}  // namespace

void vocab_block_lse_update(const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse,
                            const Tensor& zy) {
  const char* op = "vocab_block_lse_update";
  check_block(op, z, targets, v0, lse);
  LT_CHECK(zy.shape() == lse.shape() && zy.dtype() == z.dtype() && zy.is_contiguous() &&
               zy.device() == z.device(),
           op, ": zy ", zy.str(), " for z ", z.str());
  if (z.device().is_cuda()) return vocab_block_lse_update_cuda(z, targets, v0, lse, zy);
  if (z.dtype() == DType::kF64)
    lse_update_rows<double>(z, targets.data<int64_t>(), v0, lse, zy);
  else
    lse_update_rows<float>(z, targets.data<int64_t>(), v0, lse, zy);
}

void vocab_block_softmax_grad(const Tensor& z, const Tensor& targets, int64_t v0, const Tensor& lse,
                              double scale, const Tensor& dz) {
  const char* op = "vocab_block_softmax_grad";
  check_block(op, z, targets, v0, lse);
  LT_CHECK(dz.shape() == z.shape() && dz.dtype() == z.dtype() && dz.is_contiguous() &&
               dz.device() == z.device(),
           op, ": dz ", dz.str(), " for z ", z.str());
  if (z.device().is_cuda()) return vocab_block_softmax_grad_cuda(z, targets, v0, lse, scale, dz);
  if (z.dtype() == DType::kF64)
    softmax_grad_rows<double>(z, targets.data<int64_t>(), v0, lse, scale, dz);
  else
    softmax_grad_rows<float>(z, targets.data<int64_t>(), v0, lse, scale, dz);
}

}  // namespace leantune::kernels
