// Quantized weights on the host, and the dispatch to CUDA. The contract (formats, rounding,
// bitsandbytes parity) is in quant.h.
//
// Quantization follows bitsandbytes' default (torch) kernels operation for operation in f32:
// block absmax, the reciprocal for full blocks and a division for a short last block, a clamp to
// [-1, 1], and torch.bucketize on the f32 midpoints (std::lower_bound over the sorted midpoints
// counts the midpoints strictly below the value). Every block is independent, so blocks run in
// parallel and the result does not depend on the thread count. The nested offset is a serial
// f64 sum. Dequantization computes one f32 product per element (and, nested, one f32 product
// plus one f32 sum per block) and rounds once to the output dtype.
//
// Linear products dequantize W into the per-(device, stream) scratch (kWorkspace) and run
// kernels/linear's dense path; the scratch entry's mutex is held while the call enqueues its
// work, so two host threads never write one buffer at once.
#include "kernels/quant.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "engine/cpu_kernels.h"
#include "engine/ops.h"
#include "engine/profile.h"
#include "kernels/linear.h"

namespace leantune::kernels {

// Values printed from bitsandbytes 0.50.2 (get_4bit_type("nf4"), create_dynamic_map()) as exact
// hexadecimal floats; tests/kernels/test_quant.cpp checks them against the fixture's copies.
const float kNf4Code[16] = {
    -0x1p+0f,        -0x1.647362p-1f, -0x1.0cd66p-1f,  -0x1.94654p-2f,
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,
    0x1.45f5fep-4f,  0x1.4995c6p-3f,  0x1.f809bap-3f,  0x1.5a0674p-2f,
    0x1.c3497p-2f,   0x1.200f56p-1f,  0x1.722766p-1f,  0x1p+0f,
};

const float kDynamicMap[256] = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df999ap-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7accccp-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3332p-3f,  -0x1.de6666p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eep-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f6p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451ebap-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb854p-4f,   0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3334p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626666p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,
    0x1.079998p-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,
    0x1.b46666p-1f,   0x1.bb999ap-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

namespace {

using cpu::parallel_for;

// torch clamps block scales at the Python float 1e-38, which the op rounds to f32.
const float kMinAbsmax = static_cast<float>(1e-38);
// bnb multiplies the int8 row scale by the Python float 1.0 / 127.0, rounded to f32.
const float kInv127 = static_cast<float>(1.0 / 127.0);

// f32 midpoints between consecutive codes, computed as torch does: (c[i] + c[i+1]) / 2 in f32.
template <int N>
struct Midpoints {
  float v[N - 1];
  explicit Midpoints(const float* code) {
    for (int i = 0; i < N - 1; ++i) v[i] = (code[i] + code[i + 1]) / 2.0f;
  }
  // torch.bucketize(s, midpoints, right=False): how many midpoints lie strictly below s.
  uint8_t code_of(float s) const {
    return static_cast<uint8_t>(std::lower_bound(v, v + N - 1, s) - v);
  }
};
const Midpoints<16>& nf4_midpoints() {
  static const Midpoints<16> m(kNf4Code);
  return m;
}
const Midpoints<256>& dynamic_midpoints() {
  static const Midpoints<256> m(kDynamicMap);
  return m;
}

// A product rounded to f32 before it is used: keeps a compiler that contracts across
// statements (GCC's -ffp-contract=fast on targets with FMA) from fusing it with the next sum,
// which would differ from bitsandbytes' two roundings.
inline float rounded(float v) {
  volatile float t = v;
  return t;
}

// One block as bnb's default quantize kernels do it. load(i) gives element i as f32. Returns the
// absmax to store: the raw one for a full block, the clamped one for a short last block.
template <int N, typename Load>
float quantize_block(int64_t len, bool full, const Midpoints<N>& mid, Load&& load, uint8_t* codes) {
  float am = 0.0f;
  for (int64_t i = 0; i < len; ++i) am = std::max(am, std::fabs(load(i)));
  auto clamp1 = [](float s) { return std::min(std::max(s, -1.0f), 1.0f); };
  if (full) {
    const float inv = 1.0f / std::max(am, kMinAbsmax);
    for (int64_t i = 0; i < len; ++i) codes[i] = mid.code_of(clamp1(load(i) * inv));
    return am;
  }
  const float c = std::max(am, kMinAbsmax);
  for (int64_t i = 0; i < len; ++i) codes[i] = mid.code_of(clamp1(load(i) / c));
  return c;
}

// Loop items below which parallel_for stays serial (about 32K elements of work).
std::string weight_label(const Tensor& w) {
  return w.name().empty() ? w.str() : "'" + w.name() + "' " + w.str();
}

void check_out(const Tensor& out, int64_t n, Device d, const char* op) {
  LT_CHECK(out.defined() && out.numel() == n && out.is_contiguous() &&
               dtype_is_floating(out.dtype()) && out.device() == d,
           op, ": out ", out.defined() ? out.str() : "undefined", " must be a contiguous float ",
           "tensor of ", n, " elements on ", d.str());
}

// ---------------------------------------------------------------- the dequantization scratch

struct ScratchEntry {
  std::mutex mu;
  Tensor buf;  // u8, kWorkspace
};
using ScratchKey = std::tuple<int, int, uint64_t>;  // device type, index, stream id

std::mutex& scratch_mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
// Never destroyed: entries may hold device memory whose allocator outlives static destructors
// only by accident, and the buffers are reused for the life of the process anyway.
std::map<ScratchKey, std::unique_ptr<ScratchEntry>>& scratch_table() {
  static auto* t = new std::map<ScratchKey, std::unique_ptr<ScratchEntry>>;
  return *t;
}

// Exclusive use of the current stream's scratch on `device`, at least `bytes` long.
class ScratchLease {
 public:
  ScratchLease(Device device, int64_t bytes) : device_(device) {
    const Stream s = current_stream(device);
    ScratchEntry* e;
    {
      std::lock_guard<std::mutex> g(scratch_mu());
      auto& slot = scratch_table()[ScratchKey(static_cast<int>(device.type), device.index, s.id)];
      if (!slot) slot = std::make_unique<ScratchEntry>();
      e = slot.get();
    }
    lock_ = std::unique_lock<std::mutex>(e->mu);
    if (!e->buf.defined() || e->buf.numel() < bytes) {
      e->buf = Tensor();  // give the old block back before asking for the larger one
      e->buf = Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::kU8, device, MemTag::kWorkspace);
    }
    buf_ = e->buf;
  }
  // The scratch seen as a contiguous tensor (no autograd, storage kept alive by the view).
  Tensor view(const Shape& shape, DType dtype) const {
    return Tensor::from_blob(buf_.data_ptr(), shape, dtype, device_, buf_.storage());
  }

 private:
  Device device_;
  std::unique_lock<std::mutex> lock_;
  Tensor buf_;
};

void check_linear_x(const char* op, const Tensor& x, int64_t in, Device wd) {
  LT_CHECK(x.defined() && x.dim() == 2 && x.size(1) == in && dtype_is_floating(x.dtype()), op,
           ": x ", x.defined() ? x.str() : "undefined", " for a weight with ", in,
           " input features");
  LT_CHECK(x.device() == wd, op, ": x ", x.str(), " and the weight (", wd.str(),
           ") are on different devices");
}

}  // namespace

// ---------------------------------------------------------------- formats

int64_t Nf4Weight::storage_bytes() const {
  int64_t b = static_cast<int64_t>(packed.nbytes());
  if (nested())
    b += static_cast<int64_t>(qabsmax.nbytes() + absmax2.nbytes() + sizeof(offset));
  else if (absmax.defined())
    b += static_cast<int64_t>(absmax.nbytes());
  return b;
}

Nf4Weight Nf4Weight::to(Device device, MemTag tag) const {
  auto move = [&](const Tensor& t) {
    return t.defined() ? t.to(device, t.dtype(), tag) : Tensor();
  };
  Nf4Weight w;
  w.shape = shape;
  w.packed = move(packed);
  w.absmax = move(absmax);
  w.qabsmax = move(qabsmax);
  w.absmax2 = move(absmax2);
  w.offset = offset;
  return w;
}

int64_t Int8Weight::storage_bytes() const {
  return static_cast<int64_t>(q.nbytes() + absmax.nbytes());
}

Int8Weight Int8Weight::to(Device device, MemTag tag) const {
  return {q.to(device, q.dtype(), tag), absmax.to(device, absmax.dtype(), tag)};
}

void check_nf4(const Nf4Weight& w, const char* op) {
  const int64_t n = w.numel(), blocks = w.num_blocks();
  LT_CHECK(w.packed.defined() && w.packed.dtype() == DType::kU8 && w.packed.is_contiguous() &&
               w.packed.numel() == (n + 1) / 2,
           op, ": NF4 packed data ", w.packed.defined() ? w.packed.str() : "undefined",
           " must be contiguous u8 of ", (n + 1) / 2, " bytes for shape ", shape_str(w.shape));
  const Device d = w.packed.device();
  auto part = [&](const Tensor& t, DType dt, int64_t len, const char* name) {
    LT_CHECK(
        t.defined() && t.dtype() == dt && t.is_contiguous() && t.numel() == len && t.device() == d,
        op, ": NF4 ", name, " ", t.defined() ? t.str() : "undefined", " must be contiguous ",
        dtype_name(dt), " of ", len, " elements on ", d.str());
  };
  if (w.nested()) {
    part(w.qabsmax, DType::kU8, blocks, "qabsmax");
    part(w.absmax2, DType::kF32, (blocks + kNestedBlockSize - 1) / kNestedBlockSize, "absmax2");
    LT_CHECK(std::isfinite(w.offset), op, ": NF4 nested offset ", w.offset);
  } else {
    part(w.absmax, DType::kF32, blocks, "absmax");
  }
}

void check_int8(const Int8Weight& w, const char* op) {
  LT_CHECK(w.q.defined() && w.q.dtype() == DType::kI8 && w.q.dim() == 2 && w.q.is_contiguous(), op,
           ": int8 weight ", w.q.defined() ? w.q.str() : "undefined", " must be contiguous 2-D i8");
  LT_CHECK(w.absmax.defined() && w.absmax.dtype() == DType::kF32 && w.absmax.is_contiguous() &&
               w.absmax.numel() == w.q.size(0) && w.absmax.device() == w.q.device(),
           op, ": int8 row absmax ", w.absmax.defined() ? w.absmax.str() : "undefined",
           " must be contiguous f32 [", w.q.size(0), "] on ", w.q.device().str());
}

// ---------------------------------------------------------------- quantization

void dynamic8_quantize(const Tensor& x, int64_t blocksize, const Tensor& q, const Tensor& absmax) {
  const int64_t n = x.numel();
  LT_CHECK(blocksize > 0, "dynamic8_quantize: blocksize ", blocksize);
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  LT_CHECK(x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous(),
           "dynamic8_quantize: x ", x.str(), " must be contiguous f32 on the host");
  LT_CHECK(q.device().is_cpu() && q.dtype() == DType::kU8 && q.is_contiguous() && q.numel() == n,
           "dynamic8_quantize: q ", q.str(), " for x ", x.str());
  LT_CHECK(absmax.device().is_cpu() && absmax.dtype() == DType::kF32 && absmax.is_contiguous() &&
               absmax.numel() == blocks,
           "dynamic8_quantize: absmax ", absmax.str(), " for ", blocks, " blocks");
  const float* xp = x.data<float>();
  uint8_t* qp = q.data<uint8_t>();
  float* ap = absmax.data<float>();
  const bool ragged = n % blocksize != 0;
  parallel_for(blocks, cpu::grain_for(blocksize), [&](int64_t b) {
    const int64_t start = b * blocksize, len = std::min(blocksize, n - start);
    const bool full = !(ragged && b == blocks - 1);
    ap[b] = quantize_block(
        len, full, dynamic_midpoints(), [&](int64_t i) { return xp[start + i]; }, qp + start);
  });
}

void dynamic8_dequantize(const Tensor& q, const Tensor& absmax, int64_t blocksize,
                         const Tensor& out) {
  const int64_t n = q.numel();
  LT_CHECK(blocksize > 0 && q.device().is_cpu() && q.dtype() == DType::kU8 && q.is_contiguous(),
           "dynamic8_dequantize: q ", q.str());
  LT_CHECK(absmax.device().is_cpu() && absmax.dtype() == DType::kF32 && absmax.is_contiguous() &&
               absmax.numel() == (n + blocksize - 1) / blocksize,
           "dynamic8_dequantize: absmax ", absmax.str());
  LT_CHECK(out.device().is_cpu() && out.dtype() == DType::kF32 && out.is_contiguous() &&
               out.numel() == n,
           "dynamic8_dequantize: out ", out.str());
  const uint8_t* qp = q.data<uint8_t>();
  const float* ap = absmax.data<float>();
  float* op = out.data<float>();
  parallel_for(n, cpu::grain_for(1),
               [&](int64_t i) { op[i] = kDynamicMap[qp[i]] * ap[i / blocksize]; });
}

Nf4Weight nf4_quantize(const Tensor& w, bool double_quant, MemTag tag) {
  LT_CHECK(w.defined() && dtype_is_floating(w.dtype()), "nf4_quantize: weight ",
           w.defined() ? w.str() : "undefined", " must be a float tensor");
  if (w.device().is_cuda()) {
    // Quantization runs once per weight at load time; the host path is the reference.
    return nf4_quantize(w.detach().to(Device::cpu()), double_quant, MemTag::kOther)
        .to(w.device(), tag);
  }
  const Tensor src = w.detach().contiguous();
  const int64_t n = src.numel();
  const int64_t blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
  Nf4Weight q;
  q.shape = w.shape();
  q.packed = Tensor::empty({(n + 1) / 2}, DType::kU8, Device::cpu(), tag);
  Tensor absmax = Tensor::empty({blocks}, DType::kF32, Device::cpu(), tag);
  uint8_t* pk = q.packed.data<uint8_t>();
  float* am = absmax.data<float>();
  const uint8_t pad = nf4_midpoints().code_of(0.0f);  // bnb pads an odd count with 0.0
  const bool ragged = n % kNf4BlockSize != 0;
  std::atomic<bool> finite{true};
  LT_DISPATCH_FLOAT(src.dtype(), T, {
    const T* p = static_cast<const T*>(src.data_ptr());
    parallel_for(blocks, cpu::grain_for(kNf4BlockSize), [&](int64_t b) {
      const int64_t start = b * kNf4BlockSize, len = std::min(kNf4BlockSize, n - start);
      const bool full = !(ragged && b == blocks - 1);
      bool ok = true;
      auto load = [&](int64_t i) {
        const float v = static_cast<float>(cpu::load(p, start + i));
        ok = ok && std::isfinite(v);
        return v;
      };
      uint8_t codes[kNf4BlockSize];
      am[b] = quantize_block(len, full, nf4_midpoints(), load, codes);
      if (!ok) finite.store(false, std::memory_order_relaxed);
      for (int64_t j = 0; j < len; j += 2) {
        const uint8_t lo = j + 1 < len ? codes[j + 1] : pad;
        pk[(start + j) / 2] = static_cast<uint8_t>((codes[j] << 4) | lo);
      }
    });
  });
  LT_CHECK_INPUT(finite.load(), "cannot quantize weight ", weight_label(w),
                 " to NF4: it holds NaN or infinite values");
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += am[b];
  q.offset = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  Tensor centered = Tensor::empty({blocks}, DType::kF32, Device::cpu(), MemTag::kWorkspace);
  float* c = centered.data<float>();
  for (int64_t b = 0; b < blocks; ++b) c[b] = am[b] - q.offset;
  q.qabsmax = Tensor::empty({blocks}, DType::kU8, Device::cpu(), tag);
  q.absmax2 = Tensor::empty({(blocks + kNestedBlockSize - 1) / kNestedBlockSize}, DType::kF32,
                            Device::cpu(), tag);
  dynamic8_quantize(centered, kNestedBlockSize, q.qabsmax, q.absmax2);
  return q;
}

Int8Weight int8_quantize(const Tensor& w, MemTag tag) {
  LT_CHECK(w.defined() && dtype_is_floating(w.dtype()) && w.dim() == 2, "int8_quantize: weight ",
           w.defined() ? w.str() : "undefined", " must be a 2-D float tensor");
  if (w.device().is_cuda())
    return int8_quantize(w.detach().to(Device::cpu()), MemTag::kOther).to(w.device(), tag);
  const Tensor src = w.detach().contiguous();
  const int64_t rows = src.size(0), cols = src.size(1);
  Int8Weight q{Tensor::empty({rows, cols}, DType::kI8, Device::cpu(), tag),
               Tensor::empty({rows}, DType::kF32, Device::cpu(), tag)};
  int8_t* qp = q.q.data<int8_t>();
  float* am = q.absmax.data<float>();
  std::atomic<bool> finite{true};
  LT_DISPATCH_FLOAT(src.dtype(), T, {
    const T* p = static_cast<const T*>(src.data_ptr());
    parallel_for(rows, cpu::grain_for(cols), [&](int64_t r) {
      // Int8Params rounds the weight to f16 before quantizing it.
      auto half = [&](int64_t c) {
        return f16_to_f32(f32_to_f16(static_cast<float>(cpu::load(p, r * cols + c))));
      };
      float m = 0.0f;
      bool ok = true;
      for (int64_t c = 0; c < cols; ++c) {
        const float h = half(c);
        ok = ok && std::isfinite(h);
        m = std::max(m, std::fabs(h));
      }
      if (!ok) finite.store(false, std::memory_order_relaxed);
      am[r] = m;
      int8_t* row = qp + r * cols;
      if (m == 0.0f || !ok) {
        std::fill(row, row + cols, int8_t{0});
        return;
      }
      // torch evaluates bnb's 127.0 / absmax as reciprocal(absmax) * 127.
      const float scale = (1.0f / m) * 127.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = std::nearbyint(half(c) * scale);  // half to even, as torch.round
        row[c] = static_cast<int8_t>(std::min(std::max(v, -127.0f), 127.0f));
      }
    });
  });
  LT_CHECK_INPUT(finite.load(), "cannot quantize weight ", weight_label(w),
                 " to int8: it holds NaN, infinite or f16-overflowing (|w| > 65504) values");
  return q;
}

// ---------------------------------------------------------------- dequantization

Tensor nf4_block_absmax(const Nf4Weight& w, MemTag tag) {
  check_nf4(w, "nf4_block_absmax");
  if (!w.nested()) return w.absmax;
  const int64_t blocks = w.num_blocks();
  Tensor out = Tensor::empty({blocks}, DType::kF32, w.device(), tag);
  if (w.device().is_cuda()) {
    nf4_block_absmax_cuda(w.qabsmax, w.absmax2, w.offset, out);
    return out;
  }
  const uint8_t* q = w.qabsmax.data<uint8_t>();
  const float* a2 = w.absmax2.data<float>();
  float* o = out.data<float>();
  for (int64_t b = 0; b < blocks; ++b)
    o[b] = rounded(kDynamicMap[q[b]] * a2[b / kNestedBlockSize]) + w.offset;
  return out;
}

void nf4_dequantize(const Nf4Weight& w, const Tensor& out) {
  check_nf4(w, "nf4_dequantize");
  const int64_t n = w.numel();
  check_out(out, n, w.device(), "nf4_dequantize");
  const Tensor absmax = nf4_block_absmax(w);
  if (w.device().is_cuda()) {
    nf4_dequantize_cuda(w.packed, absmax, n, out);
    return;
  }
  const uint8_t* pk = w.packed.data<uint8_t>();
  const float* am = absmax.data<float>();
  const int64_t blocks = w.num_blocks();
  LT_DISPATCH_FLOAT(out.dtype(), T, {
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(blocks, cpu::grain_for(kNf4BlockSize), [&](int64_t b) {
      const int64_t start = b * kNf4BlockSize, end = std::min(start + kNf4BlockSize, n);
      const float a = am[b];
      for (int64_t i = start; i < end; ++i) {
        const uint8_t byte = pk[i >> 1];
        const int code = (i & 1) ? (byte & 0xF) : (byte >> 4);
        cpu::store(o, i, kNf4Code[code] * a);
      }
    });
  });
}

Tensor nf4_dequantize(const Nf4Weight& w, DType dtype, MemTag tag) {
  Tensor out = Tensor::empty(w.shape, dtype, w.device(), tag);
  nf4_dequantize(w, out);
  return out;
}

void int8_dequantize(const Int8Weight& w, const Tensor& out) {
  check_int8(w, "int8_dequantize");
  const int64_t rows = w.rows(), cols = w.cols();
  check_out(out, rows * cols, w.device(), "int8_dequantize");
  if (w.device().is_cuda()) {
    int8_dequantize_cuda(w.q, w.absmax, out);
    return;
  }
  const int8_t* qp = w.q.data<int8_t>();
  const float* am = w.absmax.data<float>();
  LT_DISPATCH_FLOAT(out.dtype(), T, {
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(rows, cpu::grain_for(cols), [&](int64_t r) {
      const float scale = am[r] * kInv127;
      for (int64_t c = 0; c < cols; ++c)
        cpu::store(o, r * cols + c, static_cast<float>(qp[r * cols + c]) * scale);
    });
  });
}

Tensor int8_dequantize(const Int8Weight& w, DType dtype, MemTag tag) {
  Tensor out = Tensor::empty(w.q.shape(), dtype, w.device(), tag);
  int8_dequantize(w, out);
  return out;
}

// ---------------------------------------------------------------- linear products

namespace {

// y = x W^T + b with W = deq(scratch view) of shape [out, in].
template <typename Deq>
void quant_linear_fwd(const char* op, const Tensor& x, const Shape& ws, Device wd, const Tensor& b,
                      const Tensor& y, Deq&& deq) {
  LT_CHECK(ws.size() == 2, op, ": the quantized weight has shape ", shape_str(ws),
           "; a linear needs [out, in]");
  check_linear_x(op, x, ws[1], wd);
  ProfileScope prof(OpKind::kLinearFwd, wd);  // the dequantization is part of the linear
  ScratchLease lease(wd, ws[0] * ws[1] * static_cast<int64_t>(dtype_size(x.dtype())));
  const Tensor w = lease.view(ws, x.dtype());
  deq(w);
  linear_fwd(x, w, b, y);
}

// dx = dy W, db = column sums of dy. W is dequantized again in dx's dtype.
template <typename Deq>
void quant_linear_bwd(const char* op, const Tensor& dy, const Shape& ws, Device wd,
                      const Tensor& dx, const Tensor& db, Deq&& deq) {
  LT_CHECK(ws.size() == 2, op, ": the quantized weight has shape ", shape_str(ws));
  ProfileScope prof(OpKind::kLinearDx, wd);  // a frozen base: dx (and db), no dW
  LT_CHECK(dy.defined() && dy.dim() == 2 && dy.size(1) == ws[0] && dy.device() == wd, op, ": dy ",
           dy.defined() ? dy.str() : "undefined", " for a weight of shape ", shape_str(ws), " on ",
           wd.str());
  if (!dx.defined()) {
    if (db.defined()) linear_bwd(dy, Tensor(), Tensor(), Tensor(), Tensor(), db);
    return;
  }
  LT_CHECK(dtype_is_floating(dx.dtype()), op, ": dx ", dx.str());
  ScratchLease lease(wd, ws[0] * ws[1] * static_cast<int64_t>(dtype_size(dx.dtype())));
  const Tensor w = lease.view(ws, dx.dtype());
  deq(w);
  linear_bwd(dy, Tensor(), w, dx, Tensor(), db);
}

}  // namespace

void nf4_linear_fwd(const Tensor& x, const Nf4Weight& w, const Tensor& b, const Tensor& y) {
  check_nf4(w, "nf4_linear_fwd");
  quant_linear_fwd("nf4_linear_fwd", x, w.shape, w.device(), b, y,
                   [&](const Tensor& dense) { nf4_dequantize(w, dense); });
}

void nf4_linear_bwd(const Tensor& dy, const Nf4Weight& w, const Tensor& dx, const Tensor& db) {
  check_nf4(w, "nf4_linear_bwd");
  quant_linear_bwd("nf4_linear_bwd", dy, w.shape, w.device(), dx, db,
                   [&](const Tensor& dense) { nf4_dequantize(w, dense); });
}

void int8_linear_fwd(const Tensor& x, const Int8Weight& w, const Tensor& b, const Tensor& y) {
  check_int8(w, "int8_linear_fwd");
  quant_linear_fwd("int8_linear_fwd", x, w.q.shape(), w.device(), b, y,
                   [&](const Tensor& dense) { int8_dequantize(w, dense); });
}

void int8_linear_bwd(const Tensor& dy, const Int8Weight& w, const Tensor& dx, const Tensor& db) {
  check_int8(w, "int8_linear_bwd");
  quant_linear_bwd("int8_linear_bwd", dy, w.q.shape(), w.device(), dx, db,
                   [&](const Tensor& dense) { int8_dequantize(w, dense); });
}

int64_t quant_workspace_bytes(Device device) {
  std::lock_guard<std::mutex> g(scratch_mu());
  int64_t total = 0;
  for (auto& [key, e] : scratch_table()) {
    if (std::get<0>(key) != static_cast<int>(device.type) || std::get<1>(key) != device.index)
      continue;
    std::lock_guard<std::mutex> eg(e->mu);
    if (e->buf.defined()) total += static_cast<int64_t>(e->buf.nbytes());
  }
  return total;
}

void release_quant_workspace(Device device) {
  std::lock_guard<std::mutex> g(scratch_mu());
  for (auto& [key, e] : scratch_table()) {
    if (std::get<0>(key) != static_cast<int>(device.type) || std::get<1>(key) != device.index)
      continue;
    std::lock_guard<std::mutex> eg(e->mu);
    e->buf = Tensor();
  }
}

}  // namespace leantune::kernels
