#include "client/flags.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051", "memprofd's gRPC address");
ABSL_FLAG(std::string, token_file, "", "file whose first line is the bearer token");
ABSL_FLAG(std::string, tls_ca, "", "PEM root certificates; use TLS when set");
ABSL_FLAG(bool, json, false, "print JSON (proto field names), one object per line");
ABSL_FLAG(int64_t, timeout_ms, 10000, "deadline of each unary call, in milliseconds");
ABSL_FLAG(std::string, service, "",
          "health: the service to ask about (\"\" = the server)");

// train. Named as memprofd.v1.TrainRequest's fields; a flag not given is not
// sent, so the daemon's default holds (shown in brackets).
ABSL_FLAG(int64_t, steps, 100, "train: optimizer steps");
ABSL_FLAG(int64_t, batch_size, 8, "train: sequences per micro-batch [8]");
ABSL_FLAG(int64_t, seq_len, 128, "train: tokens per sequence [128]");
ABSL_FLAG(double, learning_rate, 1e-3, "train: AdamW's learning rate [1e-3]");
ABSL_FLAG(double, lr, 1e-3, "train: short for --learning_rate");
ABSL_FLAG(uint64_t, seed, 0, "train: data order seed [0]; load: initialisation seed");
ABSL_FLAG(std::string, data, "",
          "train: a text file on the daemon's host, read as bytes (default: the embedded "
          "corpus)");
ABSL_FLAG(std::string, token_data, "",
          "train: a binary file of little-endian token ids on the daemon's host (nanoGPT "
          ".bin)");
ABSL_FLAG(std::string, indexed_data, "",
          "train, evaluate: a Megatron indexed dataset on the daemon's host, the "
          "prefix of PREFIX.bin and PREFIX.idx");
ABSL_FLAG(std::string, indexed_windows, "",
          "train: packed (across documents, Megatron's) or within_documents for "
          "--indexed_data [packed]");
ABSL_FLAG(int32_t, bytes_per_token, 2,
          "train: 2 (uint16) or 4 (uint32) for --token_data [2]");
ABSL_FLAG(bool, gradient_checkpointing, false,
          "train: recompute each decoder layer in backward [false]");
ABSL_FLAG(bool, checkpointing, false, "train: short for --gradient_checkpointing");
ABSL_FLAG(int64_t, checkpoint_layers, 0,
          "train: with --gradient_checkpointing, checkpoint the first N decoder layers "
          "(0: all) [0]");
ABSL_FLAG(std::string, attn_implementation, "sdpa",
          "train: sdpa (fused scaled_dot_product_attention) or eager [sdpa]");
ABSL_FLAG(double, weight_decay, 0.0, "train: AdamW weight decay [0]");
ABSL_FLAG(double, beta1, 0.9, "train: AdamW beta1 [0.9]");
ABSL_FLAG(double, beta2, 0.999, "train: AdamW beta2 [0.999]");
ABSL_FLAG(double, adam_eps, 1e-8, "train: AdamW epsilon [1e-8]");
ABSL_FLAG(double, max_grad_norm, 0.0, "train: clip the gradient norm (0: off) [0]");
ABSL_FLAG(int64_t, grad_accumulation_steps, 1,
          "train: micro-batches per optimizer step [1]");
ABSL_FLAG(int64_t, grad_accum, 1, "train: short for --grad_accumulation_steps");
ABSL_FLAG(bool, offload, false,
          "train: offload saved activations; --nooffload turns it off (default: the "
          "daemon's --offload)");
ABSL_FLAG(std::string, offload_target, "",
          "train: disk or host (default: the daemon's, disk on CPU hosts)");
ABSL_FLAG(int64_t, min_offload_bytes, 1024,
          "train: smallest span moved (default: the daemon's; 0 moves every tensor)");
ABSL_FLAG(int32_t, max_copies_in_flight, 5,
          "train: copies off the device in flight at once during forward (default: "
          "the daemon's)");
ABSL_FLAG(bool, offload_head, false,
          "train: offload the LM head's activations too; --nooffload_head keeps them "
          "(default: the daemon's)");
ABSL_FLAG(std::string, prefetch_depth, "",
          "train: offloaded storages backward reads ahead: auto, 0 (off) or N "
          "(default: the daemon's)");
ABSL_FLAG(std::string, lr_scheduler_type, "constant",
          "train: constant, constant_with_warmup, linear, cosine or cosine_with_min_lr "
          "(transformers' names) [constant]");
ABSL_FLAG(int64_t, warmup_steps, 0, "train: linear warmup steps from 0 [0]");
ABSL_FLAG(double, min_lr_ratio, 0.0,
          "train: cosine_with_min_lr's floor, a fraction of the learning rate [0]");
ABSL_FLAG(std::string, mixed_precision, "no",
          "train, evaluate: no (float32) or bf16 (autocast; float32 weights) [no]");
ABSL_FLAG(int64_t, eval_every_steps, 0,
          "train: evaluate on --eval_data / --eval_token_data every N steps [0: never]");
ABSL_FLAG(std::string, eval_data, "",
          "train: evaluation text file on the daemon's host, read as bytes; 'embedded' "
          "for the embedded corpus");
ABSL_FLAG(std::string, eval_token_data, "",
          "train: evaluation token file (as --token_data, --bytes_per_token)");
ABSL_FLAG(int64_t, eval_max_batches, 0, "train: evaluation batches each time [0: all]");
ABSL_FLAG(memprofd::cli::ByteCount, memory_budget, {},
          "train: run the fastest configuration whose planned peak fits this many "
          "bytes (or KiB, MiB, GiB, TiB: 6GiB); see docs/planning.md [no budget]");
ABSL_FLAG(int64_t, max_batches, 0, "evaluate: at most N batches [0: every window]");
ABSL_FLAG(int64_t, lora_r, 0,
          "train: LoRA rank; > 0 trains peft-format adapters on a frozen base "
          "(docs/lora.md) [0: every parameter trains]");
ABSL_FLAG(double, lora_alpha, 8.0,
          "train: LoRA scaling numerator (peft's lora_alpha) [8]");
ABSL_FLAG(double, lora_dropout, 0.0,
          "train: LoRA dropout on the adapters' inputs in training steps (peft's "
          "lora_dropout) [0]");
ABSL_FLAG(bool, lora_use_rslora, false,
          "train: scale LoRA by alpha / sqrt(r) instead of alpha / r [false]");
ABSL_FLAG(std::string, lora_targets, "q_proj,v_proj",
          "train: projections to adapt, comma-separated (q_proj, k_proj, v_proj, o_proj, "
          "gate_proj, up_proj, down_proj) or all-linear [q_proj,v_proj]");
ABSL_FLAG(std::string, base_dtype, "float32",
          "load, train: the dtype of the frozen base of LoRA runs, float32 or bf16 "
          "(training needs --mixed_precision bf16; a model loaded so trains adapters "
          "only) [float32]");
ABSL_FLAG(int64_t, loss_chunk_tokens, 0,
          "train, evaluate: LM head and loss in chunks of N tokens; 0: automatic, "
          "from the vocabulary and hidden size; -1: off, the logits materialized [0]");

ABSL_FLAG(std::string, preset, "",
          "load, plan: a built-in model (tiny, small, smollm2-135m, qwen2.5-0.5b, "
          "llama-3.2-1b)");
ABSL_FLAG(std::string, hf_dir, "",
          "load: a Hugging Face model directory on the daemon's host");
ABSL_FLAG(
    std::string, placement, "",
    "load: module=device|cpu|disk,... (model.embed_tokens, model.layers.N, model.norm, "
    "lm_head)");

ABSL_FLAG(std::string, hf_config, "",
          "plan: a Hugging Face model directory on the daemon's host whose "
          "config.json alone is read");
ABSL_FLAG(std::string, target, "",
          "plan: the device to plan for, cpu or cuda (default: the daemon's device)");
ABSL_FLAG(memprofd::cli::ByteCount, capacity, {},
          "plan: the device's capacity in bytes (or KiB, MiB, GiB, TiB: 80GiB), for the "
          "verdict (0: no verdict)");
ABSL_FLAG(int32_t, world_size, 1,
          "plan: the ranks of a data-parallel run to plan, each training its own "
          "--batch_size windows [1]");
ABSL_FLAG(std::string, sharding, "none",
          "plan: the data-parallel run's sharding, as memprofd's --sharding: none, "
          "optimizer, gradients or full [none]");

ABSL_FLAG(std::string, max_shard_size, "",
          "snapshot: shard size as transformers writes it (5GB, 500MB) or bytes");
ABSL_FLAG(std::string, dtype, "keep", "snapshot: keep, bf16, fp16 or fp32");
ABSL_FLAG(std::string, mode, "blocking", "snapshot: blocking or async");
ABSL_FLAG(std::string, kind, "",
          "snapshot: weights, checkpoint (weights, optimizer and training state, to "
          "resume from), adapter (a LoRA model's adapters, as peft saves them) or "
          "merged (a LoRA model with its adapters folded into the weights) "
          "[the daemon's: weights]");
ABSL_FLAG(bool, resume, false,
          "load: the directory is a checkpoint, restore its training state too; train: "
          "continue the last run at its next step (unset flags, --steps included, take "
          "that run's values)");
ABSL_FLAG(std::string, lora_adapter, "",
          "load: a LoRA adapter directory as peft saves it, loaded onto the model "
          "(docs/lora.md)");
ABSL_FLAG(bool, init_weights, false,
          "load: take --hf_dir's config.json only and initialise the weights from "
          "--seed (a directory without weights needs it)");

ABSL_FLAG(int64_t, max_entries, 100000, "memory record start: history ring size");
ABSL_FLAG(bool, clear, false, "memory record stop: also drop the history");
ABSL_FLAG(bool, all_ranks, false,
          "memory (on rank 0 of a data-parallel run): every rank's memory and the "
          "spread across ranks");
ABSL_FLAG(std::string, o, "", "memory dump: output file");
ABSL_FLAG(std::string, by, "module", "memory top: group by module, op or category");
ABSL_FLAG(std::string, phase, "",
          "memory top: peaks within this phase (forward, backward, optimizer, ...)");
ABSL_FLAG(int64_t, top, 20, "memory top / diff: rows to show");

namespace memprofd::cli {
namespace {
std::set<std::string>& Names() {
  static std::set<std::string> names;
  return names;
}
}  // namespace

void NoteGivenFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const std::string name(arg.substr(0, arg.find('=')));
    if (name.empty()) continue;
    Names().insert(name);
    if (absl::StartsWith(name, "no")) Names().insert(name.substr(2));
  }
}

const std::set<std::string>& GivenFlagNames() { return Names(); }

bool AbslParseFlag(absl::string_view text, ByteCount* out, std::string* error) {
  struct Suffix {
    absl::string_view name;
    int shift;
  };
  static constexpr Suffix kSuffixes[] = {
      {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
  int shift = 0;
  for (const Suffix& s : kSuffixes) {
    if (absl::ConsumeSuffix(&text, s.name)) {
      shift = s.shift;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n)) {
    *error = "a whole number of bytes, optionally with KiB, MiB, GiB or TiB (6GiB)";
    return false;
  }
  const int64_t limit = std::numeric_limits<int64_t>::max() >> shift;
  if (n > limit || n < -limit) {
    *error = "beyond int64 bytes";
    return false;
  }
  out->bytes = n * (int64_t{1} << shift);
  return true;
}

std::string AbslUnparseFlag(ByteCount count) { return absl::StrCat(count.bytes); }

}  // namespace memprofd::cli
