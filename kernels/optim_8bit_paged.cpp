// The paging pipeline of the paged AdamW variants (paged_adamw_8bit / paged_adamw_32bit;
// kernels/optim_8bit.h PagedStates): states in pinned host memory, stepped on the parameter's
// device through two staging buffers, so that the copy of the next slab overlaps the update of
// the current one.
//
// Work is cut into units: slabs of at most `slab` elements of one parameter (a multiple of
// kOptim8bitBlock, so a slab holds whole quantization blocks and the step of a slab is, element
// for element and block for block, the step of the whole parameter; only a parameter's last
// slab can end in a short block, exactly where the parameter's own short block is). Unit k uses
// staging slot k % 2. Streams: the states move on one copy stream per device, the steps run on
// the device's current (compute) stream:
//   copy:    H2D(0) | D2H(k-1) H2D(k+1) | ...        (D2H(k-1) waits for stepped[slot of k-1])
//   compute:        wait loaded[k], step(k), record stepped[k]
// so H2D(k+1) runs while step(k) computes. The write-back of the last units is queued on the copy
// stream and `done` recorded after it; readers of the host states (checkpoints) call wait(). The
// next step's H2D copies are queued behind it on the same stream. Staging buffers (kWorkspace)
// come from the compute stream's allocator and are marked used on the copy stream
// (record_stream), so they are not reused before its copies finish.
// On the host (stage_on_host, the CPU twin that tests use) the same units, slots and copies run
// in order with memcpy; streams and events are no-ops there.
#include <cstring>

#include "engine/cuda_api.h"
#include "engine/stream.h"
#include "kernels/optim_8bit.h"

namespace leantune::kernels {
namespace {

struct Unit {
  size_t tensor;
  int64_t offset, length;  // elements
};

// The four state arrays of a tensor, with their element size and the offset/length of a unit in
// them (absmax arrays are indexed by block).
struct Part {
  Tensor Adam8Tensor::*field;
  bool per_block;
};
constexpr Part kParts[] = {{&Adam8Tensor::state1, false},
                           {&Adam8Tensor::state2, false},
                           {&Adam8Tensor::absmax1, true},
                           {&Adam8Tensor::absmax2, true}};

int64_t part_offset(const Part& p, const Unit& u) {
  return p.per_block ? u.offset / kOptim8bitBlock : u.offset;
}
int64_t part_length(const Part& p, const Unit& u) {
  return p.per_block ? (u.length + kOptim8bitBlock - 1) / kOptim8bitBlock : u.length;
}

}  // namespace

void PagedStates::step(const std::vector<Adam8Tensor>& host, const AdamWStepArgs& args,
                       Device device, int64_t slab) {
  LT_CHECK(slab > 0 && slab % kOptim8bitBlock == 0, "paged optimizer: slab ", slab,
           " elements is not a positive multiple of ", kOptim8bitBlock);
  std::vector<Unit> units;
  int64_t largest8 = 0, largest32 = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const Adam8Tensor& t = host[i];
    LT_CHECK(t.param.device() == device && t.state1.device().is_cpu(), "paged optimizer: param ",
             t.param.str(), " on ", device.str(), " with states ", t.state1.str());
    const int64_t n = t.param.numel();
    for (int64_t off = 0; off < n; off += slab) {
      const int64_t len = std::min(slab, n - off);
      units.push_back({i, off, len});
      (t.absmax1.defined() ? largest8 : largest32) =
          std::max(t.absmax1.defined() ? largest8 : largest32, len);
    }
  }
  if (units.empty()) return;
  const Stream compute = current_stream(device);
  const Stream copy = copy_stream(device);
  // Two slots of staging buffers, for 8-bit and for 32-bit states as needed.
  Tensor q[2][2], am[2][2], f[2][2];
  {
    MemTagGuard scratch(MemTag::kWorkspace);
    for (int s = 0; s < 2; ++s)
      for (int j = 0; j < 2; ++j) {
        if (largest8 > 0) {
          q[s][j] = Tensor::empty({largest8}, DType::kU8, device);
          am[s][j] = Tensor::empty({(largest8 + kOptim8bitBlock - 1) / kOptim8bitBlock},
                                   DType::kF32, device);
        }
        if (largest32 > 0) f[s][j] = Tensor::empty({largest32}, DType::kF32, device);
      }
  }
  // The staged view of unit u's tensor in slot s.
  auto staged = [&](const Unit& u, int s) {
    const Adam8Tensor& t = host[u.tensor];
    Adam8Tensor d;
    d.weight_decay = t.weight_decay;
    d.stochastic_round = t.stochastic_round;
    d.seed = t.seed;
    d.index_offset = t.index_offset + u.offset;
    d.param = t.param.flatten().narrow(0, u.offset, u.length);
    d.grad = t.grad.flatten().narrow(0, u.offset, u.length);
    if (t.absmax1.defined()) {
      const int64_t blocks = (u.length + kOptim8bitBlock - 1) / kOptim8bitBlock;
      d.state1 = q[s][0].narrow(0, 0, u.length);
      d.state2 = q[s][1].narrow(0, 0, u.length);
      d.absmax1 = am[s][0].narrow(0, 0, blocks);
      d.absmax2 = am[s][1].narrow(0, 0, blocks);
    } else {
      d.state1 = f[s][0].narrow(0, 0, u.length);
      d.state2 = f[s][1].narrow(0, 0, u.length);
    }
    return d;
  };
  auto move = [&](const Unit& u, int s, bool to_device) {
    const Adam8Tensor& t = host[u.tensor];
    const Adam8Tensor d = staged(u, s);
    for (const Part& p : kParts) {
      const Tensor& h = t.*(p.field);
      if (!h.defined()) continue;
      const int64_t es = static_cast<int64_t>(h.element_size());
      char* hp = static_cast<char*>(h.data_ptr()) + part_offset(p, u) * es;
      void* dp = (d.*(p.field)).data_ptr();
      const int64_t bytes = part_length(p, u) * es;
      if (to_device)
        copy_bytes_async(dp, hp, bytes, device, CopyKind::kHostToDevice, copy);
      else
        copy_bytes_async(hp, dp, bytes, device, CopyKind::kDeviceToHost, copy);
    }
  };
  Event loaded[2] = {Event(device), Event(device)};
  Event stepped[2] = {Event(device), Event(device)};
  auto h2d = [&](size_t k) {
    move(units[k], static_cast<int>(k & 1), true);
    loaded[k & 1].record(copy);
  };
  auto d2h = [&](size_t k) {
    stepped[k & 1].wait(copy);
    move(units[k], static_cast<int>(k & 1), false);
  };
  // The slots' blocks may have served kernels queued earlier on the compute stream: the copy
  // stream starts behind them.
  copy.wait_stream(compute);
  h2d(0);
  for (size_t k = 0; k < units.size(); ++k) {
    if (k + 1 < units.size()) {
      if (k >= 1) d2h(k - 1);  // frees the slot unit k + 1 takes
      h2d(k + 1);
    }
    loaded[k & 1].wait(compute);
    adamw8bit_step({staged(units[k], static_cast<int>(k & 1))}, args);
    stepped[k & 1].record(compute);
  }
  if (units.size() >= 2) d2h(units.size() - 2);
  d2h(units.size() - 1);
  if (!done_) done_ = std::make_unique<Event>(device);
  done_->record(copy);
  for (int s = 0; s < 2; ++s)
    for (int j = 0; j < 2; ++j)
      for (Tensor* t : {&q[s][j], &am[s][j], &f[s][j]})
        if (t->defined()) t->storage()->record_stream(copy);
}

void PagedStates::wait() const {
  if (done_) done_->synchronize();
}

}  // namespace leantune::kernels
