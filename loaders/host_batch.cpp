// host_batch: see host_batch.h.
#include "loaders/host_batch.h"

#include "engine/check.h"

namespace leantune {

Batch host_batch(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos,
                 const std::vector<int64_t>& labels, const std::vector<int32_t>& cu,
                 int64_t max_seqlen, const BatchStats& stats) {
  LT_CHECK(pos.size() == ids.size() && labels.size() == ids.size() && !cu.empty() &&
               cu.front() == 0 && static_cast<size_t>(cu.back()) == ids.size(),
           "host_batch: ", ids.size(), " ids, ", pos.size(), " positions, ", labels.size(),
           " labels, cu_seqlens ending at ", cu.empty() ? -1 : cu.back());
  Batch b;
  const int64_t t = static_cast<int64_t>(ids.size());
  b.input_ids = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.labels = Tensor::from_vector(labels, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  b.max_seqlen = max_seqlen;
  b.stats = stats;
  return b;
}

}  // namespace leantune
