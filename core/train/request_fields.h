#ifndef MEMPROFD_CORE_TRAIN_REQUEST_FIELDS_H_
#define MEMPROFD_CORE_TRAIN_REQUEST_FIELDS_H_

// The fields of the Train and Evaluate requests, listed once.
//
// A field of memprofd.v1.TrainRequest travels through six places: the proto,
// the server's conversion (server/convert.cc), core's TrainOverrides (each field
// optional), the merge over the defaults (MergeTrainOverrides), the JSON that
// carries a run to the data-parallel followers and into trainer_state.json
// (trainer_state.cc), and memprofctl's flags (client/commands_train.cc). Each
// of them expands the lists below instead of naming the fields again, so a
// new field is added here, in the proto, and as a member of TrainOptions with
// its default; a place that cannot handle it stops compiling (memprofctl has
// no flag of that name, the proto no accessor), and tests/server/
// convert_test.cc fails when the proto has a field that is neither listed
// here nor among kTrainFieldsApart.
//
// Each entry's NAME is the field's name everywhere: in the proto, in
// TrainOverrides, in the run's JSON and as memprofctl's flag. MEMBER is where
// TrainOptions keeps the merged value (an expression on a TrainOptions).
//
// This header is a list only: it includes nothing, so that memprofctl can use
// it without core's libraries.

// What a forward pass over batches is, shared by both requests (and kept in
// members of the same names by TrainOptions and EvalOptions).
#define MEMPROFD_PASS_VALUE_FIELDS(X) \
  X(batch_size, int64_t, batch_size)  \
  X(seq_len, int64_t, seq_len)        \
  X(loss_chunk_tokens, int64_t, loss_chunk_tokens)
#define MEMPROFD_PASS_CHOICE_FIELDS(X)                                      \
  X(attn_implementation, attn_implementation, ParseAttentionImplementation, \
    AttentionImplementationName)                                            \
  X(mixed_precision, mixed_precision, ParseMixedPrecision, MixedPrecisionName)

// Plain values: TrainOverrides holds std::optional<TYPE> NAME, TrainOptions
// TYPE MEMBER.
//   X(NAME, TYPE, MEMBER)
#define MEMPROFD_TRAIN_VALUE_FIELDS(X)                         \
  MEMPROFD_PASS_VALUE_FIELDS(X)                                \
  X(steps, int64_t, steps)                                     \
  X(learning_rate, double, learning_rate)                      \
  X(seed, uint64_t, seed)                                      \
  X(gradient_checkpointing, bool, gradient_checkpointing)      \
  X(checkpoint_layers, int64_t, checkpoint_layers)             \
  X(weight_decay, double, weight_decay)                        \
  X(beta1, double, beta1)                                      \
  X(beta2, double, beta2)                                      \
  X(adam_eps, double, adam_eps)                                \
  X(max_grad_norm, double, max_grad_norm)                      \
  X(grad_accumulation_steps, int64_t, grad_accumulation_steps) \
  X(warmup_steps, int64_t, lr_schedule.warmup_steps)           \
  X(min_lr_ratio, double, lr_schedule.min_lr_ratio)            \
  X(eval_every_steps, int64_t, eval_every_steps)               \
  X(eval_max_batches, int64_t, eval_max_batches)               \
  X(lora_r, int64_t, lora.r)                                   \
  X(lora_alpha, double, lora.alpha)                            \
  X(lora_use_rslora, bool, lora.use_rslora)                    \
  X(lora_dropout, double, lora.dropout)

// Named choices: the request and the JSON carry the name (a string),
// TrainOptions the enum (or, for lora_targets, the list). PARSE(name) ->
// absl::StatusOr<enum> (INVALID_ARGUMENT listing the names it takes),
// NAME_OF(enum) -> a string (absl::string_view or std::string).
//   X(NAME, MEMBER, PARSE, NAME_OF)
#define MEMPROFD_TRAIN_CHOICE_FIELDS(X)                                             \
  MEMPROFD_PASS_CHOICE_FIELDS(X)                                                    \
  X(lr_scheduler_type, lr_schedule.type, ParseLrSchedulerType, LrSchedulerTypeName) \
  X(lora_targets, lora.target_modules, ParseLoraTargets, LoraTargetsName)           \
  X(base_dtype, base_dtype, ParseBaseDtype, BaseDtypeName)

// The fields of memprofd.v1.TrainRequest outside the two lists, each handled
// by hand where it is used: the data sources (messages of their own, with
// their own conversions: FromProto(v1::DataSource), DataSpec's JSON), and
// what belongs to TrainSpec rather than TrainOverrides (offload, resume,
// and memory_budget_bytes: a directive to the session, which plans under it
// and chooses some of the options, not an option of the run itself).
#define MEMPROFD_TRAIN_FIELDS_APART \
  "data", "eval_data", "offload", "resume", "memory_budget_bytes"

// The Evaluate request's fields, likewise: memprofd.v1.EvaluateRequest, the
// server's conversion, core's EvalSpec, MergeEvalSpec and
// memprofctl's evaluate flags expand these, MEMBER being EvalOptions'.
#define MEMPROFD_EVAL_VALUE_FIELDS(X) \
  MEMPROFD_PASS_VALUE_FIELDS(X)       \
  X(max_batches, int64_t, max_batches)
#define MEMPROFD_EVAL_CHOICE_FIELDS(X) MEMPROFD_PASS_CHOICE_FIELDS(X)
// memprofd.v1.EvaluateRequest's fields outside the lists: the data source.
#define MEMPROFD_EVAL_FIELDS_APART "data"

// Expanders the places share, each for both lists of a request.
// A request's members: std::optional of a value's type, a choice's name.
#define MEMPROFD_OPTIONAL_VALUE_FIELD(name, type, member) std::optional<type> name;
#define MEMPROFD_OPTIONAL_CHOICE_FIELD(name, ...) std::optional<std::string> name;
// The merge, with `request` (the request) and `o` (the options it fills) in
// scope; a choice whose name does not parse returns the parser's
// INVALID_ARGUMENT, which names the field.
#define MEMPROFD_MERGE_VALUE_FIELD(name, type, member) \
  if (request.name) o.member = *request.name;
#define MEMPROFD_MERGE_CHOICE_FIELD(name, member, parse, name_of) \
  if (request.name) {                                             \
    auto parsed = parse(*request.name);                           \
    if (!parsed.ok()) return parsed.status();                     \
    o.member = *parsed;                                           \
  }
// From a proto `r` into a request `t`: what the client set, unchecked.
#define MEMPROFD_FIELD_FROM_PROTO(name, ...) \
  if (r.has_##name()) t.name = r.name();

namespace memprofd {

// The names of each request's listed fields, in order, and of those handled
// apart (for tests and messages).
#define MEMPROFD_FIELD_NAME_(name, ...) #name,
inline constexpr const char* kTrainTableFieldNames[] = {MEMPROFD_TRAIN_VALUE_FIELDS(
    MEMPROFD_FIELD_NAME_) MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_FIELD_NAME_)};
inline constexpr const char* kTrainFieldsApart[] = {MEMPROFD_TRAIN_FIELDS_APART};
inline constexpr const char* kEvalTableFieldNames[] = {MEMPROFD_EVAL_VALUE_FIELDS(
    MEMPROFD_FIELD_NAME_) MEMPROFD_EVAL_CHOICE_FIELDS(MEMPROFD_FIELD_NAME_)};
inline constexpr const char* kEvalFieldsApart[] = {MEMPROFD_EVAL_FIELDS_APART};
#undef MEMPROFD_FIELD_NAME_

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_REQUEST_FIELDS_H_
