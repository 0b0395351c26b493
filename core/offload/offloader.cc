#include "core/offload/offloader.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/offload/internal/device_copy.h"
#include "core/offload/internal/engine.h"
#include "core/offload/internal/offload_core.h"
#include "core/offload/internal/spill_file.h"

namespace memprofd::offload {

absl::Status InstallOffloadEngine() { return internal::InstallEngine(); }

absl::StatusOr<std::unique_ptr<Offloader>> Offloader::Create(
    const OffloadOptions& options, c10::Device compute) {
  RETURN_IF_ERROR(ValidateOffloadOptions(options));
  if (compute.is_cuda()) {
    if (!internal::DeviceCopyHasCuda()) {
      return absl::InvalidArgumentError(
          "offload: compute device is CUDA but memprofd was built without CUDA code "
          "paths; rebuild against a CUDA LibTorch");
    }
  } else if (!compute.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("offload: unsupported compute device ",
                                                   compute.str(), "; use cpu or cuda"));
  }
  RETURN_IF_ERROR(InstallOffloadEngine());
  std::unique_ptr<internal::SpillFile> spill;
  const bool needs_spill =
      options.enabled && (options.target == Target::kDisk ||
                          (options.target == Target::kHost && compute.is_cuda() &&
                           options.host_limit_bytes > 0));
  if (needs_spill) {
    ASSIGN_OR_RETURN(spill, internal::SpillFile::Open(options.spill_dir));
  }
  return std::unique_ptr<Offloader>(new Offloader(
      std::make_shared<internal::OffloadCore>(options, compute, std::move(spill))));
}

Offloader::Offloader(std::shared_ptr<internal::OffloadCore> core)
    : core_(std::move(core)) {}

Offloader::~Offloader() {
  // Saved tensors may outlive this object (they share core_), but the writer
  // thread must not: finish the queued writes and join it here.
  core_->Shutdown();
}

void Offloader::BeginStep(const std::vector<at::Tensor>& params_and_buffers) {
  core_->BeginStep(params_and_buffers);
}

OffloadStats Offloader::EndStep() { return core_->EndStep(); }
OffloadStats Offloader::Totals() const { return core_->Totals(); }
int64_t Offloader::host_bytes_held() const { return core_->Current().host_bytes_held; }
int64_t Offloader::disk_bytes_held() const { return core_->Current().disk_bytes_held; }
int64_t Offloader::resident_saved_bytes() const {
  return core_->Current().resident_saved_bytes;
}
int64_t Offloader::spill_file_bytes() const { return core_->spill_file_bytes(); }
bool Offloader::IsParameterStorage(const at::Tensor& t) const {
  return core_->IsParameterStorage(t);
}
int64_t Offloader::parameter_storage_count() const {
  return core_->parameter_storage_count();
}
void Offloader::Flush() { core_->Flush(); }
const OffloadOptions& Offloader::options() const { return core_->options(); }

OffloadScope::OffloadScope(Offloader* offloader) {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  previous_core_ = scope.core;
  previous_exempt_ = scope.exempt;
  if (offloader != nullptr) {
    scope.core = offloader->core_.get();
    scope.exempt = false;
  }
}

OffloadScope::~OffloadScope() {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  scope.core = previous_core_;
  scope.exempt = previous_exempt_;
}

NoOffloadScope::NoOffloadScope() : NoOffloadScope(nullptr) {}

NoOffloadScope::NoOffloadScope(Offloader* offloader) {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  previous_core_ = scope.core;
  previous_exempt_ = scope.exempt;
  if (scope.core == nullptr && offloader != nullptr) scope.core = offloader->core_.get();
  scope.exempt = true;
}

NoOffloadScope::~NoOffloadScope() {
  internal::ThreadScope& scope = internal::CurrentThreadScope();
  scope.core = previous_core_;
  scope.exempt = previous_exempt_;
}

}  // namespace memprofd::offload
