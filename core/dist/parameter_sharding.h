#ifndef MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_
#define MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_

// The parameters of a fully sharded (ZeRO-3, FSDP-style) data-parallel run:
// each rank keeps only a flat shard of each parameter (its piece, the
// partition of core/common/flat_shard.h, padded with zeros to the chunk size
// c, ceil(n / N) rounded up to 16), and holds a parameter whole only while a
// unit of the model that uses it runs. The shards are the only copy: the
// sharded optimizer updates them in place (PieceTarget: this rank's piece,
// without the padding).
//
// Where the shards live: one flat buffer per group of parameters, a
// storage of its own tagged `parameters` (with the group's module: the
// longest module path its parameters share), holding the group's padded
// chunks one after another. A group is a unit of the model (the embedding,
// a decoder layer, the head: UnitParameterIndices), each parameter in the
// first unit that uses it (a head tied to the embedding gathers the
// embedding's group), and a parameter of no unit in a group of its own.
//
//   Gather(unit)   every rank all-gathers the flat buffer of each group the
//                  unit uses (c10d all_gather_into_tensor: one collective
//                  per group, in model order) into a buffer of N times its
//                  size, laid out rank-major (row r: rank r's buffer), as
//                  FSDP2's all-gather output is. Once it has arrived, each
//                  parameter's storage is allocated again with N * c
//                  elements (the parameter views the first n) and its
//                  column of the rows is copied in; the gathered buffer is
//                  then freed. Before the unit's forward, and before its
//                  backward (the hook on its output), so that a checkpointed
//                  layer's recomputation finds its weights.
//   Release(unit)  frees the unit's parameters' storages (no collective),
//                  and autocast's cached casts of them (which would otherwise
//                  stay until the forward ends: every unit's, in a
//                  checkpointed forward, where autograd saves none of them).
//                  After the unit's forward; in backward, each parameter is
//                  freed as soon as its gradient is accumulated (a post-hook
//                  on its gradient accumulator, which runs after every node
//                  that reads the parameter).
//
// How a parameter is freed and brought back: its storage (one per
// parameter) is resized to 0 bytes and back, the storage object itself kept,
// as FSDP's first version does. So the tensors autograd saved in forward (a
// leaf is saved as itself, never copied), the offloader's filter of
// parameter storages and every view stay valid, and the parameter's version
// counter never moves (the copy writes through an alias with a counter of
// its own), so autograd does not see the refill as an in-place change.
// The refilled storage is tagged gathered_parameters with its module; the
// gathered buffer in flight too, with its group's.
//
// Communication overlaps compute: once a unit's parameters are there,
// Gather starts the all-gathers of the next unit's groups (the next layer in
// forward, the previous one in backward) without waiting for them, so they
// travel while the unit computes; the next Gather waits for what is still in
// flight (the exposed time). So a rank holds at most two units' worth
// gathered at once (the unit running and the next one's buffer in flight),
// besides the head between its forward and its backward, and for the moment
// of a copy the unit's buffer and its parameters both.
//
// A reader on rank 0 that needs the parameters one at a time (the snapshot
// writer at a step boundary, which must never hold a second copy of the
// model) streams them, one all-gather per parameter, straight into its
// storage:
//
//   StreamParameter(k)  rank 0 broadcasts the index k, then every rank
//                       all-gathers parameter k; rank 0 reads it and
//                       ReleaseParameter(k)s it.
//   EndStream()         rank 0 broadcasts -1.
//   FollowStream()      every other rank: joins each of rank 0's broadcasts,
//                       holding each parameter only while it travels, until
//                       the -1.
//
// So the order is rank 0's alone (the writer's file layout decides it), the
// collectives match on every rank, and each rank holds at most one whole
// parameter at a time.
//
// An evaluation gathers unit by unit as training's forward does
// (ShardedEvaluation, an EvalUnits). Inside a run every rank evaluates the
// same data, so the units come in the same order everywhere. At a step
// boundary only rank 0 evaluates, and the others follow a stream of units
// the way they follow the parameter stream:
//
//   StreamUnit(unit)    rank 0 broadcasts the unit's index, then every rank
//                       Gathers it (the next unit's all-gathers start early
//                       on every rank alike).
//   FollowUnitStream()  every other rank: frees the unit before and Gathers
//                       each one rank 0 broadcasts, until the -1 (EndStream).
//
// So an evaluation holds at most the unit running and the next one in
// flight, never the whole model.
//
// Every rank calls Gather with the same units in the same order (the same
// model and step): which groups a call all-gathers, and in what order,
// depends only on that order, so the ranks' collectives match. The
// embedding's backward reads only the token ids, so the embedding is not
// gathered for it.
//
// Thread-safety: the trainer's owner thread (and the autograd hooks on it).
// The group and the model must outlive this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/common/flat_shard.h"
#include "core/dist/accumulator_hooks.h"
#include "core/dist/process_group.h"
#include "core/train/evaluate.h"
#include "core/train/step_listener.h"

namespace memprofd {

class LlamaModel;

// The model's units as indices into `params` (model->Parameters() or a
// subset in its order): the embedding, each decoder layer, then the head
// (final norm and lm_head; the embedding again when the head is tied). A
// parameter of none of them is in none.
std::vector<std::vector<size_t>> UnitParameterIndices(
    const LlamaModel& model, const std::vector<at::Tensor>& params);

struct ParameterShardingStats {
  // Bytes of this rank's shards (kept all along, padding included).
  int64_t owned_bytes = 0;
  // Bytes of whole parameters and gathered buffers held now, and the most
  // held at once since the last ResetPeak: the gathered working set.
  int64_t gathered_bytes = 0;
  int64_t peak_gathered_bytes = 0;
  // All-gathers since the last ResetPeak (one per group a unit gathers, one
  // per streamed parameter), and those of them started ahead of their unit
  // (the next unit's, overlapped).
  int64_t gathers = 0;
  int64_t prefetched = 0;
  // Time Gather and GatherAll spent waiting for all-gathers since the last
  // ResetPeak: the communication compute did not hide.
  double exposed_seconds = 0;
};

class ParameterSharding {
 public:
  // Copies this rank's shard of each model->Parameters() entry and installs
  // the free-after-gradient hooks; every parameter is still whole
  // (ReleaseAll frees them). INVALID_ARGUMENT when a parameter shares its
  // storage with another tensor; FAILED_PRECONDITION for a frozen parameter
  // or a model with modules placed off the device (their weights are views
  // of host or disk memory, not the rank's to free).
  static absl::StatusOr<std::unique_ptr<ParameterSharding>> Create(ProcessGroup* group,
                                                                   LlamaModel* model);
  ~ParameterSharding();  // removes the hooks; leaves the storages as they are
  ParameterSharding(const ParameterSharding&) = delete;
  ParameterSharding& operator=(const ParameterSharding&) = delete;

  // Gathers `unit`'s parameters that are not held and waits for those in
  // flight, then starts the next unit's (above); backward for the gather
  // before the unit's backward (nothing for the embedding). The collective's
  // status on failure (the run is then broken).
  absl::Status Gather(const ModelUnit& unit, bool backward);
  // Frees `unit`'s parameters.
  void Release(const ModelUnit& unit);
  // Every parameter, whole, on every rank (an all-gather of each not held);
  // the model is then as unsharded data parallel leaves it.
  absl::Status GatherAll();
  // Frees every parameter.
  void ReleaseAll();
  // This rank's piece of parameter k (its shard without the padding): a 1-D
  // tensor of its own over the shard's memory, for the optimizer to update
  // (FusedAdamW::Retarget).
  at::Tensor PieceTarget(size_t k) const;

  // The parameter stream (above). Call only where the model is sharded (no
  // unit gathered: at a step boundary). StreamParameter: rank 0 only;
  // returns the bytes it allocated to hold parameter k; INVALID_ARGUMENT for k out of
  // range, else the collectives' status (the run is then broken). FollowStream: the other
  // ranks; the collectives' status, or INTERNAL for an index out of range.
  absl::StatusOr<int64_t> StreamParameter(size_t k);
  void ReleaseParameter(size_t k) { FreeOne(k); }
  absl::Status EndStream();
  absl::Status FollowStream();
  // The unit stream (above), likewise: StreamUnit on rank 0, ended by
  // EndStream; FollowUnitStream on the others (INTERNAL for an index out of
  // range), which frees what it gathered before it returns.
  absl::Status StreamUnit(const ModelUnit& unit);
  absl::Status FollowUnitStream();
  // The index of parameter `p` (the same tensor) in model->Parameters();
  // nullopt for a tensor that is not one of them.
  std::optional<size_t> IndexOf(const at::Tensor& p) const;

  const ParameterShardingStats& stats() const { return stats_; }
  void ResetPeak();
  // Figures of their own for what runs between the two (an evaluation):
  // Begin returns the figures so far and starts afresh (ResetPeak); End puts
  // them back, so that the step's stay the step's.
  ParameterShardingStats BeginSeparateFigures();
  void EndSeparateFigures(const ParameterShardingStats& before);

 private:
  ParameterSharding(ProcessGroup* group, LlamaModel* model,
                    std::vector<at::Tensor> params);
  // Parameter indices of `unit`, in model order (units_'s entry).
  const std::vector<size_t>& UnitParameters(const ModelUnit& unit) const;
  // The unit that runs after `unit` in forward, or in backward; nullopt for
  // none (the head in forward; the first layer in backward, since the
  // embedding is not gathered for its backward).
  std::optional<ModelUnit> NextUnit(const ModelUnit& unit, bool backward) const;
  // Starts the all-gather of group g's flat buffer; Complete waits for it
  // and copies each parameter of the group that is not held out of it.
  absl::Status StartGather(size_t group);
  absl::Status Complete(size_t group);
  // Starts the all-gathers of the groups of `unit`'s parameters that are
  // neither held nor in flight; `prefetch`: counted as prefetched.
  absl::Status StartUnit(const ModelUnit& unit, bool prefetch);
  // Parameter k whole, on its own (one all-gather into its storage), unless
  // held; waits for its group's all-gather instead when it is in flight.
  absl::Status GatherOne(size_t index);
  // Allocates parameter k's storage (N * c elements) and returns a tensor of
  // its own over all of it, padding included, for the copy or the
  // all-gather to write through (so that the parameter's version counter
  // stays).
  absl::StatusOr<at::Tensor> Refill(size_t index);
  // Rank 0's stream index (-1: the end), broadcast from rank 0.
  absl::StatusOr<int64_t> BroadcastStreamIndex(int64_t index);
  // A unit's index in units_ (the embedding 0, layer i i + 1, the head
  // last), and back (nullopt out of range).
  int64_t UnitIndex(const ModelUnit& unit) const;
  std::optional<ModelUnit> UnitAt(int64_t index) const;
  void FreeOne(size_t index);

  ProcessGroup* const group_;
  LlamaModel* const model_;
  const std::vector<at::Tensor> params_;
  // Each group's flat buffer of shards (its parameters' padded chunks in
  // order), its parameters, and its module.
  std::vector<at::Tensor> flat_;
  std::vector<std::vector<size_t>> groups_;
  std::vector<int64_t> group_modules_;
  // Each group's all-gather in flight, and the buffer it writes to.
  std::vector<PendingCollective> pending_;
  std::vector<at::Tensor> gathered_;
  // Per parameter: this rank's shard (a view of its group's buffer, chunk
  // elements), its group, its offset in the group's buffer, its piece, its
  // storage bytes gathered, its ModuleId (for tagging), and whether it is
  // held whole (the same on every rank).
  std::vector<at::Tensor> shards_;
  std::vector<size_t> group_of_;
  std::vector<int64_t> offsets_;
  std::vector<FlatChunk> pieces_;
  std::vector<int64_t> nbytes_;
  std::vector<int64_t> modules_;
  std::vector<bool> held_;
  // Each unit's parameter indices: the embedding, each layer, the head.
  std::vector<std::vector<size_t>> units_;
  std::unique_ptr<AccumulatorHooks> hooks_;  // frees each after its gradient
  ParameterShardingStats stats_;
};

// An evaluation's forward over the sharded model: each unit gathered before
// its forward (Gather, or StreamUnit when `lead`) and freed after it. Its
// figures are its own (peak_gathered_bytes); destroying it frees whatever is
// still gathered and puts the step's figures back. `lead`: rank 0 at a step
// boundary, whose evaluation the other ranks follow (FollowUnitStream);
// Finish, or else the destructor, ends the stream. Every rank must create
// it at the same point. Thread-safety: ParameterSharding's.
class ShardedEvaluation : public EvalUnits {
 public:
  ShardedEvaluation(ParameterSharding* sharded, bool lead);
  ~ShardedEvaluation() override;
  ShardedEvaluation(const ShardedEvaluation&) = delete;
  ShardedEvaluation& operator=(const ShardedEvaluation&) = delete;

  absl::Status Enter(const ModelUnit& unit) override;
  void Leave(const ModelUnit& unit) override;
  int64_t peak_gathered_bytes() const override;
  // `lead`: EndStream's status, once; OK at once when not leading, already
  // ended, or after a unit's collective failed (the run is then broken and
  // nothing more is sent).
  absl::Status Finish();

 private:
  ParameterSharding* const sharded_;
  const bool lead_;
  bool ended_ = false;
  const ParameterShardingStats before_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_PARAMETER_SHARDING_H_
