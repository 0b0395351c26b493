#ifndef MEMPROFD_CORE_OFFLOAD_OFFLOAD_FIELDS_H_
#define MEMPROFD_CORE_OFFLOAD_OFFLOAD_FIELDS_H_

// The offload options a Train request may set, listed once.
//
// A field of memprofd.v1.OffloadOptions travels through the proto, the
// server's conversion (server/convert.cc), core's OffloadOverrides (each field
// optional) and their merge over the daemon's OffloadOptions
// (MergeOffloadOverrides), the JSON of a train command that carries the run to
// the data-parallel followers (core/session/rank_messages.cc), memprofctl's
// train flags (client/commands_train.cc) and the daemon's flags, which set the
// defaults (server/main.cc). Each of them expands the list below instead of
// naming the fields again: a new field is added here, in the proto, as a
// member of OffloadOptions with its default and as a flag of each binary; a
// place that cannot handle it stops compiling, and tests/server/
// convert_test.cc fails when the proto has a field that is not listed here.
//
//   X(NAME, TYPE, CLI_FLAG, DAEMON_FLAG)
// NAME is the field's name in the proto, in OffloadOverrides, in
// OffloadOptions and in the run's JSON; TYPE its type in core; CLI_FLAG and
// DAEMON_FLAG the names of memprofctl's and the daemon's flags. A target is a
// name ("host", "disk") in flags and JSON and an enum on the wire; a read-ahead
// depth may be written "auto" in flags (-1 on the wire and in JSON).
//
// This header is a list only: it includes nothing, so that memprofctl can use
// it without core's libraries.
#define MEMPROFD_OFFLOAD_FIELDS(X)                                         \
  X(enabled, bool, offload, offload)                                       \
  X(target, Target, offload_target, offload_target)                        \
  X(min_offload_bytes, int64_t, min_offload_bytes, min_offload_bytes)      \
  X(max_copies_in_flight, int, max_copies_in_flight, max_copies_in_flight) \
  X(prefetch_depth, int, prefetch_depth, offload_prefetch_depth)           \
  X(offload_head, bool, offload_head, offload_head)

// OffloadOptions' members that only the daemon's flags set: where offloaded
// bytes go and how much host memory they may take stay the operator's.
#define MEMPROFD_OFFLOAD_DAEMON_ONLY_FIELDS "spill_dir", "host_limit_bytes"

namespace memprofd::offload {

#define MEMPROFD_OFFLOAD_FIELD_NAME_(name, ...) #name,
inline constexpr const char* kOffloadFieldNames[] = {
    MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_FIELD_NAME_)};
#undef MEMPROFD_OFFLOAD_FIELD_NAME_

}  // namespace memprofd::offload

#endif  // MEMPROFD_CORE_OFFLOAD_OFFLOAD_FIELDS_H_
