#include "core/offload/offloader.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/offload/internal/autograd_engine.h"
#include "core/offload/internal/device_copy.h"
#include "core/offload/internal/saved_tensor_store.h"
#include "core/offload/internal/spill_file.h"

namespace memprofd::offload {

absl::Status InstallOffloadEngine() { return internal::InstallEngine(); }

absl::StatusOr<std::unique_ptr<Offloader>> Offloader::Create(
    const OffloadOptions& options, c10::Device compute, MetaCopies meta_copies) {
  RETURN_IF_ERROR(ValidateOffloadOptions(options));
  if (compute.is_cuda()) {
    if (!internal::DeviceCopyHasCuda()) {
      return absl::InvalidArgumentError(
          "offload: compute device is CUDA but memprofd was built without CUDA code "
          "paths; rebuild against a CUDA LibTorch");
    }
  } else if (!compute.is_cpu() && !compute.is_meta()) {
    return absl::InvalidArgumentError(absl::StrCat("offload: unsupported compute device ",
                                                   compute.str(), "; use cpu or cuda"));
  }
  RETURN_IF_ERROR(InstallOffloadEngine());
  std::unique_ptr<internal::SpillFile> spill;
  // A dry run on the meta device (core/plan) moves nothing: no spill file.
  const bool needs_spill = options.enabled && !compute.is_meta() &&
                           (options.target == Target::kDisk ||
                            (options.target == Target::kHost && compute.is_cuda() &&
                             options.host_limit_bytes > 0));
  if (needs_spill) {
    ASSIGN_OR_RETURN(spill, internal::SpillFile::Open(options.spill_dir));
  }
  return std::unique_ptr<Offloader>(
      new Offloader(std::make_shared<internal::SavedTensorStore>(
          options, compute, std::move(spill),
          compute.is_meta() && meta_copies == MetaCopies::kInFlight)));
}

Offloader::Offloader(std::shared_ptr<internal::SavedTensorStore> store)
    : store_(std::move(store)) {}

Offloader::~Offloader() {
  // Saved tensors may outlive this object (they share store_), but the writer
  // thread must not: finish the queued writes and join it here.
  store_->Shutdown();
}

void Offloader::BeginStep(const std::vector<at::Tensor>& params_and_buffers) {
  store_->BeginStep(params_and_buffers);
}

void Offloader::MarkForwardEnd() { store_->MarkForwardEnd(); }
OffloadStats Offloader::EndStep() { return store_->EndStep(); }
OffloadStats Offloader::Totals() const { return store_->Totals(); }
int64_t Offloader::host_bytes_held() const { return store_->Current().host_bytes_held; }
int64_t Offloader::disk_bytes_held() const { return store_->Current().disk_bytes_held; }
int64_t Offloader::resident_saved_bytes() const {
  return store_->Current().resident_saved_bytes;
}
int64_t Offloader::spill_file_bytes() const { return store_->spill_file_bytes(); }
bool Offloader::IsParameterStorage(const at::Tensor& t) const {
  return store_->IsParameterStorage(t);
}
int64_t Offloader::parameter_storage_count() const {
  return store_->parameter_storage_count();
}
void Offloader::Flush() { store_->Flush(); }
const OffloadOptions& Offloader::options() const { return store_->options(); }

OffloadScope::OffloadScope(Offloader* offloader) {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  previous_store_ = scope.store;
  previous_exempt_ = scope.exempt;
  if (offloader != nullptr) {
    scope.store = offloader->store_.get();
    scope.exempt = false;
  }
}

OffloadScope::~OffloadScope() {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  scope.store = previous_store_;
  scope.exempt = previous_exempt_;
}

NoOffloadScope::NoOffloadScope() : NoOffloadScope(nullptr) {}

NoOffloadScope::NoOffloadScope(Offloader* offloader) {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  previous_store_ = scope.store;
  previous_exempt_ = scope.exempt;
  if (scope.store == nullptr && offloader != nullptr)
    scope.store = offloader->store_.get();
  scope.exempt = true;
}

NoOffloadScope::~NoOffloadScope() {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  scope.store = previous_store_;
  scope.exempt = previous_exempt_;
}

}  // namespace memprofd::offload
