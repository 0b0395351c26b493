#ifndef MEMPROFD_CORE_DIST_PROCESS_GROUP_H_
#define MEMPROFD_CORE_DIST_PROCESS_GROUP_H_

// The ranks of one data-parallel run, issuing collectives together: a thin
// layer over LibTorch's c10d (TCPStore, PrefixStore, ProcessGroupGloo on CPU,
// ProcessGroupNCCL when computing on CUDA). It exists so that the rest of
// memprofd sees absl::Status instead of c10d's exceptions, never waits without
// a bound, and names the collective and the rank in every error.
//
// Rules every caller keeps (c10d's, REFERENCE.md §6): every rank issues the
// same collectives in the same order with tensors of the same shapes; Gloo
// has no AVG, so averages are SUM then divide.
//
// Two implementations of one interface: Connect's joins a real run over c10d
// (process_group.cc); ForPlan's is the planner's dry run of one rank, with no
// peers (plan_process_group.cc). Callers never ask which one they hold.
//
// Thread-safety: one thread issues collectives (the session's owner thread;
// the gradient hooks run on it too). PendingCollective::Wait may be called
// from that thread only.

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/dist/world.h"

namespace memprofd {

enum class CollectiveBackend {
  kAuto,  // NCCL when options.cuda, Gloo otherwise
  kGloo,
  kNccl,
};

struct ProcessGroupOptions {
  CollectiveBackend backend = CollectiveBackend::kAuto;
  // The tensors live on CUDA (the device of this rank is cuda:local_rank).
  bool cuda = false;
  // The bound on the rendezvous and on every collective. A rank that died or
  // hangs makes the others fail within it (c10d's own default is 30 minutes).
  absl::Duration timeout = absl::Seconds(60);
};

// A collective started and not yet waited for. Move-only; dropping it without
// Wait is allowed (the collective still completes inside c10d).
class PendingCollective {
 public:
  PendingCollective();
  ~PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;

  // Blocks until the collective has finished on this rank. DEADLINE_EXCEEDED
  // when a peer did not take part within the timeout (it hangs or is gone),
  // UNAVAILABLE when a peer's connection closed (it died); both name the
  // collective and this rank. OK at once for a default-constructed one.
  absl::Status Wait();
  // Whether the collective has finished on this rank (or failed: Wait then
  // says how), without blocking; true for a default-constructed one. A
  // finished collective's Wait returns at once.
  bool Done() const;

  // A collective with nothing left to do that still reads as not finished
  // (Done false) until it is waited for: a plan's (ForPlan), which stands
  // for a real rank whose collective has not finished yet, so that what a
  // plan counts is the most a rank can hold while collectives are in flight.
  // `staging`, when defined, is held until then (a plan's stand-in for a
  // backend's own buffer).
  static PendingCollective DoneOnlyWhenWaited(at::Tensor staging = at::Tensor());

 private:
  friend class C10dProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

// A connection of its own to the run's key-value store (this attempt's
// prefix), for a thread other than the one that issues collectives: c10d
// serialises the calls on one store connection, so a follower waiting for
// its next command on the group's connection would hold up everything else
// there. Thread-safe (calls on one channel are serialised).
class StoreChannel {
 public:
  ~StoreChannel();
  StoreChannel(const StoreChannel&) = delete;
  StoreChannel& operator=(const StoreChannel&) = delete;

  // As ProcessGroup::SetKey.
  absl::Status SetKey(const std::string& key, const std::string& value);
  // The key's value, or nullopt at once when it is not set: for polling,
  // since c10d logs a warning for every wait that times out. UNAVAILABLE
  // when the store is gone.
  absl::StatusOr<std::optional<std::string>> GetKeyIfSet(const std::string& key);

 private:
  friend class C10dProcessGroup;
  struct Impl;
  StoreChannel(int rank, std::unique_ptr<Impl> impl);
  const int rank_;
  std::unique_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  // Joins the run `world` describes: rank 0 hosts the TCP store at
  // master_addr:master_port (unless torchrun's agent hosts it), every rank
  // connects, under the prefix of this restart attempt, and the backend's
  // rendezvous completes. Blocks until every rank has joined or the timeout.
  // INVALID_ARGUMENT for a world of one rank or for NCCL without CUDA;
  // UNIMPLEMENTED for NCCL in a build without CUDA; DEADLINE_EXCEEDED when
  // not all ranks joined in time; UNAVAILABLE when the store cannot be
  // reached (wrong MASTER_ADDR/MASTER_PORT, port taken on rank 0).
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Connect(
      const WorldSpec& world, const ProcessGroupOptions& options);

  // A group for planning (core/plan's dry run of rank `rank` of
  // `world_size`): no backend, no store, no peers. Every collective completes
  // at once and moves nothing: an all-reduce, a reduce or a broadcast leaves
  // the tensor as it is, an all-gather returns world_size copies of this
  // rank's tensor (every rank of a plan is the same dry run, so the checks
  // that compare ranks see them agree), and a reduce-scatter gives this
  // rank's chunk of its own input. On meta tensors nothing has values.
  // The store calls return FAILED_PRECONDITION. `rank` must be in
  // [0, world_size).
  // Its collectives' PendingCollective is DoneOnlyWhenWaited. With `backend`
  // kGloo (a CPU run's) an all-gather also holds a buffer of its output's
  // size until it is waited for: Gloo's all-gather gathers into a flat
  // buffer of its own, on its own thread, and copies it out, so a real rank
  // holds one for a while in each; the plan counts it for as long as it can
  // be there.
  static std::unique_ptr<ProcessGroup> ForPlan(
      int rank, int world_size, CollectiveBackend backend = CollectiveBackend::kNccl);

  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return world_.rank; }
  int world_size() const { return world_.world_size; }
  const WorldSpec& world() const { return world_; }
  // "gloo", "nccl", or "plan" (ForPlan).
  virtual const char* backend_name() const = 0;

  // Starts summing `tensor` (dense, contiguous) across ranks, in place.
  virtual absl::StatusOr<PendingCollective> StartAllReduceSum(
      const at::Tensor& tensor) = 0;
  // The same, waited for.
  absl::Status AllReduceSum(const at::Tensor& tensor);
  // Starts summing every rank's `tensor` (dense, contiguous, the same shape on
  // all) into root's, in place: only root's holds the sum afterwards; the
  // others' contents are unspecified (c10d may use them as scratch).
  // INVALID_ARGUMENT for a root that is not a rank.
  virtual absl::StatusOr<PendingCollective> StartReduceSum(const at::Tensor& tensor,
                                                           int root) = 0;
  // Starts replacing `tensor` on every rank by root's, in place.
  // INVALID_ARGUMENT for a root that is not a rank.
  virtual absl::StatusOr<PendingCollective> StartBroadcast(const at::Tensor& tensor,
                                                           int root) = 0;
  // The same, waited for.
  absl::Status Broadcast(const at::Tensor& tensor, int root);
  // Every rank's `tensor` (same shape on all), in rank order.
  virtual absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& tensor) = 0;
  // c10d's all_gather_into_tensor: starts writing every rank's `input` (dense,
  // contiguous, n elements, the same n and dtype on all) into `output`
  // (dense, contiguous, world_size * n elements), rank r's at [r * n,
  // (r + 1) * n). `input` may be output's own chunk of this rank.
  // INVALID_ARGUMENT when the sizes or dtypes do not fit. A plan's group
  // copies `input` into every chunk.
  virtual absl::StatusOr<PendingCollective> StartAllGatherInto(
      const at::Tensor& output, const at::Tensor& input) = 0;
  // c10d's reduce_scatter_tensor with SUM: starts summing every rank's `input`
  // (world_size * n elements) and writing chunk r of the sum, [r * n,
  // (r + 1) * n), into rank r's `output` (n elements), which holds it once
  // Wait returns OK. `input`'s contents are unspecified afterwards: on Gloo,
  // whose reduce-scatter would all-reduce a copy of the whole input, the
  // input is all-reduced in place instead (the same traffic, no copy) and
  // Wait copies the chunk out. INVALID_ARGUMENT
  // when the sizes or dtypes do not fit. A plan's group copies this rank's
  // chunk of `input` into `output`.
  virtual absl::StatusOr<PendingCollective> StartReduceScatterSum(
      const at::Tensor& output, const at::Tensor& input) = 0;
  virtual absl::Status Barrier() = 0;

  // The run's key-value store (this attempt's prefix), for what is not a
  // collective: rank 0 publishing a command that the others pick up whenever
  // they next look. SetKey overwrites. WaitKey blocks until `key` exists or
  // `timeout` passes: DEADLINE_EXCEEDED then (the caller may wait again);
  // UNAVAILABLE when the store (rank 0, or torchrun's agent) is gone.
  // A plan's group has no store: FAILED_PRECONDITION.
  virtual absl::Status SetKey(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> WaitKey(const std::string& key,
                                              absl::Duration timeout) = 0;
  // A second connection to the same store, for another thread. UNAVAILABLE
  // when the store cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<StoreChannel>> OpenChannel() = 0;

 protected:
  explicit ProcessGroup(WorldSpec world);
  // INVALID_ARGUMENT unless `whole` is world_size() times `chunk`, both
  // contiguous and of one dtype.
  absl::Status CheckChunks(const char* what, const at::Tensor& whole,
                           const at::Tensor& chunk) const;
  // INVALID_ARGUMENT unless `root` is a rank (`what`: "reduce", "broadcast").
  absl::Status CheckRoot(const char* what, int root) const;

 private:
  const WorldSpec world_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_PROCESS_GROUP_H_
