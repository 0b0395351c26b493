#include "core/session/session.h"

#include <torch/cuda.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/log.h"

namespace memprofd {

absl::StatusOr<std::string> ResolveDevice(const std::string& requested) {
  const bool cuda_available = torch::cuda::is_available();
  if (requested == "auto")
    return cuda_available ? std::string("cuda:0") : std::string("cpu");
  if (requested == "cpu") return std::string("cpu");
  if (requested == "cuda" || absl::StartsWith(requested, "cuda:")) {
    int index = 0;
    if (requested != "cuda" && !absl::SimpleAtoi(requested.substr(5), &index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad device '", requested,
                       "': write auto, cpu, cuda or cuda:N with N a number"));
    }
#ifndef MEMPROFD_WITH_CUDA
    return absl::UnimplementedError(absl::StrCat(
        "device '", requested,
        "' needs CUDA, and this memprofd was built against a LibTorch without CUDA; "
        "use --device=cpu or rebuild against a CUDA LibTorch"));
#else
    const int count = static_cast<int>(torch::cuda::device_count());
    if (index < 0 || index >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("device '", requested, "' is not there: LibTorch sees ", count,
                       " CUDA device(s); use --device=auto or cuda:0..", count - 1));
    }
    return absl::StrCat("cuda:", index);
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", requested, "': write auto, cpu, cuda or cuda:N"));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const SessionOptions& options) {
  absl::StatusOr<std::string> device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Session>(new Session(*std::move(device)));
}

Session::Session(std::string device)
    : device_(std::move(device)), start_time_(absl::Now()) {
  owner_ = std::thread([this] { OwnerLoop(); });
}

Session::~Session() { Shutdown(); }

absl::Status Session::Post(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance");
  }
  queue_.push_back(std::move(work));
  return absl::OkStatus();
}

bool Session::draining() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Session::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !owner_.joinable()) return;
    stopping_ = true;
  }
  for (const auto& op : operations_.List(nullptr, /*active_only=*/true)) {
    op->RequestCancel();
  }
  if (owner_.joinable()) owner_.join();
}

void Session::OwnerLoop() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace memprofd
