#ifndef MEMPROFD_CORE_TRAIN_EVALUATE_H_
#define MEMPROFD_CORE_TRAIN_EVALUATE_H_

// The evaluation loss of a model on held-out tokens: forward passes only,
// without gradients, through the model's own placement (weights placed on
// the CPU or on disk are fetched for each layer's forward, as in training).

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "core/train/eval_options.h"
#include "core/train/step_listener.h"

namespace memprofd {

class LlamaModel;
class TokenDataset;

// What runs around each unit of an evaluation's forward (the embedding, each
// decoder layer, the head with the loss), batch after batch: a fully sharded
// run gathers the unit's parameters in Enter and frees them in Leave, so an
// evaluation holds one unit at a time (and the next one's in flight), as
// training's forward does, instead of the whole model.
class EvalUnits {
 public:
  virtual ~EvalUnits() = default;
  // Before the unit's forward; an error stops the evaluation with it.
  virtual absl::Status Enter(const ModelUnit& unit) = 0;
  // After it (the head: after the loss).
  virtual void Leave(const ModelUnit& unit) = 0;
  // The most bytes of gathered parameters held at once so far
  // (EvalResult::peak_gathered_parameter_bytes).
  virtual int64_t peak_gathered_bytes() const = 0;
};

// The number of evaluation windows of seq_len + 1 tokens in `data` that
// EvaluateModel reads with `options` (consecutive, window i from token
// i * seq_len; at most max_batches * batch_size of them when max_batches >
// 0).
int64_t EvalWindows(const TokenDataset& data, const EvalOptions& options);
// The batches those windows make (the last one may be short).
int64_t EvalBatches(const TokenDataset& data, const EvalOptions& options);

// Mean next-token cross-entropy (and its exp, the perplexity) of `model`
// over EvalWindows(data, options) windows, batch_size a batch, with
// options.attn_implementation and mixed precision; `data` must hold at least
// one window (data.Validate(seq_len)). No autograd graph is built, so
// nothing is saved for backward and the model is unchanged (its attention
// implementation is set from the options). Runs inside TorchBoundary:
// RESOURCE_EXHAUSTED when a batch does not fit, INTERNAL for other LibTorch
// errors; INVALID_ARGUMENT for options or data that ValidateEvalOptions or
// data.Validate reject. result.global_step is left 0 for the caller. Owner
// thread only. `cancelled` (optional) is polled before each batch after the
// first; true stops with CANCELLED naming the batches done. `units`
// (optional) is called around every unit of every batch, and its figure
// becomes result.peak_gathered_parameter_bytes.
absl::StatusOr<EvalResult> EvaluateModel(LlamaModel& model, const TokenDataset& data,
                                         const EvalOptions& options,
                                         const std::function<bool()>& cancelled = {},
                                         EvalUnits* units = nullptr);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_EVALUATE_H_
