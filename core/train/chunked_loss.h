#ifndef MEMPROFD_CORE_TRAIN_CHUNKED_LOSS_H_
#define MEMPROFD_CORE_TRAIN_CHUNKED_LOSS_H_

// The language-model head and the next-token cross-entropy as one fused
// operation, computed in chunks of tokens so that no [tokens x vocab] logits
// (nor their gradient) exist at once, and with both gradients computed in
// the forward pass, so that backward recomputes nothing.
//
// At real vocabularies the logits are the step's largest activation: at
// 8 x 2048 tokens and Llama 3's 128,256 ids they are 8.4 GB in float32, and
// the unchunked loss keeps them, their float32 log-softmax and, in backward,
// their gradient. Here, for each chunk of tokens, forward computes the
// chunk's logits into one reused [chunk x vocab] float32 buffer, turns them
// into log-probabilities in place (the target's is the chunk's loss), then
// into (softmax - onehot(target)) / kept tokens in place (the logits'
// gradient for the mean; ignored targets, -100, get zero rows), and adds
// the chunk's share of the hidden states' gradient (dlogits . W, its rows)
// and of the weight's gradient (dlogits^T . h, summed over the chunks in
// float32). Three matmuls per chunk, as the unchunked loss's forward and
// backward do, never a fourth. What backward needs is what forward leaves:
// the hidden states' gradient [tokens x hidden], saved for backward (a saved
// activation: the offloader's hooks see it, and it replaces the hidden
// states themselves, which nothing needs any more), and the weight's
// gradient [vocab x hidden] in float32, attributed from its allocation to
// the weight's module as a gradient (category gradients), which it is.
// Backward multiplies both by the incoming gradient (1, or 1 / micro-batches
// under accumulation) and hands the weight's out with no other owner, so
// that AccumulateGrad adopts it as .grad without a copy (tied embeddings:
// the embedding's gradient, the same parameter).
//
// Costs against the unchunked loss: the same three matmuls; per chunk three
// in-place passes over the chunk's logits (log-softmax, exp, the scale),
// each row's log-softmax in cache; no [tokens x vocab] allocation, and the
// one chunk buffer allocated once per step (a fresh buffer per chunk costs
// the CPU allocator's page faults every time: as much as the log-softmax
// itself at 128k ids); the weight's float32 gradient exists from the end of forward
// rather than from the start of backward, while the hidden states it stands beside are no
// longer saved. Without gradients (evaluation, or neither input requiring one) only the
// loss is computed, and no autograd node is made. The backward runs once: retain_graph is
// refused with a message.
//
// Precision is transformers' ForCausalLMLoss's: the logits are upcast to
// float32 before the loss. Under bf16 autocast the head's matmuls run in
// bf16, as autocast runs the unchunked linear (inputs and weight cast to
// bf16), and the loss in float32; the function reads the autocast state when
// it runs forward: the logits' scaled gradient is computed in float32 and
// rounded once to bf16 for both matmuls (as autocast's backward casts the
// float32 loss's gradient), the hidden states' gradient is kept in bf16 (as
// the bf16 matmul returns it; half the bytes of the float32 hidden states)
// and widened in backward, and each chunk's share of the weight's gradient,
// a bf16 matmul, is summed in float32. The gradients then differ from
// autocast's unchunked ones by bf16 rounding only (each chunk's share of
// the weight's gradient is rounded to bf16 before the float32 sum, where
// the unchunked matmul rounds the whole sum once; chunked_loss_test
// measures it).
//
// Chunk size (AutomaticLossChunkTokens): min(hidden_size, the rows whose
// float32 logits fit kMaxLossChunkBytes), but at least kMinLossChunkTokens.
// Rows <= hidden_size bound a chunk's logits (rows x vocab x 4 bytes) by the
// float32 head weight itself (vocab x hidden x 4), which the model already
// holds four times over (weight, gradient, two AdamW moments), so the loss
// never dominates the peak whatever the vocabulary; the byte cap bounds it
// for wide models (llama-1b: 2048 -> 523 rows, 256 MiB); the floor keeps each
// chunk's matmul large enough that reading the weight once per chunk (2 x rows
// flops per weight element) stays cheaper than the arithmetic.
//
// Not chunked along the vocabulary: that would need an online logsumexp
// across vocabulary blocks and a second pass over the weight per token
// chunk, and it only lowers the peak when kMinLossChunkTokens rows of the
// whole vocabulary exceed the byte cap, i.e. for vocabularies above
// 262,144 ids; the largest the daemon's users bring is Qwen2.5's 151,936
// (256 rows: 156 MB).
//
// Not thread-safe beyond LibTorch's rules for autograd: run forward on the
// owner thread; backward runs where autograd runs it.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "core/common/attribution.h"

namespace memprofd {

class LlamaModel;

// The chunk size's bounds (see the file comment).
inline constexpr int64_t kMaxLossChunkBytes = int64_t{256} << 20;
inline constexpr int64_t kMinLossChunkTokens = 256;

// The tokens per chunk for a head of `vocab_size` x `hidden_size` (both >= 1).
int64_t AutomaticLossChunkTokens(int64_t vocab_size, int64_t hidden_size);

// The tokens per chunk that the option `loss_chunk_tokens` (EvalOptions'
// convention: kLossChunkAutomatic, kLossChunkOff or a count) asks for with
// this head, or 0 when chunking is off.
int64_t ResolveLossChunkTokens(int64_t loss_chunk_tokens, int64_t vocab_size,
                               int64_t hidden_size);

enum class LossReduction { kMean, kSum };

// The float32 scalar cross_entropy(hidden @ weight^T (upcast to float32),
// targets) with targets equal to -100 ignored, as
// torch::nn::functional::cross_entropy's default ignore_index; kMean divides
// by the targets not ignored (NaN when all are). hidden: [..., hidden_size]
// floating; weight: [vocab, hidden_size], the head's (a parameter, or the
// embedding's when tied); targets: int64 with hidden's leading shape.
// `chunk_tokens` >= 1 rows a chunk (one larger than the token count is one
// chunk). Allocations for the head's matmuls are attributed to
// `head_module`, the loss's to `loss_module`, under the op
// "memprofd::fused_linear_cross_entropy" in forward (backward's op is the
// node, "...FusedLinearCrossEntropy"); the weight's gradient to the weight's
// module, category gradients. Differentiable in hidden and weight, once;
// with grad mode off, or neither requiring grad, the loss alone (no node).
// Throws c10::Error like any LibTorch op (bad shapes, a target out of range,
// out of memory): run it inside TorchBoundary.
at::Tensor ChunkedHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                                   const at::Tensor& targets, int64_t chunk_tokens,
                                   LossReduction reduction, ModuleId head_module,
                                   ModuleId loss_module);

// The model's head and loss on hidden states [B, T, hidden] and targets
// [B, T]: chunked with ResolveLossChunkTokens(loss_chunk_tokens, ...), or,
// when that is off, model.Head(hidden) upcast to float32 and
// torch::nn::functional::cross_entropy (the logits materialized). Both
// attribute the head to "lm_head" and the loss to "loss". Throws as
// ChunkedHeadCrossEntropy.
at::Tensor LanguageModelLoss(const LlamaModel& model, const at::Tensor& hidden,
                             const at::Tensor& targets, int64_t loss_chunk_tokens,
                             LossReduction reduction);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_CHUNKED_LOSS_H_
