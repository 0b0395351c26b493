#ifndef MEMPROFD_CORE_MODEL_LLAMA_H_
#define MEMPROFD_CORE_MODEL_LLAMA_H_

// A Llama-family causal decoder (transformers' LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) in LibTorch:
// token embedding, decoder layers (RMSNorm, rotary position embedding,
// grouped-query causal self-attention, optionally within a sliding window,
// with the family's biases and q/k norms; SwiGLU MLP), final RMSNorm and a
// language-model head, tied to the embedding when the config says so.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/common/attribution.h"
#include "core/model/config.h"
#include "core/model/lora.h"
#include "core/model/placement.h"

namespace memprofd {

// The weights of one decoder layer, as leaf tensors that require grad.
// The optional ones are undefined where the config's family has none.
struct LlamaLayerWeights {
  at::Tensor q_proj;                    // [heads * head_dim, hidden]
  at::Tensor q_bias;                    // [heads * head_dim]      qkv_bias()
  at::Tensor k_proj;                    // [kv_heads * head_dim, hidden]
  at::Tensor k_bias;                    // [kv_heads * head_dim]   qkv_bias()
  at::Tensor v_proj;                    // [kv_heads * head_dim, hidden]
  at::Tensor v_bias;                    // [kv_heads * head_dim]   qkv_bias()
  at::Tensor o_proj;                    // [hidden, heads * head_dim]
  at::Tensor o_bias;                    // [hidden]                o_bias()
  at::Tensor q_norm;                    // [head_dim]              qk_norm()
  at::Tensor k_norm;                    // [head_dim]              qk_norm()
  at::Tensor gate_proj;                 // [intermediate, hidden]
  at::Tensor gate_bias;                 // [intermediate]          mlp_bias
  at::Tensor up_proj;                   // [intermediate, hidden]
  at::Tensor up_bias;                   // [intermediate]          mlp_bias
  at::Tensor down_proj;                 // [hidden, intermediate]
  at::Tensor down_bias;                 // [hidden]                mlp_bias
  at::Tensor input_layernorm;           // [hidden]
  at::Tensor post_attention_layernorm;  // [hidden]
};

// Which configs a layer parameter exists in.
enum class LayerPart { kAlways, kQkvBias, kOBias, kQkNorm, kMlpBias };
bool HasLayerPart(const LlamaConfig& config, LayerPart part);

// A decoder layer's parameters in transformers' state_dict order (modules
// in registration order, a Linear's weight before its bias): the name
// under "model.layers.N.", the member that holds it and when it exists.
// The one list of them: names, the state dict, loading, placement and the
// forward's fetches all walk it (through LlamaModel::layer_parameters(),
// which keeps the entries of the model's config).
struct LayerParameter {
  const char* name;
  at::Tensor LlamaLayerWeights::*member;
  LayerPart part;
};
inline constexpr LayerParameter kLayerParameters[] = {
    {"self_attn.q_proj.weight", &LlamaLayerWeights::q_proj, LayerPart::kAlways},
    {"self_attn.q_proj.bias", &LlamaLayerWeights::q_bias, LayerPart::kQkvBias},
    {"self_attn.k_proj.weight", &LlamaLayerWeights::k_proj, LayerPart::kAlways},
    {"self_attn.k_proj.bias", &LlamaLayerWeights::k_bias, LayerPart::kQkvBias},
    {"self_attn.v_proj.weight", &LlamaLayerWeights::v_proj, LayerPart::kAlways},
    {"self_attn.v_proj.bias", &LlamaLayerWeights::v_bias, LayerPart::kQkvBias},
    {"self_attn.o_proj.weight", &LlamaLayerWeights::o_proj, LayerPart::kAlways},
    {"self_attn.o_proj.bias", &LlamaLayerWeights::o_bias, LayerPart::kOBias},
    {"self_attn.q_norm.weight", &LlamaLayerWeights::q_norm, LayerPart::kQkNorm},
    {"self_attn.k_norm.weight", &LlamaLayerWeights::k_norm, LayerPart::kQkNorm},
    {"mlp.gate_proj.weight", &LlamaLayerWeights::gate_proj, LayerPart::kAlways},
    {"mlp.gate_proj.bias", &LlamaLayerWeights::gate_bias, LayerPart::kMlpBias},
    {"mlp.up_proj.weight", &LlamaLayerWeights::up_proj, LayerPart::kAlways},
    {"mlp.up_proj.bias", &LlamaLayerWeights::up_bias, LayerPart::kMlpBias},
    {"mlp.down_proj.weight", &LlamaLayerWeights::down_proj, LayerPart::kAlways},
    {"mlp.down_proj.bias", &LlamaLayerWeights::down_bias, LayerPart::kMlpBias},
    {"input_layernorm.weight", &LlamaLayerWeights::input_layernorm, LayerPart::kAlways},
    {"post_attention_layernorm.weight", &LlamaLayerWeights::post_attention_layernorm,
     LayerPart::kAlways},
};

// The model: float32 parameters on one device, named exactly as in
// transformers' LlamaForCausalLM.state_dict().
//
// The forward functions compute the same equations as transformers (HF's
// rotate_half rotary convention, key/value head k serving query heads
// [k * n_rep, (k + 1) * n_rep), softmax in float32), with positions
// 0..T-1 for an input of T tokens. They throw c10::Error on failure (bad
// shapes, out of memory): run them inside TorchBoundary. Everything else
// returns a status.
//
// Thread-safety: none. One owner thread uses the model; concurrent forward
// passes that do not train are safe, as for any LibTorch module.
class LlamaModel {
 public:
  // Builds a model from a valid config (Validate() is called: its error is
  // returned), with weights drawn from normal(0, 0.02) in state-dict order by
  // a CPU generator seeded with `seed` (the same on every device), RMSNorm
  // weights 1. RESOURCE_EXHAUSTED when the weights do not fit.
  //
  // `base_dtype` bfloat16 makes every weight bf16 (the float32 draws
  // rounded, one tensor at a time) and frozen: such a model trains LoRA
  // adapters only (SetBaseDtype's model, without the float32 base ever
  // held). INVALID_ARGUMENT for another dtype than float32 or bfloat16.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      const LlamaConfig& config, uint64_t seed,
      c10::Device device = c10::Device(c10::DeviceType::CPU),
      at::ScalarType base_dtype = at::kFloat);

  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;
  ~LlamaModel();

  // input_ids: int64 [B, T] on device(), T <= max_position_embeddings.
  // Returns logits [B, T, vocab_size] (float32).
  at::Tensor Forward(const at::Tensor& input_ids) const;

  // Forward split for callers that scope parts differently (the trainer runs
  // the head under another offload scope) or checkpoint layer by layer:
  // Forward(ids) == Head(FinalNorm(Layer(L-1, ... Layer(0, Embed(ids))))).
  //
  // Embedding + all layers + final norm: hidden states [B, T, hidden].
  at::Tensor ForwardHidden(const at::Tensor& input_ids) const;
  at::Tensor Embed(const at::Tensor& input_ids) const;
  // Decoder layer `index` (0-based) on hidden states [B, T, hidden].
  at::Tensor Layer(int64_t index, const at::Tensor& hidden) const;
  at::Tensor FinalNorm(const at::Tensor& hidden) const;
  // The language-model head: [B, T, hidden] -> logits [B, T, vocab_size].
  at::Tensor Head(const at::Tensor& hidden) const;
  // The head's weight [vocab_size, hidden] on the compute device (fetched
  // from its placement for this pass, as Head does), for callers that
  // compute the head themselves (the chunked loss). The embedding's weight
  // when the head is tied.
  at::Tensor HeadWeight() const;
  // The interned module id of "lm_head", for callers that scope the head's
  // work themselves.
  ModuleId head_module() const { return head_module_; }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const LlamaLayerWeights& layer(int64_t index) const { return layers_.at(index); }
  // Layer `index`'s parameters in state-dict order, then its adapters.
  std::vector<at::Tensor> LayerParameters(int64_t index) const;
  // The entries of kLayerParameters this model's layers have.
  const std::vector<LayerParameter>& layer_parameters() const {
    return layer_parameters_;
  }

  // All parameters with their transformers names, in state_dict() order,
  // each layer's LoRA adapters (NamedAdapters) after its own parameters.
  // "lm_head.weight" is always last; when the head is tied it is the same
  // tensor (same storage) as "model.embed_tokens.weight", as in
  // transformers. The tensors are the live parameters (not copies).
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() const;
  // transformers' state dict: NamedParameters without the adapters.
  std::vector<std::pair<std::string, at::Tensor>> NamedBaseParameters() const;

  // LoRA (lora.h). Adds adapters on options' targets in every decoder
  // layer, on the device: A drawn Kaiming-uniform (bound 1 / sqrt(in)) by a
  // CPU generator seeded with `seed`, layer by layer and target by target
  // in kLoraTargets order; B zeros. Every base parameter is frozen from then
  // on (no gradient, no optimizer state). ValidateLoraOptions's errors;
  // FAILED_PRECONDITION when the model has adapters already.
  absl::Status AddLora(const LoraOptions& options, uint64_t seed);
  // The adapters' options; unset without adapters.
  const std::optional<LoraOptions>& lora() const { return lora_; }
  // The dtype the base weights are kept in: float32, or bfloat16 (frozen)
  // when Create made them so or SetBaseDtype cast them.
  at::ScalarType base_dtype() const { return base_dtype_; }
  // Keeps every base weight (embeddings, norms, projections, biases, head)
  // in `dtype` (float32 or bfloat16) from now on, cast one tensor at a time
  // (at most one tensor's copy beyond the model). Under bf16 autocast the
  // forward then computes exactly as with float32 weights rounded to bf16:
  // the embedding's output and the norms' products stay float32, and the
  // projections take the weights autocast would have cast. A base that is
  // `dtype` already is left as it is; *changed (when given) says whether a
  // tensor was cast. FAILED_PRECONDITION without adapters (only a frozen
  // base may lose precision), for float32 asked of a bf16 base (the rounding
  // cannot be undone), and when a module is placed on disk (its weights are
  // a read-only mapping of float32); INVALID_ARGUMENT for another dtype. A
  // cast that runs out of memory leaves the model bf16 with the rest of its
  // weights float32 (the forward still runs under autocast): calling again
  // casts them.
  absl::Status SetBaseDtype(at::ScalarType dtype, bool* changed = nullptr);
  // SetBaseDtype's refusals but the missing adapters: what a caller about to
  // add them checks first.
  absl::Status CheckBaseDtype(at::ScalarType dtype) const;
  // LoRA dropout (LoraOptions::dropout > 0) applies inside a training step
  // alone: the trainer sets the step's key for the forward and backward of
  // each micro-batch and unsets it after, so evaluations (and a model used
  // any other way) draw no mask. Each adapter's mask is seeded with the key
  // and the adapter's own (LoraPair::key), so a checkpointed layer's
  // recompute and a resumed step draw the masks they drew before.
  void SetLoraDropoutKey(std::optional<uint64_t> key) { lora_dropout_key_ = key; }
  // Copies `adapters` (NamedAdapters's names; peft's keys without their
  // "base_model.model." prefix) into the model's adapters, converting dtype
  // and device. Every name and shape is checked before anything is copied:
  // INVALID_ARGUMENT naming the unknown, missing or mis-shaped tensor;
  // FAILED_PRECONDITION without adapters (AddLora first).
  absl::Status LoadAdapters(
      const std::vector<std::pair<std::string, at::Tensor>>& adapters);
  // The adapters by name, peft's without its "base_model.model." prefix
  // ("model.layers.0.self_attn.q_proj.lora_A.weight", then lora_B), in
  // peft's state-dict order; empty without adapters.
  std::vector<std::pair<std::string, at::Tensor>> NamedAdapters() const;
  // A fingerprint of the base weights (NamedBaseParameters): their names,
  // shapes and 256 values of each sampled at fixed positions, hashed
  // (FNV-1a, 64 bits, as 16 hex digits). Equal for the same base however
  // loaded and whether kept in float32 or bf16 (the values are rounded to
  // bf16 first); a different base (another checkpoint, seed or fine-tune)
  // differs with near certainty. Reads 256 values per tensor, never the whole model:
  // what a checkpoint of adapters records of the base they trained on.
  std::string BaseFingerprint() const;
  // OK when `recorded` (a BaseFingerprint taken when `whose` adapters
  // trained) is this model's base's; FAILED_PRECONDITION naming both
  // otherwise: adapters on another base would train silently wrong.
  absl::Status CheckBaseFingerprint(const std::string& recorded,
                                    absl::string_view whose) const;
  // Every adapted projection, layer by layer in kLoraTargets order; empty
  // without adapters. What a merged snapshot folds (scaling · B·A into W).
  std::vector<AdaptedProjection> AdaptedProjections() const;
  // The distinct parameters (a tied head once), for an optimizer.
  std::vector<at::Tensor> Parameters() const;
  // Non-parameter tensors the model holds: the rotary cos and sin caches,
  // [max_position_embeddings, head_dim] each. Not part of the state dict.
  std::vector<at::Tensor> Buffers() const;
  // The number of parameter elements, each storage counted once.
  int64_t NumParameters() const;

  const LlamaConfig& config() const { return config_; }
  c10::Device device() const { return device_; }

  // How the forward computes attention (kSdpa unless told otherwise). The
  // trainer sets it from each request.
  AttentionImplementation attention_implementation() const { return attention_; }
  void set_attention_implementation(AttentionImplementation attention) {
    attention_ = attention;
  }

  // What SDPA runs when the model is on the meta device (a dry run,
  // core/plan). LibTorch picks SDPA's kernel per device type and has no
  // choice for meta, so it takes the math path there, which allocates what
  // no fused kernel does; a dry run asks instead for the kernel its target
  // would pick (their Meta kernels are core/plan's): the CPU's flash
  // attention, or CUDA's flash or memory-efficient attention. A layer whose
  // sliding window is shorter than the sequence (an explicit mask) takes the
  // math path with any CUDA kernel. No effect off the meta device.
  enum class MetaSdpaKernel { kMath, kCpuFlash, kCudaFlash, kCudaEfficient };
  void set_meta_sdpa_kernel(MetaSdpaKernel kernel) { meta_sdpa_kernel_ = kernel; }

  // Rebinds `module`'s weights to the tensors of `weights` (by parameter
  // name; not copied) and records its placement:
  // - kCpu: CPU tensors, trainable (made leaves that require grad) unless
  //   the base is frozen;
  // - kDisk: float32 CPU tensors that view a memory-mapped file; frozen
  //   (no gradients, no optimizer state), since writing them would copy the
  //   pages into memory; FAILED_PRECONDITION for a bf16 base;
  // - kDevice: tensors on device(), trainable unless the base is frozen.
  // The tensors are of the base's dtype (base_dtype()).
  // Forward brings cpu and disk weights to the device for the call only (on a
  // CPU device they are used where they are). With a tied head, place
  // "model.embed_tokens"; "lm_head" follows it. INVALID_ARGUMENT for an
  // unknown module, a missing or mis-shaped weight, a dtype other than the
  // base's, or tensors on the wrong device.
  absl::Status PlaceModule(
      const std::string& module, Placement placement,
      const std::vector<std::pair<std::string, at::Tensor>>& weights);
  Placement PlacementOf(const std::string& module) const;
  // Whether any module lives away from the device.
  bool has_placement() const { return !placement_.empty(); }

  // Copies `state` into the parameters (converting dtype and device), by
  // name. All names and shapes are checked before anything is copied:
  // INVALID_ARGUMENT naming the unknown, missing or mis-shaped tensor.
  // With a tied head, "lm_head.weight" may be absent (save_pretrained drops
  // it); when present it must have the embedding's shape and is ignored.
  // FAILED_PRECONDITION when a weight belongs to a module placed on disk
  // (read-only memory-mapped). Keys of the rotary embedding's inverse
  // frequencies ("...rotary_emb.inv_freq"), a non-persistent buffer older
  // transformers versions saved, are skipped as transformers skips them,
  // and counted into *ignored when it is given.
  absl::Status LoadStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state,
                             int64_t* ignored = nullptr);

 private:
  LlamaModel(LlamaConfig config, c10::Device device);
  void Initialize(uint64_t seed);

  // `t` on the compute device: itself when it lives there, else a
  // differentiable copy for this forward pass.
  at::Tensor Fetch(const at::Tensor& t) const;
  // NamedParameters, or without the adapters NamedBaseParameters.
  std::vector<std::pair<std::string, at::Tensor>> Named(bool with_adapters) const;
  // The parameter slots of `module`, by name; empty for an unknown module.
  std::vector<std::pair<std::string, at::Tensor*>> ModuleSlots(const std::string& module);

  // The interned module paths of one decoder layer ("model.layers.N" and its
  // submodules), pushed as ModuleScopes by the forward so that every
  // allocation names its module (memory attribution).
  struct LayerModules {
    ModuleId layer, input_layernorm, self_attn, q_proj, k_proj, v_proj, o_proj, q_norm,
        k_norm, post_attention_layernorm, mlp, gate_proj, up_proj, down_proj;
  };

  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  // `window`: the layer's sliding window (config.LayerWindow), 0 for none.
  at::Tensor Attention(const LlamaLayerWeights& w, const LlamaLayerLora& lora,
                       const LayerModules& m, int64_t window, const at::Tensor& h) const;
  // A projection: linear(x, weight, bias), plus B(A(x)) * scaling when
  // `lora` is defined.
  at::Tensor Project(const at::Tensor& x, const at::Tensor& weight,
                     const at::Tensor& bias, const LoraPair& lora) const;
  // SDPA on the meta device: the kernel meta_sdpa_kernel_ names (above),
  // causal unless `windowed` (then `mask` is the window's, and a CUDA
  // kernel falls back to the math path).
  at::Tensor MetaSdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& mask, bool windowed) const;

  const LlamaConfig config_;
  const c10::Device device_;
  const std::vector<LayerParameter> layer_parameters_;
  AttentionImplementation attention_ = AttentionImplementation::kSdpa;
  MetaSdpaKernel meta_sdpa_kernel_ = MetaSdpaKernel::kMath;
  at::Tensor embed_tokens_;  // [vocab, hidden]
  std::vector<LlamaLayerWeights> layers_;
  at::Tensor norm_;     // [hidden]
  at::Tensor lm_head_;  // [vocab, hidden]; embed_tokens_ itself when tied
  at::Tensor rope_cos_;
  at::Tensor rope_sin_;
  std::vector<LayerModules> layer_modules_;
  ModuleId embed_module_ = 0;
  ModuleId norm_module_ = 0;
  ModuleId head_module_ = 0;
  // Modules placed away from the device (absent: kDevice).
  std::map<std::string, Placement> placement_;
  // LoRA: the options, and each layer's adapters (all undefined without).
  std::optional<LoraOptions> lora_;
  std::vector<LlamaLayerLora> lora_layers_;
  std::optional<uint64_t> lora_dropout_key_;
  at::ScalarType base_dtype_ = at::kFloat;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_LLAMA_H_
