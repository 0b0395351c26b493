#ifndef MEMPROFD_CORE_TRAIN_TRAIN_FIELDS_H_
#define MEMPROFD_CORE_TRAIN_TRAIN_FIELDS_H_

// The Train request's fields, listed once.
//
// A field of memprofd.v1.TrainRequest travels through six places: the proto,
// the server's conversion (server/convert.cc), core's TrainRequest (each field
// optional), the merge over the defaults (MergeTrainRequest), the JSON that
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
// TrainRequest, in the run's JSON and as memprofctl's flag. MEMBER is where
// TrainOptions keeps the merged value (an expression on a TrainOptions).
//
// This header is a list only: it includes nothing, so that memprofctl can use
// it without core's libraries.

// Plain values: TrainRequest holds std::optional<TYPE> NAME, TrainOptions
// TYPE MEMBER.
//   X(NAME, TYPE, MEMBER)
#define MEMPROFD_TRAIN_VALUE_FIELDS(X)                          \
  X(steps, int64_t, steps)                                      \
  X(batch_size, int64_t, batch_size)                            \
  X(seq_len, int64_t, seq_len)                                  \
  X(learning_rate, double, learning_rate)                       \
  X(seed, uint64_t, seed)                                       \
  X(gradient_checkpointing, bool, gradient_checkpointing)       \
  X(weight_decay, double, weight_decay)                         \
  X(beta1, double, beta1)                                       \
  X(beta2, double, beta2)                                       \
  X(adam_eps, double, adam_eps)                                 \
  X(max_grad_norm, double, max_grad_norm)                       \
  X(grad_accumulation_steps, int64_t, grad_accumulation_steps)  \
  X(warmup_steps, int64_t, lr_schedule.warmup_steps)            \
  X(min_lr_ratio, double, lr_schedule.min_lr_ratio)             \
  X(eval_every_steps, int64_t, eval_every_steps)                \
  X(eval_max_batches, int64_t, eval_max_batches)                \
  X(loss_chunk_tokens, int64_t, loss_chunk_tokens)

// Named choices: the request and the JSON carry the name (a string),
// TrainOptions the enum. PARSE(name) -> absl::StatusOr<enum> (INVALID_ARGUMENT
// listing the names it takes), NAME_OF(enum) -> absl::string_view.
//   X(NAME, MEMBER, PARSE, NAME_OF)
#define MEMPROFD_TRAIN_CHOICE_FIELDS(X)                                      \
  X(attn_implementation, attn_implementation, ParseAttentionImplementation, \
    AttentionImplementationName)                                             \
  X(lr_scheduler_type, lr_schedule.type, ParseLrSchedulerType,               \
    LrSchedulerTypeName)                                                     \
  X(mixed_precision, mixed_precision, ParseMixedPrecision, MixedPrecisionName)

// The fields of memprofd.v1.TrainRequest outside the two lists, each handled
// by hand where it is used: the data sources (messages of their own, with
// their own conversions: FromProto(v1::DataSource), DataSpec's JSON), and
// what belongs to TrainSpec rather than TrainRequest (offload, resume).
#define MEMPROFD_TRAIN_FIELDS_APART "data", "eval_data", "offload", "resume"

namespace memprofd {

// The names of the two lists' fields, in order (for tests and messages).
#define MEMPROFD_TRAIN_FIELD_NAME_(name, ...) #name,
inline constexpr const char* kTrainTableFieldNames[] = {
    MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_TRAIN_FIELD_NAME_)
        MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_TRAIN_FIELD_NAME_)};
#undef MEMPROFD_TRAIN_FIELD_NAME_
inline constexpr const char* kTrainFieldsApart[] = {MEMPROFD_TRAIN_FIELDS_APART};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_TRAIN_FIELDS_H_
