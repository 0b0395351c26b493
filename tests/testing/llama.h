#ifndef MEMPROFD_TESTS_TESTING_LLAMA_H_
#define MEMPROFD_TESTS_TESTING_LLAMA_H_

// Llama models for tests: a config small enough for training steps of a few
// milliseconds, the built-in presets, and model construction that fails the
// test instead of returning a status. Thread-safe (the models they return
// are not; see core/model/llama.h).

#include <cstdint>
#include <memory>
#include <string>

#include "core/model/config.h"
#include "core/model/llama.h"

namespace memprofd {
namespace testing {

// Byte-level (vocab 256, so any text is data), hidden 32, intermediate 64,
// 2 layers, 4 attention heads over 2 key-value heads (grouped-query
// attention), 64 positions, rms_norm_eps 1e-5, tied head. A training step of
// batch 4 x 32 takes milliseconds on a CPU.
LlamaConfig SmallLlamaConfig();

// The config of built-in preset `name` ("tiny", "small", "llama-1b"). Fails
// the running test and returns SmallLlamaConfig() for an unknown name.
LlamaConfig PresetConfig(const std::string& name);

// A model of `config` with weights drawn from `seed`, on the CPU. Null, with
// the running test failed and the status printed, when Create refuses the
// config.
std::unique_ptr<LlamaModel> MakeLlama(const LlamaConfig& config, uint64_t seed);

// `c` (of two layers) as Qwen2: q/k/v biases, and a sliding window of 8
// keys on its second layer.
LlamaConfig AsWindowedQwen2(LlamaConfig c);
// `c` as Qwen3: per-head q/k norms, all four attention biases, an untied
// head, full attention on every layer.
LlamaConfig AsQwen3(LlamaConfig c);

// Draws every LoRA B of `model` from N(0, 0.05²) with a generator seeded
// `seed`, as if the adapters had trained: a fresh adapter's B is zero, so it
// changes nothing and A's gradients are zero.
void DrawLoraB(LlamaModel& model, uint64_t seed);

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_LLAMA_H_
