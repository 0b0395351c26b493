#ifndef MEMPROFD_CORE_MODEL_LORA_H_
#define MEMPROFD_CORE_MODEL_LORA_H_

// LoRA adapters as peft defines them (LoraConfig in peft 0.21; the options
// are lora_options.h's): on each
// targeted projection of every decoder layer, A [r, in] and B [out, r], and
// the projection's forward becomes base(x) + B(A(x)) * scaling, with scaling
// lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). A starts
// Kaiming-uniform with a = sqrt(5) (bound 1 / sqrt(in)), B at zero, so a
// fresh adapter changes nothing. The base weights are frozen.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/model/config.h"
#include "core/model/lora_options.h"

namespace memprofd {

// One adapted projection: A [r, in] and B [out, r]; undefined when the
// projection is not targeted.
struct LoraPair {
  at::Tensor a;
  at::Tensor b;
  // Which projection of which layer (layer * 8 + its kLoraTargets index):
  // with the training step's key, what seeds the pair's dropout mask.
  uint64_t key = 0;
};

// A decoder layer's adapters, one pair per projection.
struct LlamaLayerLora {
  LoraPair q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

// The projections LoRA can target, in a layer's module order (peft's
// state-dict order): the target name, the module under "model.layers.N.",
// and the adapter pair that holds it.
struct LoraTarget {
  const char* name;
  const char* module;
  LoraPair LlamaLayerLora::*pair;
};
inline constexpr LoraTarget kLoraTargets[] = {
    {"q_proj", "self_attn.q_proj", &LlamaLayerLora::q_proj},
    {"k_proj", "self_attn.k_proj", &LlamaLayerLora::k_proj},
    {"v_proj", "self_attn.v_proj", &LlamaLayerLora::v_proj},
    {"o_proj", "self_attn.o_proj", &LlamaLayerLora::o_proj},
    {"gate_proj", "mlp.gate_proj", &LlamaLayerLora::gate_proj},
    {"up_proj", "mlp.up_proj", &LlamaLayerLora::up_proj},
    {"down_proj", "mlp.down_proj", &LlamaLayerLora::down_proj},
};

// One adapted projection of a model: its base weight (the live parameter,
// [out, in]) under its transformers name, and its adapters.
struct AdaptedProjection {
  std::string weight_name;  // "model.layers.N.self_attn.q_proj.weight"
  at::Tensor weight;
  LoraPair adapter;
};

// One 64-bit seed from two (splitmix64's finaliser over their combination):
// nearby inputs give unrelated seeds.
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// peft's dropout on an adapter's input: each element of `x` kept with
// probability 1 - p and scaled by 1 / (1 - p), else zeroed, the mask drawn
// from a generator of x's device seeded with `seed` alone, so that the same
// seed gives the same mask (a checkpointed layer's recompute, a resumed
// step). Backward keeps the mask (one byte an element). On the meta device
// it allocates as it would and draws nothing (plans).
at::Tensor LoraDropout(const at::Tensor& x, double p, uint64_t seed);

// The tensor dtype a base of BaseDtype `dtype` (lora_options.h) is kept in,
// and back.
inline at::ScalarType ScalarTypeOf(BaseDtype dtype) {
  return dtype == BaseDtype::kBf16 ? at::kBFloat16 : at::kFloat;
}
inline BaseDtype BaseDtypeOf(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? BaseDtype::kBf16 : BaseDtype::kFloat32;
}

// The [out, in] shape of projection `name` (a kLoraTargets name) in
// `config`'s decoder layers.
std::pair<int64_t, int64_t> ProjectionShape(const LlamaConfig& config,
                                            const std::string& name);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_LORA_H_
