// Placement specs (LoadModel's module=placement list): ModuleOfParameter on
// any name, then LlamaModel::PlaceModule of a fuzzed module name with the
// model's own weights (float32 CPU copies) on a two-layer model. The first
// byte picks the placement. Oracle: INVALID_ARGUMENT only for a module that
// is not one of the model's; an accepted module is one of
// model.embed_tokens, model.layers.0..1, model.norm, lm_head (no other
// spelling of a layer number), and PlacementOf reports the placement.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <set>

#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/model/placement.h"
#include "fuzz/fuzz_util.h"

using memprofd::LlamaConfig;
using memprofd::LlamaModel;
using memprofd::Placement;

namespace {

struct Fixture {
  Fixture() {
    LlamaConfig config;
    config.vocab_size = 16;
    config.hidden_size = 8;
    config.intermediate_size = 16;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 2;
    config.num_key_value_heads = 1;
    config.max_position_embeddings = 16;
    auto created = LlamaModel::Create(config, 0);
    FUZZ_CHECK(created.ok());
    model = *std::move(created);
    for (const auto& [name, t] : model->NamedParameters()) {
      weights.emplace_back(name, t.detach().clone());
      modules.insert(memprofd::ModuleOfParameter(name));
    }
  }
  std::unique_ptr<LlamaModel> model;
  std::vector<std::pair<std::string, at::Tensor>> weights;
  std::set<std::string> modules;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  if (size < 1) return 0;
  const Placement placement = static_cast<Placement>(data[0] % 3);
  const std::string module(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string of = memprofd::ModuleOfParameter(module);
  FUZZ_CHECK(of.size() <= module.size());

  const absl::Status placed =
      fixture->model->PlaceModule(module, placement, fixture->weights);
  if (!placed.ok()) {
    memprofd::fuzz::CheckBadInputStatus(placed, {absl::StatusCode::kInvalidArgument});
    return 0;
  }
  FUZZ_CHECK(fixture->modules.count(module) == 1);
  FUZZ_CHECK(fixture->model->PlacementOf(module) == placement);
  return 0;
}
