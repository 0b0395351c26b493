#include "core/session/merged_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>

namespace memprofd {
namespace {

// A tensor of `like`'s shape and dtype that owns no bytes (an empty storage).
at::Tensor Hollow(const at::Tensor& like) {
  at::Tensor t = at::empty({0}, like.options());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(like.sizes());
  return t;
}

}  // namespace

MergedWeights::MergedWeights(const LlamaModel& model)
    : tensors_(model.NamedBaseParameters()), scaling_(model.lora()->Scaling()) {
  std::map<std::string, AdaptedProjection> adapted;
  for (AdaptedProjection& p : model.AdaptedProjections()) {
    adapted.emplace(p.weight_name, std::move(p));
  }
  merges_.resize(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    auto it = adapted.find(tensors_[i].first);
    if (it == adapted.end()) continue;
    merges_[i] = Merge{it->second.weight, it->second.adapter};
    tensors_[i].second = Hollow(it->second.weight);
  }
}

absl::StatusOr<int64_t> MergedWeights::Acquire(size_t index) {
  if (index >= merges_.size() || !merges_[index]) return 0;
  const Merge& m = *merges_[index];
  c10::NoGradGuard no_grad;
  // W + scaling · B·A in one product; a base in another dtype than its
  // adapters merges in float32 and is rounded once.
  const at::Tensor w = m.weight.scalar_type() == m.adapter.a.scalar_type()
                           ? m.weight
                           : m.weight.to(m.adapter.a.scalar_type());
  at::Tensor merged = at::addmm(w, m.adapter.b.to(w.device()), m.adapter.a.to(w.device()),
                                /*beta=*/1, /*alpha=*/scaling_)
                          .to(m.weight.scalar_type())
                          .contiguous();
  at::Tensor& hollow = tensors_[index].second;
  hollow.unsafeGetTensorImpl()->set_storage_keep_dtype(merged.storage());
  hollow.unsafeGetTensorImpl()->set_storage_offset(0);
  return static_cast<int64_t>(merged.nbytes());
}

void MergedWeights::Release(size_t index) {
  if (index >= merges_.size() || !merges_[index]) return;
  at::Tensor& t = tensors_[index].second;
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(at::empty({0}, t.options()).storage());
}

}  // namespace memprofd
