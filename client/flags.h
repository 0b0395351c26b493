#ifndef MEMPROFD_CLIENT_FLAGS_H_
#define MEMPROFD_CLIENT_FLAGS_H_

// memprofctl's flags. Every flag may stand before or after the command;
// each command reads the ones it documents.

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/string_view.h"

namespace memprofd::cli {

// A byte count on the command line (--capacity, --memory_budget): a whole
// number of bytes, optionally with a binary suffix KiB, MiB, GiB or TiB
// ("6GiB" is 6 * 2^30). The parse fails on anything else and on a count
// beyond int64; the sign is kept, for the daemon to judge.
struct ByteCount {
  int64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteCount* out, std::string* error);
std::string AbslUnparseFlag(ByteCount count);

// Notes which flags argv names (--name, --name=value, --noname, -name), for
// GivenFlag. Call with main's arguments, before or after parsing them.
void NoteGivenFlags(int argc, char** argv);
// The names noted; a "noX" spelling is noted as both "noX" and "X".
const std::set<std::string>& GivenFlagNames();

// The flag's value when it was given on the command line, else nothing: what
// lets a command send only what the user asked for. (absl's own
// IsSpecifiedOnCommandLine is private in the Debian 12 version.)
template <typename T>
std::optional<T> GivenFlag(const absl::Flag<T>& flag) {
  const std::string name(absl::GetFlagReflectionHandle(flag).Name());
  if (GivenFlagNames().count(name) == 0) return std::nullopt;
  return absl::GetFlag(flag);
}

}  // namespace memprofd::cli

ABSL_DECLARE_FLAG(std::string, addr);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int64_t, timeout_ms);
ABSL_DECLARE_FLAG(std::string, service);
// train
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(int64_t, batch_size);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_DECLARE_FLAG(double, learning_rate);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, token_data);
ABSL_DECLARE_FLAG(int32_t, bytes_per_token);
ABSL_DECLARE_FLAG(std::string, indexed_data);
ABSL_DECLARE_FLAG(std::string, indexed_windows);
ABSL_DECLARE_FLAG(bool, gradient_checkpointing);
ABSL_DECLARE_FLAG(bool, checkpointing);
ABSL_DECLARE_FLAG(int64_t, checkpoint_layers);
ABSL_DECLARE_FLAG(int64_t, lora_r);
ABSL_DECLARE_FLAG(std::string, lora_adapter);
ABSL_DECLARE_FLAG(double, lora_alpha);
ABSL_DECLARE_FLAG(bool, lora_use_rslora);
ABSL_DECLARE_FLAG(double, lora_dropout);
ABSL_DECLARE_FLAG(std::string, base_dtype);
ABSL_DECLARE_FLAG(std::string, lora_targets);
ABSL_DECLARE_FLAG(std::string, attn_implementation);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(double, beta1);
ABSL_DECLARE_FLAG(double, beta2);
ABSL_DECLARE_FLAG(double, adam_eps);
ABSL_DECLARE_FLAG(double, max_grad_norm);
ABSL_DECLARE_FLAG(int64_t, grad_accumulation_steps);
ABSL_DECLARE_FLAG(int64_t, grad_accum);
ABSL_DECLARE_FLAG(bool, offload);
ABSL_DECLARE_FLAG(std::string, offload_target);
ABSL_DECLARE_FLAG(int64_t, min_offload_bytes);
ABSL_DECLARE_FLAG(int32_t, max_copies_in_flight);
ABSL_DECLARE_FLAG(bool, offload_head);
ABSL_DECLARE_FLAG(std::string, prefetch_depth);
ABSL_DECLARE_FLAG(std::string, lr_scheduler_type);
ABSL_DECLARE_FLAG(int64_t, warmup_steps);
ABSL_DECLARE_FLAG(double, min_lr_ratio);
ABSL_DECLARE_FLAG(std::string, mixed_precision);
ABSL_DECLARE_FLAG(int64_t, eval_every_steps);
ABSL_DECLARE_FLAG(std::string, eval_data);
ABSL_DECLARE_FLAG(std::string, eval_token_data);
ABSL_DECLARE_FLAG(int64_t, eval_max_batches);
ABSL_DECLARE_FLAG(memprofd::cli::ByteCount, memory_budget);
// evaluate (and --data, --token_data, --bytes_per_token, --batch_size,
// --seq_len, --attn_implementation, --mixed_precision)
ABSL_DECLARE_FLAG(int64_t, max_batches);
// train and evaluate
ABSL_DECLARE_FLAG(int64_t, loss_chunk_tokens);
// load
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(std::string, hf_dir);
ABSL_DECLARE_FLAG(std::string, placement);
// snapshot
ABSL_DECLARE_FLAG(std::string, max_shard_size);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, kind);
// plan (and --preset, the train flags, --offload)
ABSL_DECLARE_FLAG(std::string, hf_config);
ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(memprofd::cli::ByteCount, capacity);
ABSL_DECLARE_FLAG(int32_t, world_size);
ABSL_DECLARE_FLAG(std::string, sharding);
// load and train
ABSL_DECLARE_FLAG(bool, resume);
ABSL_DECLARE_FLAG(bool, init_weights);
// memory
ABSL_DECLARE_FLAG(int64_t, max_entries);
ABSL_DECLARE_FLAG(bool, clear);
ABSL_DECLARE_FLAG(bool, all_ranks);
ABSL_DECLARE_FLAG(std::string, o);
ABSL_DECLARE_FLAG(std::string, by);
ABSL_DECLARE_FLAG(std::string, phase);
ABSL_DECLARE_FLAG(int64_t, top);

#endif  // MEMPROFD_CLIENT_FLAGS_H_
