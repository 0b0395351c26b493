#ifndef MEMPROFD_CORE_TRAIN_STEP_LISTENER_H_
#define MEMPROFD_CORE_TRAIN_STEP_LISTENER_H_

// What takes part in a training step besides the model and the optimizer:
// the activation offloader, the data-parallel gradient synchronisation, the
// session's reporting and boundary work. Each is a StepListener, handed to
// Trainer::Run (or Step) for that run only; the trainer calls every listener
// at each moment below, in the order given. Nothing is installed on the
// trainer, so nothing has to be wrapped or restored afterwards.
//
// One step, as the trainer calls it:
//
//   AtBoundary()                      before each step of a run (not in Step)
//   OnStepBegin(global_step)
//   for each micro-batch:
//     BodyScope() held   around the embedding, decoder layers and final norm
//       each unit (the embedding, each decoder layer, then the head: the
//       final norm, lm_head and loss) between BeforeUnit(unit, false) and
//       AfterUnitForward(unit)
//     HeadScope() held   around the lm_head and the loss
//     OnForwardEnd()
//     BeforeBackward(last)
//     BeforeUnit(head, true)
//     loss.backward()    BeforeUnit(unit, true) as backward reaches each
//                        other unit's output, in reverse order
//     AfterBackward()                 after the last micro-batch's backward
//   gradient norm: CombineGradNorm(norm), clipping
//   BeforeUpdate()
//   optimizer update
//   AfterUpdate()
//   OnStepEnd(report)                 the step succeeded
//   OnStepFailed(status, global_step) or: the step failed inside its boundary
//   OnStepReported(report)            the run has counted the step
//   BeforeEvaluation() ... AfterEvaluation()   around an evaluation in the
//                                     run (eval_every_steps)
//
// Thread-safety: every call is on the trainer's (owner) thread, inside the
// step. Listeners are not owned; they must outlive the call they are given
// to.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/train/train_options.h"

namespace memprofd {

class EvalUnits;  // evaluate.h

// The part of every batch this process trains on, in a data-parallel run:
// the global batch of batch_size x shards windows is drawn the same way on
// every rank (same generator, same order), and shard `index` takes rows
// [index * batch_size, (index + 1) * batch_size). So a run of N ranks sees the
// windows one process with batch N x batch_size would, and every rank's
// generator stays in step.
struct DataShard {
  int index = 0;
  int count = 1;
};

// A part of the model that a step runs as a whole: the embedding, decoder
// layer `layer`, or the head (the final norm, lm_head and the loss). A
// listener that holds parameters only while they are used (fully sharded
// data parallel) gathers a unit's before it runs.
struct ModelUnit {
  enum class Kind { kEmbedding, kLayer, kHead };
  Kind kind = Kind::kEmbedding;
  int64_t layer = -1;  // kLayer only

  static ModelUnit Embedding() { return {Kind::kEmbedding, -1}; }
  static ModelUnit Layer(int64_t index) { return {Kind::kLayer, index}; }
  static ModelUnit Head() { return {Kind::kHead, -1}; }
};

class StepListener {
 public:
  virtual ~StepListener() = default;

  // The shard of each global batch this listener's process takes; at most
  // one listener of a run may return one (data parallel). Asked once per
  // run, before its first step.
  virtual std::optional<DataShard> data_shard() const { return std::nullopt; }

  // At the boundary before each step of a run: the place for work that must
  // not overlap a step (snapshots, the data-parallel agreement on stopping).
  // true stops the run there as a cancellation does (result.cancelled); an
  // error ends the run with that status.
  virtual absl::StatusOr<bool> AtBoundary() { return false; }

  // After the step's phase marker (BeginStep), before its first micro-batch.
  virtual void OnStepBegin(int64_t /*global_step*/) {}

  // Held (the returned token kept alive; null for none) during the forward of
  // the embedding, the decoder layers and the final norm, and during the
  // lm_head's forward and the loss. Both are taken in listener order and
  // released in reverse.
  virtual std::shared_ptr<void> BodyScope() { return nullptr; }
  virtual std::shared_ptr<void> HeadScope() { return nullptr; }

  // Before `unit` runs: its forward (backward false), or its backward
  // (true: from a hook on the unit's output, inside loss.backward(), before
  // the unit's gradients and any recomputation of its checkpointed forward;
  // the head's just before loss.backward()). An error fails the step with
  // that status.
  virtual absl::Status BeforeUnit(const ModelUnit& /*unit*/, bool /*backward*/) {
    return absl::OkStatus();
  }
  // After `unit`'s forward, its output computed.
  virtual void AfterUnitForward(const ModelUnit& /*unit*/) {}

  // After each micro-batch's forward (the loss computed, every scope above
  // released), before its backward.
  virtual void OnForwardEnd() {}
  // Before each micro-batch's backward; `last` for the step's final one,
  // whose gradients are complete.
  virtual void BeforeBackward(bool /*last*/) {}
  // After the last micro-batch's backward, before the gradient norm,
  // clipping and the update; may replace the gradients (data parallel
  // averages them here). An error fails the step with that status.
  virtual absl::Status AfterBackward() { return absl::OkStatus(); }

  // The step's gradient norm, given the norm of the gradients this process
  // holds (the previous listener's result), before the finiteness check and
  // clipping: the norm they and the report use. A listener whose process
  // holds only its share of the gradients (sharded data parallel) combines
  // every rank's here, so that all ranks clip and skip alike. An error fails
  // the step with that status (no update).
  virtual absl::StatusOr<double> CombineGradNorm(double norm) { return norm; }

  // After the gradient norm and clipping (which read every gradient), before
  // the optimizer update, in the optimizer phase; not called when the step's
  // loss or norm is not finite (no update). May drop gradients (set them to
  // none): the update skips a parameter without a gradient, its value and
  // state kept (sharded data parallel updates only its own parameters).
  virtual void BeforeUpdate() {}
  // After BeforeUpdate: whether the update is kept, given whether this
  // process's would be (every value it would write finite and within
  // Trainer::kMaxParameterMagnitude). A listener whose process updates only
  // its share (sharded data parallel) combines every rank's here, so that
  // all ranks keep it or none does. An error fails the step (no update).
  virtual absl::StatusOr<bool> AgreeOnUpdate(bool keep) { return keep; }
  // After the optimizer update, in the optimizer phase, before the gradients
  // are cleared; may change parameters (sharded data parallel takes each
  // from the rank that updated it). An error fails the step with that
  // status (the update stays done).
  virtual absl::Status AfterUpdate() { return absl::OkStatus(); }

  // After a successful update, before the step's EndStep; may amend the
  // report (data parallel puts the global batch's loss there). An error fails
  // the step with that status (the update stays done).
  virtual absl::Status OnStepEnd(StepReport& /*report*/) { return absl::OkStatus(); }
  // After a step failed inside its boundary (`status` is not OK), before its
  // gradients are cleared and before EndStep: the OOM report's moment.
  virtual void OnStepFailed(const absl::Status& /*status*/, int64_t /*global_step*/) {}

  // After a run counted the step: its cursor moved, its evaluation (if due)
  // in the report. Run's on_step callback comes after every listener's.
  virtual void OnStepReported(const StepReport& /*report*/) {}

  // Around an evaluation inside a run (eval_every_steps), after the step's
  // update. An error from either fails the run with it.
  virtual absl::Status BeforeEvaluation() { return absl::OkStatus(); }
  virtual absl::Status AfterEvaluation() { return absl::OkStatus(); }
  // Between them: what runs around each unit of the evaluation's forward
  // (evaluate.h; full sharding gathers each unit there), or null for
  // nothing. At most one listener of a run returns one.
  virtual EvalUnits* evaluation_units() { return nullptr; }
};

// The listeners of one run, in calling order (null entries are not allowed).
using StepListeners = std::vector<StepListener*>;

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_STEP_LISTENER_H_
