// divergence_blocks on the CPU: see the header. One row per task (OpenMP); the per-element math
// and the statistics in double whatever the logits' dtype.
#include "kernels/divergence_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/check.h"
#include "kernels/cpu_common.h"

namespace leantune::kernels {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void check_blocks(const char* op, const Tensor& zs, const Tensor& zt, const Tensor& rows,
                  int64_t cols, const DivergenceBlockParams& p) {
  LT_CHECK(zs.dim() == 2 && zs.is_contiguous() &&
               (zs.dtype() == DType::kF32 || zs.dtype() == DType::kF64),
           op, ": zs ", zs.str(), " must be contiguous [c, nb] f32|f64");
  LT_CHECK(zt.shape() == zs.shape() && zt.dtype() == zs.dtype() && zt.is_contiguous() &&
               zt.device() == zs.device(),
           op, ": zt ", zt.str(), " for zs ", zs.str());
  const DType want = zs.device().is_cuda() ? zs.dtype() : DType::kF64;
  LT_CHECK(rows.shape() == (Shape{zs.size(0), cols}) && rows.dtype() == want &&
               rows.is_contiguous() && rows.device() == zs.device(),
           op, ": row table ", rows.str(), " for zs ", zs.str(), " (want [", zs.size(0), ", ", cols,
           "] ", dtype_name(want), ")");
  LT_CHECK(
      p.inv_t > 0 && p.student_softcap >= 0 && p.teacher_softcap >= 0 && p.beta >= 0 && p.beta <= 1,
      op, ": bad parameters");
}

double cap(double y, double softcap) { return softcap > 0 ? softcap * std::tanh(y / softcap) : y; }

double log_mixture(double log_ps, double log_pt, double beta) {
  const double a = log_ps + std::log1p(-beta), b = log_pt + std::log(beta);
  const double top = std::max(a, b);
  return top + std::log(std::exp(a - top) + std::exp(b - top));
}

// Calls f(i, a, b, r) for every row i, with a and b the row's transformed student and teacher
// logits (double, nb each) and r its row of the row table.
template <class F>
void each_row(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
              const Tensor& table, F&& f) {
  const int64_t c = zs.size(0), nb = zs.size(1), w = table.size(1);
  double* tab = table.data<double>();
  LT_DISPATCH_FLOAT(zs.dtype(), T, {
    const T* ps = static_cast<const T*>(zs.data_ptr());
    const T* pt = static_cast<const T*>(zt.data_ptr());
    parallel_for(c, cpu::grain_for(nb), [&](int64_t i) {
      std::vector<double> a(static_cast<size_t>(nb)), b(static_cast<size_t>(nb));
      for (int64_t j = 0; j < nb; ++j) {
        a[j] = cap(static_cast<double>(load(ps, i * nb + j)), p.student_softcap) * p.inv_t;
        b[j] = cap(static_cast<double>(load(pt, i * nb + j)), p.teacher_softcap) * p.inv_t;
      }
      f(i, a.data(), b.data(), tab + i * w);
    });
  });
}

}  // namespace

void divergence_block_stats(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                            const Tensor& stats) {
  check_blocks("divergence_block_stats", zs, zt, stats, kDivStats, p);
  if (zs.device().is_cuda()) return divergence_block_stats_cuda(zs, zt, p, stats);
  const int64_t nb = zs.size(1);
  if (nb == 0) return;
  each_row(zs, zt, p, stats, [&](int64_t, const double* a, const double* b, double* r) {
    const double sm = std::max(r[kSMax], *std::max_element(a, a + nb));
    const double tm = std::max(r[kTMax], *std::max_element(b, b + nb));
    const double sr = r[kSMax] == kNegInf ? 0 : std::exp(r[kSMax] - sm);
    const double tr = r[kTMax] == kNegInf ? 0 : std::exp(r[kTMax] - tm);
    double ss = 0, sz = 0, sg = 0, ts = 0, tg = 0;
    for (int64_t j = 0; j < nb; ++j) {
      const double es = std::exp(a[j] - sm), et = std::exp(b[j] - tm);
      ss += es;
      sz += es * a[j];
      sg += es * (a[j] - b[j]);
      ts += et;
      tg += et * (b[j] - a[j]);
    }
    r[kSSum] = r[kSSum] * sr + ss;
    r[kSZSum] = r[kSZSum] * sr + sz;
    r[kSGap] = r[kSGap] * sr + sg;
    r[kTSum] = r[kTSum] * tr + ts;
    r[kTGap] = r[kTGap] * tr + tg;
    r[kSMax] = sm;
    r[kTMax] = tm;
  });
}

void divergence_block_jsd(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                          const Tensor& stats) {
  check_blocks("divergence_block_jsd", zs, zt, stats, kDivStats, p);
  LT_CHECK(p.beta > 0 && p.beta < 1, "divergence_block_jsd: beta ", p.beta, " must be in (0, 1)");
  if (zs.device().is_cuda()) return divergence_block_jsd_cuda(zs, zt, p, stats);
  const int64_t nb = zs.size(1);
  each_row(zs, zt, p, stats, [&](int64_t, const double* a, const double* b, double* r) {
    const double s_logz = r[kSMax] + std::log(r[kSSum]);
    const double t_logz = r[kTMax] + std::log(r[kTSum]);
    double jsd = 0, kl_s = 0;
    for (int64_t j = 0; j < nb; ++j) {
      const double lps = a[j] - s_logz, lpt = b[j] - t_logz;
      const double lm = log_mixture(lps, lpt, p.beta);
      const double k = std::exp(lps) * (lps - lm);
      kl_s += k;
      jsd += p.beta * std::exp(lpt) * (lpt - lm) + (1 - p.beta) * k;
    }
    r[kJsd] += jsd;
    r[kKlS] += kl_s;
  });
}

void divergence_block_grad(const Tensor& zs, const Tensor& zt, const DivergenceBlockParams& p,
                           const Tensor& rowtab, const Tensor& dz) {
  const char* op = "divergence_block_grad";
  check_blocks(op, zs, zt, rowtab, 4, p);
  LT_CHECK(dz.shape() == zs.shape() && dz.is_contiguous() && dz.device() == zs.device() &&
               (dz.dtype() == zs.dtype() ||
                (zs.device().is_cuda() && zs.dtype() == DType::kF32 && dz.dtype() == DType::kBF16)),
           op, ": dz ", dz.str(), " for zs ", zs.str());
  if (zs.device().is_cuda()) return divergence_block_grad_cuda(zs, zt, p, rowtab, dz);
  const int64_t nb = zs.size(1);
  const int mode = p.beta == 0 ? 0 : p.beta == 1 ? 1 : 2;
  LT_DISPATCH_FLOAT(dz.dtype(), D, {
    D* pd = static_cast<D*>(dz.data_ptr());
    each_row(zs, zt, p, rowtab, [&](int64_t i, const double* a, const double* b, double* r) {
      for (int64_t j = 0; j < nb; ++j) {
        const double lps = a[j] - r[0], lpt = b[j] - r[1];
        const double ps = std::exp(lps);
        double g = mode == 0   ? ps - std::exp(lpt)
                   : mode == 1 ? ps * (lps - lpt - r[2])
                               : (1 - p.beta) * ps * (lps - log_mixture(lps, lpt, p.beta) - r[2]);
        g *= r[3];
        if (p.student_softcap > 0) {
          // a[j] * T / s is tanh(y / s): the capped value gives the derivative.
          const double th = a[j] / (p.inv_t * p.student_softcap);
          g *= 1 - th * th;
        }
        store(pd, i * nb + j, static_cast<acc_t<D>>(g));
      }
    });
  });
}

}  // namespace leantune::kernels
