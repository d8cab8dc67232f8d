// The same-dtype naive computations of flash-attention's rule (see naive.h).
#include "backend/naive.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/dtype.h"

namespace leantune::backend_test {

double round_to(double x, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(static_cast<float>(x)));
  if (dt == DType::kF32) return static_cast<float>(x);
  return x;
}

NaiveAttention naive_attention(const Tensor& qt, const Tensor& kt, const Tensor& vt,
                               const Tensor& gt, const std::vector<int64_t>& cq,
                               const std::vector<int64_t>& ck, bool causal, DType dt,
                               int64_t window) {
  auto r = [dt](double x) { return round_to(x, dt); };
  const std::vector<double> q = qt.to_f64(), k = kt.to_f64(), v = vt.to_f64(), g = gt.to_f64();
  const int64_t hq = qt.size(1), hk = kt.size(1), d = qt.size(2), group = hq / hk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  NaiveAttention n;
  n.out.assign(q.size(), 0.0);
  n.dq.assign(q.size(), 0.0);
  std::vector<double> dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (size_t b = 0; b + 1 < cq.size(); ++b) {
    const int64_t q0 = cq[b], lq = cq[b + 1] - q0, k0 = ck[b], lk = ck[b + 1] - k0;
    if (lq == 0) continue;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      auto qi = [&](int64_t i, int64_t x) { return q[((q0 + i) * hq + h) * d + x]; };
      auto gi = [&](int64_t i, int64_t x) { return g[((q0 + i) * hq + h) * d + x]; };
      auto kj = [&](int64_t j, int64_t x) { return k[((k0 + j) * hk + kh) * d + x]; };
      auto vj = [&](int64_t j, int64_t x) { return v[((k0 + j) * hk + kh) * d + x]; };
      std::vector<double> qs(static_cast<size_t>(lq * d));
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) qs[i * d + x] = r(qi(i, x) * scale);
      std::vector<double> a(static_cast<size_t>(lq * lk), 0.0);
      for (int64_t i = 0; i < lq; ++i) {
        // Row i sees keys [lo, vis).
        const int64_t vis = causal ? std::clamp<int64_t>(i + lk - lq + 1, 0, lk) : lk;
        const int64_t lo = causal && window > 0 ? std::max<int64_t>(0, vis - window) : 0;
        if (vis <= lo) continue;
        std::vector<double> s(static_cast<size_t>(lk), neg_inf);
        double m = neg_inf;
        for (int64_t j = lo; j < vis; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d; ++x) acc += qs[i * d + x] * kj(j, x);
          s[j] = r(acc);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = lo; j < vis; ++j) sum += std::exp(s[j] - m);
        for (int64_t j = lo; j < vis; ++j) a[i * lk + j] = r(std::exp(s[j] - m) / sum);
      }
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < lk; ++j) acc += a[i * lk + j] * vj(j, x);
          n.out[((q0 + i) * hq + h) * d + x] = r(acc);
        }
      std::vector<double> ds(static_cast<size_t>(lq * lk), 0.0);
      for (int64_t i = 0; i < lq; ++i) {
        std::vector<double> da(static_cast<size_t>(lk), 0.0);
        double dot = 0;
        for (int64_t j = 0; j < lk; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < d; ++x) acc += gi(i, x) * vj(j, x);
          da[j] = r(acc);
          dot += da[j] * a[i * lk + j];
        }
        for (int64_t j = 0; j < lk; ++j) ds[i * lk + j] = r(a[i * lk + j] * (da[j] - dot));
      }
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < lk; ++j) acc += ds[i * lk + j] * kj(j, x);
          n.dq[((q0 + i) * hq + h) * d + x] = r(r(acc) * scale);
        }
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t x = 0; x < d; ++x) {
          double acck = 0, accv = 0;
          for (int64_t i = 0; i < lq; ++i) {
            acck += ds[i * lk + j] * qs[i * d + x];
            accv += a[i * lk + j] * gi(i, x);
          }
          dk_sum[((k0 + j) * hk + kh) * d + x] += r(acck);
          dv_sum[((k0 + j) * hk + kh) * d + x] += r(accv);
        }
    }
  }
  n.dk.resize(k.size());
  n.dv.resize(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    n.dk[i] = r(dk_sum[i]);
    n.dv[i] = r(dv_sum[i]);
  }
  return n;
}

NaiveLinearCrossEntropy naive_linear_cross_entropy(const Tensor& hidden, const Tensor& weight,
                                                   const std::vector<int64_t>& targets,
                                                   double scale, DType dt) {
  auto r = [dt](double x) { return round_to(x, dt); };
  const std::vector<double> x = hidden.to_f64(), w = weight.to_f64();
  const int64_t t = hidden.size(0), h = hidden.size(1), v = weight.size(0);
  NaiveLinearCrossEntropy n;
  n.dhidden.assign(static_cast<size_t>(t * h), 0.0);
  std::vector<double> dw(static_cast<size_t>(v * h), 0.0), z(static_cast<size_t>(v));
  for (int64_t i = 0; i < t; ++i) {
    if (targets[i] < 0) continue;
    const double* xi = x.data() + i * h;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < v; ++j) {
      const double* wj = w.data() + j * h;
      double acc = 0;
      for (int64_t k = 0; k < h; ++k) acc += xi[k] * wj[k];
      z[j] = r(acc);
      m = std::max(m, z[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(z[j] - m);
    double* dh = n.dhidden.data() + i * h;
    for (int64_t j = 0; j < v; ++j) {
      const double g = r((std::exp(z[j] - m) / sum - (j == targets[i] ? 1.0 : 0.0)) * scale);
      if (g == 0.0) continue;
      const double* wj = w.data() + j * h;
      double* dwj = dw.data() + j * h;
      for (int64_t k = 0; k < h; ++k) {
        dh[k] += g * wj[k];
        dwj[k] += g * xi[k];
      }
    }
    for (int64_t k = 0; k < h; ++k) dh[k] = r(dh[k]);
  }
  n.dweight.resize(dw.size());
  for (size_t i = 0; i < dw.size(); ++i) n.dweight[i] = r(dw[i]);
  return n;
}

namespace {

// r(log_softmax(r(x W_i^T / T))) of row x over the V rows of w, each logit rounded.
std::vector<double> naive_log_probs(const double* x, const std::vector<double>& w, int64_t v,
                                    int64_t h, double inv_t, DType dt) {
  std::vector<double> z(static_cast<size_t>(v));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < v; ++j) {
    double acc = 0;
    for (int64_t k = 0; k < h; ++k) acc += x[k] * w[j * h + k];
    z[j] = round_to(round_to(acc, dt) * inv_t, dt);
    m = std::max(m, z[j]);
  }
  double sum = 0;
  for (double zj : z) sum += std::exp(zj - m);
  const double lse = m + std::log(sum);
  for (double& zj : z) zj = round_to(zj - lse, dt);
  return z;
}

}  // namespace

NaiveLinearDivergence naive_linear_divergence(const Tensor& xs, const Tensor& ws, const Tensor& xt,
                                              const Tensor& wt, const std::vector<int64_t>& mask,
                                              double beta, double temperature,
                                              const std::vector<double>& coef, DType dt) {
  const std::vector<double> x = xs.to_f64(), w = ws.to_f64(), y = xt.to_f64(), u = wt.to_f64();
  const int64_t n = xs.size(0), h = xs.size(1), ht = xt.size(1), v = ws.size(0);
  NaiveLinearDivergence out;
  out.dhidden.assign(static_cast<size_t>(n * h), 0.0);
  std::vector<double> g(static_cast<size_t>(v));
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i] == 0) continue;
    const std::vector<double> ls = naive_log_probs(x.data() + i * h, w, v, h, 1 / temperature, dt);
    const std::vector<double> lt =
        naive_log_probs(y.data() + i * ht, u, v, ht, 1 / temperature, dt);
    double kl = 0;  // the KL the gradient subtracts: KL(p_s || p_t), or KL(p_s || m)
    for (int64_t j = 0; j < v; ++j) {
      const double ps = std::exp(ls[j]), pt = std::exp(lt[j]);
      if (beta == 0) {
        g[j] = ps - pt;
        continue;
      }
      const double lm = beta == 1 ? lt[j] : std::log((1 - beta) * ps + beta * pt);
      kl += ps * (ls[j] - lm);
      g[j] = lm;
    }
    for (int64_t j = 0; j < v; ++j) {
      if (beta != 0) g[j] = (beta == 1 ? 1 : 1 - beta) * std::exp(ls[j]) * (ls[j] - g[j] - kl);
      g[j] = round_to(g[j] * coef[i] / temperature, dt);
    }
    double* dh = out.dhidden.data() + i * h;
    for (int64_t j = 0; j < v; ++j)
      for (int64_t k = 0; k < h; ++k) dh[k] += g[j] * w[j * h + k];
    for (int64_t k = 0; k < h; ++k) dh[k] = round_to(dh[k], dt);
  }
  return out;
}

}  // namespace leantune::backend_test
