#include "core/dist/process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if MEMPROFD_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"

namespace memprofd {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// c10d reports a peer that never answered as a timeout and a peer that went
// away as a closed connection; both are errors of the run, not of this rank,
// so the message says which collective on which rank saw it. (Gloo's own text
// names the peer's address, not its rank: it is kept.)
absl::Status CollectiveFailure(const std::string& what, int rank,
                               const std::exception& e) {
  const std::string detail = e.what();
  const std::string message = absl::StrCat(
      "rank ", rank, ": ", what, " failed: ", detail.substr(0, detail.find('\n')));
  if (absl::StrContains(detail, "Timed out") || absl::StrContains(detail, "timed out") ||
      absl::StrContains(detail, "Timeout") || absl::StrContains(detail, "timeout")) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || absl::StartsWith(addr, "127.") || addr == "::1";
}

}  // namespace

struct PendingCollective::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::string what;
  int rank = 0;
  std::chrono::milliseconds timeout{0};
  // Run once the work has finished on this rank, before Wait returns OK
  // (a reduce-scatter made of an all-reduce copies its chunk out).
  std::function<void()> then;
  // DoneOnlyWhenWaited's: no work, Done false until Wait, and what it holds
  // until then.
  bool until_waited = false;
  at::Tensor staging;
};

PendingCollective::PendingCollective() = default;
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;

PendingCollective PendingCollective::DoneOnlyWhenWaited(at::Tensor staging) {
  PendingCollective pending;
  pending.state_ = std::make_unique<State>();
  pending.state_->until_waited = true;
  pending.state_->staging = std::move(staging);
  return pending;
}

absl::Status PendingCollective::Wait() {
  if (state_ != nullptr) {
    state_->until_waited = false;
    state_->staging.reset();
  }
  if (state_ == nullptr || !state_->work) return absl::OkStatus();
  try {
    if (!state_->work->wait(state_->timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", state_->rank, ": ", state_->what,
                       " did not finish within ", state_->timeout.count(), " ms"));
    }
  } catch (const std::exception& e) {
    return CollectiveFailure(state_->what, state_->rank, e);
  }
  state_->work.reset();
  if (state_->then) {
    std::function<void()> then = std::move(state_->then);
    state_->then = nullptr;
    try {
      then();
    } catch (const std::exception& e) {
      return CollectiveFailure(state_->what, state_->rank, e);
    }
  }
  return absl::OkStatus();
}

bool PendingCollective::Done() const {
  if (state_ != nullptr && state_->until_waited) return false;
  if (state_ == nullptr || !state_->work) return true;
  try {
    return state_->work->isCompleted();
  } catch (const std::exception&) {
    return true;  // Wait reports it
  }
}

ProcessGroup::ProcessGroup(WorldSpec world) : world_(std::move(world)) {}

ProcessGroup::~ProcessGroup() = default;

absl::Status ProcessGroup::AllReduceSum(const at::Tensor& tensor) {
  absl::StatusOr<PendingCollective> pending = StartAllReduceSum(tensor);
  if (!pending.ok()) return pending.status();
  return pending->Wait();
}

absl::Status ProcessGroup::Broadcast(const at::Tensor& tensor, int root) {
  absl::StatusOr<PendingCollective> pending = StartBroadcast(tensor, root);
  if (!pending.ok()) return pending.status();
  return pending->Wait();
}

absl::Status ProcessGroup::CheckChunks(const char* what, const at::Tensor& whole,
                                       const at::Tensor& chunk) const {
  if (!whole.is_contiguous() || !chunk.is_contiguous() ||
      whole.scalar_type() != chunk.scalar_type() ||
      whole.numel() != chunk.numel() * world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " needs contiguous tensors of one dtype, the whole world_size (",
        world_size(), ") times the chunk; got ", whole.numel(), " ",
        c10::toString(whole.scalar_type()), " elements and ", chunk.numel(), " ",
        c10::toString(chunk.scalar_type())));
  }
  return absl::OkStatus();
}

absl::Status ProcessGroup::CheckRoot(const char* what, int root) const {
  if (root >= 0 && root < world_size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " root ", root, " is not a rank (0 to ", world_size() - 1, ")"));
}

// A rank of a real run: c10d's store and backend (Gloo, or NCCL on CUDA).
class C10dProcessGroup : public ProcessGroup {
 public:
  struct Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> backend;
    const char* name = "gloo";
    std::chrono::milliseconds timeout{0};
  };
  C10dProcessGroup(WorldSpec world, Impl impl)
      : ProcessGroup(std::move(world)), impl_(std::move(impl)) {}

  const char* backend_name() const override { return impl_.name; }
  absl::StatusOr<PendingCollective> StartAllReduceSum(const at::Tensor& tensor) override;
  absl::StatusOr<PendingCollective> StartReduceSum(const at::Tensor& tensor,
                                                   int root) override;
  absl::StatusOr<PendingCollective> StartBroadcast(const at::Tensor& tensor,
                                                   int root) override;
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& tensor) override;
  absl::StatusOr<PendingCollective> StartAllGatherInto(const at::Tensor& output,
                                                       const at::Tensor& input) override;
  absl::StatusOr<PendingCollective> StartReduceScatterSum(
      const at::Tensor& output, const at::Tensor& input) override;
  absl::Status Barrier() override;
  absl::Status SetKey(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> WaitKey(const std::string& key,
                                      absl::Duration timeout) override;
  absl::StatusOr<std::unique_ptr<StoreChannel>> OpenChannel() override;

 private:
  // Starts `what` through `start` (which returns c10d's work).
  template <typename Start>
  absl::StatusOr<PendingCollective> Begin(const std::string& what, Start start);
  // Begins `what` and waits for it.
  template <typename Start>
  absl::Status Run(const std::string& what, Start start);

  Impl impl_;
};

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Connect(
    const WorldSpec& world, const ProcessGroupOptions& options) {
  if (!world.distributed()) {
    return absl::InvalidArgumentError(
        "a process group needs a world of two ranks or more");
  }
  CollectiveBackend backend = options.backend;
  if (backend == CollectiveBackend::kAuto) {
    backend = options.cuda ? CollectiveBackend::kNccl : CollectiveBackend::kGloo;
  }
  if (backend == CollectiveBackend::kNccl && !options.cuda) {
    return absl::InvalidArgumentError("NCCL needs CUDA tensors; on CPU use Gloo");
  }
  C10dProcessGroup::Impl group;
  C10dProcessGroup::Impl* const impl = &group;
  impl->timeout = ToChrono(options.timeout);
  const std::string where = absl::StrCat(world.master_addr, ":", world.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(world.master_port);
    store_options.isServer = world.rank == 0 && !world.use_agent_store;
    store_options.numWorkers =
        world.use_agent_store ? std::nullopt : std::optional<size_t>(world.world_size);
    store_options.waitWorkers = !world.use_agent_store;
    store_options.timeout = impl->timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store_options);
    // Keys of an earlier, failed attempt (torchrun restarts every rank) are
    // never read by this one.
    impl->store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("memprofd/attempt", world.restart_count), tcp);
  } catch (const std::exception& e) {
    return CollectiveFailure(
        absl::StrCat("joining the store at ", where, " (MASTER_ADDR:MASTER_PORT)"),
        world.rank, e);
  }
  try {
    if (backend == CollectiveBackend::kGloo) {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(impl->timeout);
      // GLOO_SOCKET_IFNAME names the interface between hosts (as in
      // PyTorch); on one host, loopback needs no resolvable host name.
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
        gloo_options->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (IsLoopback(world.master_addr)) {
        gloo_options->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
          impl->store, world.rank, world.world_size, gloo_options);
      impl->name = "gloo";
    } else {
#if MEMPROFD_WITH_CUDA
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = impl->timeout;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          impl->store, world.rank, world.world_size, nccl_options);
      impl->name = "nccl";
#else
      return absl::UnimplementedError("this memprofd was built without CUDA: no NCCL");
#endif
    }
  } catch (const std::exception& e) {
    return CollectiveFailure(
        absl::StrCat("the ", backend == CollectiveBackend::kGloo ? "gloo" : "nccl",
                     " rendezvous through ", where),
        world.rank, e);
  }
  LogInfo(absl::StrCat("joined ", DescribeWorld(world), " over ", impl->name));
  return std::unique_ptr<ProcessGroup>(new C10dProcessGroup(world, std::move(group)));
}

template <typename Start>
absl::StatusOr<PendingCollective> C10dProcessGroup::Begin(const std::string& what,
                                                          Start start) {
  PendingCollective pending;
  pending.state_ = std::make_unique<PendingCollective::State>();
  pending.state_->what = what;
  pending.state_->rank = rank();
  pending.state_->timeout = impl_.timeout;
  try {
    pending.state_->work = start();
  } catch (const std::exception& e) {
    return CollectiveFailure(what, rank(), e);
  }
  return pending;
}

template <typename Start>
absl::Status C10dProcessGroup::Run(const std::string& what, Start start) {
  absl::StatusOr<PendingCollective> pending = Begin(what, start);
  if (!pending.ok()) return pending.status();
  return pending->Wait();
}

absl::StatusOr<PendingCollective> C10dProcessGroup::StartAllReduceSum(
    const at::Tensor& tensor) {
  return Begin(absl::StrCat("all-reduce of ", tensor.numel(), " elements"), [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = impl_.timeout;
    return impl_.backend->allreduce(tensors, options);
  });
}

absl::StatusOr<PendingCollective> C10dProcessGroup::StartReduceSum(
    const at::Tensor& tensor, int root) {
  RETURN_IF_ERROR(CheckRoot("reduce", root));
  return Begin(absl::StrCat("reduce of ", tensor.numel(), " elements to rank ", root),
               [&] {
                 std::vector<at::Tensor> tensors{tensor};
                 c10d::ReduceOptions options;
                 options.reduceOp = c10d::ReduceOp::SUM;
                 options.rootRank = root;
                 options.timeout = impl_.timeout;
                 return impl_.backend->reduce(tensors, options);
               });
}

absl::StatusOr<PendingCollective> C10dProcessGroup::StartBroadcast(
    const at::Tensor& tensor, int root) {
  RETURN_IF_ERROR(CheckRoot("broadcast", root));
  return Begin(absl::StrCat("broadcast from rank ", root), [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = impl_.timeout;
    return impl_.backend->broadcast(tensors, options);
  });
}

absl::StatusOr<std::vector<at::Tensor>> C10dProcessGroup::AllGather(
    const at::Tensor& tensor) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  absl::Status status = Run("all-gather", [&] {
    std::vector<at::Tensor> inputs{tensor};
    c10d::AllgatherOptions options;
    options.timeout = impl_.timeout;
    return impl_.backend->allgather(outputs, inputs, options);
  });
  if (!status.ok()) return status;
  return std::move(outputs[0]);
}

absl::StatusOr<PendingCollective> C10dProcessGroup::StartAllGatherInto(
    const at::Tensor& output, const at::Tensor& input) {
  RETURN_IF_ERROR(CheckChunks("all-gather into a tensor", output, input));
  return Begin(absl::StrCat("all-gather of ", input.numel(), " elements per rank"), [&] {
    at::Tensor out = output, in = input;
    c10d::AllgatherOptions options;
    options.timeout = impl_.timeout;
    return impl_.backend->_allgather_base(out, in, options);
  });
}

absl::StatusOr<PendingCollective> C10dProcessGroup::StartReduceScatterSum(
    const at::Tensor& output, const at::Tensor& input) {
  RETURN_IF_ERROR(CheckChunks("reduce-scatter", input, output));
  const std::string what =
      absl::StrCat("reduce-scatter of ", output.numel(), " elements per rank");
  if (std::string_view(impl_.name) == "gloo") {
    // Gloo's reduce_scatter_tensor all-reduces a copy of the whole input and
    // keeps this rank's chunk: the same traffic, and a second bucket held
    // while it runs. All-reducing the input in place moves the same bytes
    // without the copy; the chunk is copied out once it has finished.
    ASSIGN_OR_RETURN(PendingCollective pending, Begin(what, [&] {
                       std::vector<at::Tensor> tensors{input};
                       c10d::AllreduceOptions options;
                       options.reduceOp = c10d::ReduceOp::SUM;
                       options.timeout = impl_.timeout;
                       return impl_.backend->allreduce(tensors, options);
                     }));
    pending.state_->then = [output, input, world = world_size(), rank = rank()] {
      at::NoGradGuard no_grad;
      output.copy_(input.view({world, -1})[rank]);
    };
    return pending;
  }
  return Begin(what, [&] {
    at::Tensor out = output, in = input;
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = impl_.timeout;
    return impl_.backend->_reduce_scatter_base(out, in, options);
  });
}

absl::Status C10dProcessGroup::Barrier() {
  return Run("barrier", [&] {
    c10d::BarrierOptions options;
    options.timeout = impl_.timeout;
    return impl_.backend->barrier(options);
  });
}

namespace {

absl::Status StoreSet(c10d::Store& store, int rank, const std::string& key,
                      const std::string& value) {
  try {
    store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return CollectiveFailure(absl::StrCat("setting store key '", key, "'"), rank, e);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status C10dProcessGroup::SetKey(const std::string& key, const std::string& value) {
  return StoreSet(*impl_.store, rank(), key, value);
}

absl::StatusOr<std::string> C10dProcessGroup::WaitKey(const std::string& key,
                                                      absl::Duration timeout) {
  try {
    impl_.store->wait({key}, ToChrono(timeout));
    std::vector<uint8_t> value = impl_.store->get(key);
    return std::string(value.begin(), value.end());
  } catch (const std::exception& e) {
    return CollectiveFailure(absl::StrCat("waiting for store key '", key, "'"), rank(),
                             e);
  }
}

struct StoreChannel::Impl {
  absl::Mutex mu;
  c10::intrusive_ptr<c10d::Store> store ABSL_GUARDED_BY(mu);
};

StoreChannel::StoreChannel(int rank, std::unique_ptr<Impl> impl)
    : rank_(rank), impl_(std::move(impl)) {}

StoreChannel::~StoreChannel() = default;

absl::Status StoreChannel::SetKey(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&impl_->mu);
  return StoreSet(*impl_->store, rank_, key, value);
}

absl::StatusOr<std::optional<std::string>> StoreChannel::GetKeyIfSet(
    const std::string& key) {
  absl::MutexLock lock(&impl_->mu);
  try {
    if (!impl_->store->check({key})) return std::optional<std::string>();
    std::vector<uint8_t> value = impl_->store->get(key);
    return std::optional<std::string>(std::string(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return CollectiveFailure(absl::StrCat("reading store key '", key, "'"), rank_, e);
  }
}

absl::StatusOr<std::unique_ptr<StoreChannel>> C10dProcessGroup::OpenChannel() {
  auto impl = std::make_unique<StoreChannel::Impl>();
  try {
    // PrefixStore's clone keeps the prefix over a new TCPStore connection.
    absl::MutexLock lock(&impl->mu);
    impl->store = impl_.store->clone();
  } catch (const std::exception& e) {
    return CollectiveFailure("opening a second store connection", rank(), e);
  }
  return std::unique_ptr<StoreChannel>(new StoreChannel(rank(), std::move(impl)));
}

}  // namespace memprofd
