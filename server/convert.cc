#include "server/convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/dist/sharding.h"
#include "core/offload/offload_fields.h"
#include "core/snapshot/shard_plan.h"
#include "core/train/request_fields.h"
#include "server/convert_plan.h"
#include "server/option_flags.h"

namespace memprofd {

int64_t UnixMicros(absl::Time t) {
  if (t == absl::InfinitePast()) return 0;
  return absl::ToUnixMicros(t);
}

namespace {

// proto3 keeps enum values it does not know (a newer client's, or any int):
// they are refused by name rather than read as the default.
template <typename IsValid>
absl::Status CheckEnum(absl::string_view field, int value, IsValid is_valid) {
  if (is_valid(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown value ", value, " (see the enum in memprofd.v1)"));
}

// One field of memprofd.v1.OffloadOptions into its OffloadOverrides member
// (offload_fields.h): scalars as they are; a target by enum, where
// OFFLOAD_TARGET_UNSPECIFIED leaves it to the daemon.
template <typename Wire, typename Core>
absl::Status OffloadFieldFromProto(absl::string_view, Wire value,
                                   std::optional<Core>* out) {
  *out = value;
  return absl::OkStatus();
}
absl::Status OffloadFieldFromProto(absl::string_view field, v1::OffloadTarget value,
                                   std::optional<offload::Target>* out) {
  if (absl::Status s = CheckEnum(field, value, v1::OffloadTarget_IsValid); !s.ok())
    return s;
  if (value == v1::OFFLOAD_TARGET_HOST) *out = offload::Target::kHost;
  if (value == v1::OFFLOAD_TARGET_DISK) *out = offload::Target::kDisk;
  return absl::OkStatus();
}

// Snapshot kinds on the wire and in core; UNSPECIFIED reads as weights.
struct SnapshotKindPair {
  v1::SnapshotKind wire;
  snapshot::SnapshotKind kind;
};
constexpr SnapshotKindPair kSnapshotKinds[] = {
    {v1::SNAPSHOT_KIND_WEIGHTS, snapshot::SnapshotKind::kWeights},
    {v1::SNAPSHOT_KIND_CHECKPOINT, snapshot::SnapshotKind::kCheckpoint},
    {v1::SNAPSHOT_KIND_ADAPTER, snapshot::SnapshotKind::kAdapter},
    {v1::SNAPSHOT_KIND_MERGED, snapshot::SnapshotKind::kMerged},
};

snapshot::SnapshotKind FromProto(v1::SnapshotKind wire) {
  for (const SnapshotKindPair& k : kSnapshotKinds) {
    if (k.wire == wire) return k.kind;
  }
  return snapshot::SnapshotKind::kWeights;
}

v1::SnapshotKind ToProto(snapshot::SnapshotKind kind) {
  for (const SnapshotKindPair& k : kSnapshotKinds) {
    if (k.kind == kind) return k.wire;
  }
  return v1::SNAPSHOT_KIND_WEIGHTS;
}

v1::OperationState ToProto(OperationState s) {
  switch (s) {
    case OperationState::kQueued:
      return v1::OPERATION_STATE_QUEUED;
    case OperationState::kRunning:
      return v1::OPERATION_STATE_RUNNING;
    case OperationState::kSucceeded:
      return v1::OPERATION_STATE_SUCCEEDED;
    case OperationState::kFailed:
      return v1::OPERATION_STATE_FAILED;
    case OperationState::kCancelled:
      return v1::OPERATION_STATE_CANCELLED;
  }
  return v1::OPERATION_STATE_UNSPECIFIED;
}

}  // namespace

v1::Operation ToProto(const OperationView& view) {
  v1::Operation op;
  op.set_id(view.id);
  op.set_kind(static_cast<v1::OperationKind>(static_cast<int>(view.kind)));
  op.set_state(ToProto(view.state));
  op.set_done(view.done);
  v1::Progress* p = op.mutable_progress();
  p->set_completed(view.completed);
  p->set_total(view.total);
  p->set_unit(view.unit);
  p->set_message(view.message);
  op.set_create_time_us(UnixMicros(view.create_time));
  op.set_start_time_us(UnixMicros(view.start_time));
  op.set_end_time_us(UnixMicros(view.end_time));
  if (!view.error.ok()) {
    op.mutable_error()->set_code(static_cast<int>(view.error.code()));
    // A failure about one of the daemon's options names its flag, as a
    // synchronous status does (ToGrpcStatus).
    op.mutable_error()->set_message(MessageWithFlag(view.error));
    op.mutable_error()->set_reason(view.reason);
  }
  if (const auto* r = std::get_if<TrainResult>(&view.result)) {
    *op.mutable_train() = ToProto(*r);
  } else if (const auto* m = std::get_if<ModelSummary>(&view.result)) {
    *op.mutable_model() = ToProto(*m, /*with_parameters=*/false);
  } else if (const auto* sr = std::get_if<SnapshotResult>(&view.result)) {
    *op.mutable_snapshot() = ToProto(sr->manifest, sr->mode);
  } else if (const auto* er = std::get_if<EvalResult>(&view.result)) {
    *op.mutable_evaluate() = ToProto(*er);
  } else if (const auto* pr = std::get_if<PlanResult>(&view.result)) {
    *op.mutable_plan() = ToProto(*pr);
  }
  return op;
}

DataSpec FromProto(const v1::DataSource& d) {
  DataSpec spec;
  switch (d.source_case()) {
    case v1::DataSource::SOURCE_NOT_SET:
    case v1::DataSource::kEmbeddedCorpus:
      spec.kind = DataSpec::Kind::kEmbeddedCorpus;
      break;
    case v1::DataSource::kTextFile:
      spec.kind = DataSpec::Kind::kTextFile;
      spec.path = d.text_file();
      break;
    case v1::DataSource::kTokenFile:
      spec.kind = DataSpec::Kind::kTokenFile;
      spec.path = d.token_file().path();
      if (d.token_file().has_bytes_per_token()) {
        spec.bytes_per_token = d.token_file().bytes_per_token();
      }
      break;
    case v1::DataSource::kInlineTokens:
      spec.kind = DataSpec::Kind::kInlineTokens;
      spec.tokens.assign(d.inline_tokens().ids().begin(), d.inline_tokens().ids().end());
      break;
    case v1::DataSource::kIndexedDataset:
      spec.kind = DataSpec::Kind::kIndexedDataset;
      spec.path = d.indexed_dataset().prefix();
      switch (d.indexed_dataset().windows()) {
        case v1::INDEXED_WINDOWS_UNSPECIFIED:
        case v1::INDEXED_WINDOWS_PACKED:
          spec.windows = DataSpec::Windows::kPacked;
          break;
        case v1::INDEXED_WINDOWS_WITHIN_DOCUMENTS:
          spec.windows = DataSpec::Windows::kWithinDocuments;
          break;
        default:  // an unknown value: ValidateDataSpec refuses it
          spec.windows = static_cast<DataSpec::Windows>(d.indexed_dataset().windows());
      }
      break;
  }
  return spec;
}

EvalSpec FromProto(const v1::EvaluateRequest& r) {
  EvalSpec t;
  t.data = FromProto(r.data());
  // request_fields.h's fields: the same name in the proto and in
  // EvalSpec.
  MEMPROFD_EVAL_VALUE_FIELDS(MEMPROFD_FIELD_FROM_PROTO)
  MEMPROFD_EVAL_CHOICE_FIELDS(MEMPROFD_FIELD_FROM_PROTO)
  return t;
}

v1::EvaluateResult ToProto(const EvalResult& r) {
  v1::EvaluateResult p;
  p.set_loss(r.loss);
  p.set_perplexity(r.perplexity);
  p.set_tokens(r.tokens);
  p.set_batches(r.batches);
  p.set_seconds(r.seconds);
  p.set_global_step(r.global_step);
  p.set_peak_gathered_parameter_bytes(r.peak_gathered_parameter_bytes);
  return p;
}

absl::StatusOr<TrainSpec> FromProto(const v1::TrainRequest& r) {
  // Only what the request sets; the session merges it over the defaults and
  // validates the result.
  TrainSpec spec;
  TrainOverrides& t = spec.train;
  // request_fields.h's fields: the same name in the proto and in TrainOverrides.
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_FIELD_FROM_PROTO)
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_FIELD_FROM_PROTO)
  if (r.data().source_case() != v1::DataSource::SOURCE_NOT_SET)
    t.data = FromProto(r.data());
  if (r.has_eval_data()) t.eval_data = FromProto(r.eval_data());
  spec.resume = r.resume();
  if (r.has_memory_budget_bytes()) spec.memory_budget_bytes = r.memory_budget_bytes();
  if (r.has_offload()) {
    const v1::OffloadOptions& o = r.offload();
    // offload_fields.h's fields: the same name in the proto and in
    // OffloadOverrides.
#define MEMPROFD_OFFLOAD_FROM_PROTO_(name, ...)                                    \
  if (o.has_##name()) {                                                            \
    if (absl::Status s =                                                           \
            OffloadFieldFromProto("offload." #name, o.name(), &spec.offload.name); \
        !s.ok()) {                                                                 \
      return s;                                                                    \
    }                                                                              \
  }
    MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_FROM_PROTO_)
#undef MEMPROFD_OFFLOAD_FROM_PROTO_
  }
  return spec;
}

absl::StatusOr<LoadModelSpec> FromProto(const v1::LoadModelRequest& r) {
  LoadModelSpec spec;
  spec.preset = r.preset();
  spec.hf_directory = r.hf_directory();
  spec.seed = r.seed();
  spec.resume = r.resume();
  spec.init_weights = r.init_weights();
  spec.lora_adapter = r.lora_adapter();
  if (!r.base_dtype().empty()) {
    absl::StatusOr<BaseDtype> dtype = ParseBaseDtype(r.base_dtype());
    if (!dtype.ok()) return dtype.status();
    spec.base_dtype = *dtype;
  }
  for (const auto& p : r.placement()) {
    if (absl::Status s =
            CheckEnum("placement.placement", p.placement(), v1::Placement_IsValid);
        !s.ok()) {
      return s;
    }
    Placement placement = Placement::kDevice;
    if (p.placement() == v1::PLACEMENT_CPU) placement = Placement::kCpu;
    if (p.placement() == v1::PLACEMENT_DISK) placement = Placement::kDisk;
    spec.placement.emplace_back(p.module(), placement);
  }
  return spec;
}

absl::StatusOr<SnapshotSpec> FromProto(const v1::SnapshotRequest& r) {
  SnapshotSpec spec;
  spec.name = r.name();
  for (const absl::Status& s : {CheckEnum("dtype", r.dtype(), v1::SnapshotDtype_IsValid),
                                CheckEnum("mode", r.mode(), v1::SnapshotMode_IsValid),
                                CheckEnum("kind", r.kind(), v1::SnapshotKind_IsValid)}) {
    if (!s.ok()) return s;
  }
  if (!r.max_shard_size().empty()) {
    absl::StatusOr<int64_t> size = snapshot::ParseShardSize(r.max_shard_size());
    if (!size.ok()) return size.status();
    spec.options.max_shard_size = *size;
  }
  switch (r.dtype()) {
    case v1::SNAPSHOT_DTYPE_BF16:
      spec.options.dtype = snapshot::SnapshotDtype::kBFloat16;
      break;
    case v1::SNAPSHOT_DTYPE_FP16:
      spec.options.dtype = snapshot::SnapshotDtype::kFloat16;
      break;
    case v1::SNAPSHOT_DTYPE_FP32:
      spec.options.dtype = snapshot::SnapshotDtype::kFloat32;
      break;
    default:
      spec.options.dtype = snapshot::SnapshotDtype::kKeep;
  }
  spec.mode = r.mode() == v1::SNAPSHOT_MODE_ASYNC ? SnapshotMode::kAsync
                                                  : SnapshotMode::kBlocking;
  // Unspecified: weights (SnapshotSpec says why).
  spec.options.kind = FromProto(r.kind());
  return spec;
}

v1::ModelInfo ToProto(const ModelSummary& m, bool with_parameters) {
  v1::ModelInfo info;
  info.set_source(m.source);
  v1::ModelConfig* c = info.mutable_config();
  c->set_architecture(m.config.architecture);
  c->set_vocab_size(m.config.vocab_size);
  c->set_hidden_size(m.config.hidden_size);
  c->set_intermediate_size(m.config.intermediate_size);
  c->set_num_hidden_layers(m.config.num_hidden_layers);
  c->set_num_attention_heads(m.config.num_attention_heads);
  c->set_num_key_value_heads(m.config.num_key_value_heads);
  c->set_max_position_embeddings(m.config.max_position_embeddings);
  c->set_rms_norm_eps(m.config.rms_norm_eps);
  c->set_rope_theta(m.config.rope_theta);
  c->set_tie_word_embeddings(m.config.tie_word_embeddings);
  c->set_torch_dtype(m.config.torch_dtype);
  c->set_model_type(m.config.model_type);
  c->set_head_dim(m.config.head_dim());
  v1::RopeParameters* rope = c->mutable_rope();
  const RopeScaling& r = m.config.rope_scaling;
  rope->set_rope_type(r.rope_type);
  rope->set_factor(r.factor);
  rope->set_original_max_position_embeddings(r.original_max_position_embeddings);
  rope->set_low_freq_factor(r.low_freq_factor);
  rope->set_high_freq_factor(r.high_freq_factor);
  c->set_qkv_bias(m.config.qkv_bias());
  c->set_o_proj_bias(m.config.o_bias());
  c->set_mlp_bias(m.config.mlp_bias);
  c->set_qk_norm(m.config.qk_norm());
  for (int64_t i = 0; i < m.config.num_hidden_layers; ++i) {
    if (m.config.LayerWindow(i) > 0) c->add_sliding_window_layers(i);
  }
  // The window only where a layer uses it (0 and no layers otherwise).
  if (c->sliding_window_layers_size() > 0) c->set_sliding_window(m.config.sliding_window);
  info.set_num_parameters(m.num_parameters);
  info.set_parameter_bytes(m.parameter_bytes);
  info.set_device(m.device);
  info.set_steps_trained(m.steps_trained);
  if (with_parameters) {
    for (const auto& p : m.parameters) {
      v1::ParameterInfo* pi = info.add_parameters();
      pi->set_name(p.name);
      for (int64_t d : p.shape) pi->add_shape(d);
      pi->set_dtype(p.dtype);
      pi->set_placement(p.placement == Placement::kDisk  ? v1::PLACEMENT_DISK
                        : p.placement == Placement::kCpu ? v1::PLACEMENT_CPU
                                                         : v1::PLACEMENT_DEVICE);
      pi->set_bytes(p.bytes);
      for (const std::string& t : p.tied) pi->add_tied(t);
    }
  }
  for (const std::string& note : m.load_notes) info.add_load_notes(note);
  return info;
}

const google::protobuf::FieldDescriptor* SkippedField(offload::SkipReason reason) {
  return v1::OffloadStats::descriptor()->FindFieldByName(
      absl::StrCat("skipped_", offload::SkipReasonName(reason)));
}

v1::OffloadStats ToProto(const offload::OffloadStats& s) {
  v1::OffloadStats o;
  o.set_tensors_seen(s.tensors_seen);
  o.set_tensors_offloaded(s.tensors_offloaded);
  // The skipped_<name> field of each reason in core's one table
  // (convert_test checks that every reason has its field).
  const google::protobuf::Reflection* reflection = o.GetReflection();
  for (const offload::SkipReason reason : offload::kSkipReasons) {
    reflection->SetInt64(&o, SkippedField(reason), s.skipped_of(reason));
  }
  o.set_dedup_hits(s.dedup_hits);
  o.set_dedup_bytes_saved(s.dedup_bytes_saved);
  o.set_bytes_out(s.bytes_out);
  o.set_bytes_in(s.bytes_in);
  o.set_bytes_prefetched(s.bytes_prefetched);
  o.set_reload_wait_seconds(static_cast<double>(s.reload_wait_ns) * 1e-9);
  o.set_trl_baseline_bytes_out(s.trl_baseline_bytes_out);
  o.set_effective_bytes(s.effective_bytes);
  o.set_ineffective_bytes(s.ineffective_bytes);
  o.set_peak_resident_saved_bytes(s.peak_resident_saved_bytes);
  return o;
}

v1::StepReport ToProto(const SessionStepReport& r) {
  v1::StepReport p;
  p.set_step(r.step.step);
  p.set_global_step(r.step.global_step);
  p.set_loss(r.step.loss);
  if (r.step.rank_loss) p.set_rank_loss(*r.step.rank_loss);
  p.set_tokens(r.step.tokens);
  p.set_tokens_per_second(r.step.tokens_per_second);
  p.set_step_seconds(r.step.step_seconds);
  p.mutable_phase_seconds()->set_forward(r.step.forward_seconds);
  p.mutable_phase_seconds()->set_backward(r.step.backward_seconds);
  p.mutable_phase_seconds()->set_optimizer(r.step.optimizer_seconds);
  p.set_grad_norm(r.step.grad_norm);
  *p.mutable_offload() = ToProto(r.offload);
  p.set_peak_allocated_bytes(r.peak_allocated_bytes);
  p.set_learning_rate(r.step.learning_rate);
  if (r.step.eval) *p.mutable_eval() = ToProto(*r.step.eval);
  p.set_planned_peak_bytes(r.planned_peak_bytes);
  p.set_budget_choice(r.budget_choice);
  return p;
}

v1::TrainResult ToProto(const TrainResult& r) {
  v1::TrainResult p;
  p.set_steps_completed(r.steps_completed);
  p.set_first_loss(r.first_loss);
  p.set_last_loss(r.last_loss);
  p.set_tokens(r.tokens);
  p.set_seconds(r.seconds);
  p.set_mean_tokens_per_second(r.mean_tokens_per_second);
  p.set_budget_choice(r.budget_choice);
  p.set_planned_peak_bytes(r.planned_peak_bytes);
  p.set_global_step(r.global_step);
  p.set_resume_checkpoint(r.resume_checkpoint);
  p.set_resume_global_step(r.resume_global_step);
  return p;
}

v1::SnapshotManifest ToProto(const snapshot::SnapshotManifest& m, SnapshotMode mode) {
  v1::SnapshotManifest p;
  p.set_name(m.name);
  p.set_directory(m.directory);
  for (const auto& f : m.files) {
    v1::SnapshotFile* pf = p.add_files();
    pf->set_name(f.name);
    pf->set_bytes(f.bytes);
  }
  p.set_total_size(m.total_size);
  p.set_bytes_written(m.bytes_written);
  p.set_num_tensors(m.num_tensors);
  p.set_dtype(m.dtype);
  p.set_duration_seconds(m.duration_seconds);
  p.set_throughput_bytes_per_second(m.throughput_bytes_per_second);
  p.set_peak_extra_host_bytes(m.peak_extra_host_bytes);
  p.set_peak_extra_device_bytes(m.peak_extra_device_bytes);
  p.set_peak_gathered_bytes(m.peak_gathered_bytes);
  p.set_global_step(m.global_step);
  p.set_create_time_us(UnixMicros(m.create_time));
  p.set_mode(mode == SnapshotMode::kAsync ? v1::SNAPSHOT_MODE_ASYNC
                                          : v1::SNAPSHOT_MODE_BLOCKING);
  absl::StatusOr<snapshot::SnapshotKind> kind = snapshot::ParseSnapshotKind(m.kind);
  p.set_kind(ToProto(kind.ok() ? *kind : snapshot::SnapshotKind::kWeights));
  p.set_optimizer_bytes(m.optimizer_bytes);
  return p;
}

v1::MemoryStats ToProto(const memory::MemoryStatsView& s,
                        const memory::CategoryBytes& categories) {
  v1::MemoryStats p;
  for (const auto& d : s.devices) {
    v1::DeviceMemory* pd = p.add_devices();
    pd->set_device(d.name);
    pd->set_current_bytes(d.current_bytes);
    pd->set_peak_bytes(d.peak_bytes);
    pd->set_allocations_total(d.alloc_count);
    pd->set_frees_total(d.free_count);
    pd->set_reserved_bytes(d.reserved_bytes);
    pd->set_alloc_retries_total(d.alloc_retries);
    pd->set_ooms_total(d.ooms);
  }
  for (const auto& [name, bytes] : categories.Named()) {
    v1::CategoryBytes* c = p.add_categories();
    c->set_category(name);
    c->set_bytes(bytes);
  }
  for (const auto& pp : s.last_step_phase_peaks) {
    v1::PhasePeak* pk = p.add_last_step_phase_peaks();
    pk->set_device(pp.device);
    pk->set_phase(std::string(PhaseName(pp.phase)));
    pk->set_peak_bytes(pp.peak_bytes);
  }
  p.set_current_phase(std::string(PhaseName(s.current_phase)));
  p.set_recording(s.recording);
  p.set_history_entries(s.history_entries);
  p.set_history_max_entries(s.history_max_entries);
  p.set_history_dropped(s.history_dropped);
  return p;
}

v1::OomReport ToProto(const OomReportRecord& record) {
  const memory::OomReport& r = record.report;
  v1::OomReport p;
  p.set_json(record.json);
  p.set_path(record.path);
  p.set_write_error(record.write_error);
  p.set_global_step(r.global_step);
  p.set_error(r.error);
  p.set_device(r.device);
  p.set_requested_bytes(r.requested_bytes);
  if (r.phase) p.set_phase(std::string(PhaseName(*r.phase)));
  p.set_module(r.module);
  p.set_op(r.op);
  p.set_captured(r.captured);
  p.set_failed_at_unix_ms(r.failed_at_unix_ms);
  p.set_written_at_unix_ms(record.written_at_unix_ms);
  p.set_allocated_bytes(r.allocated_bytes);
  if (r.reserved_bytes >= 0) p.set_reserved_bytes(r.reserved_bytes);
  if (r.free_bytes >= 0) p.set_free_bytes(r.free_bytes);
  if (r.total_bytes >= 0) p.set_total_bytes(r.total_bytes);
  p.set_live_allocations(r.live_allocations);
  p.set_live_bytes(r.live_bytes);
  for (const memory::LiveAllocation& a : r.largest) {
    v1::OomAllocation* pa = p.add_largest_allocations();
    pa->set_address(a.addr);
    pa->set_bytes(a.bytes);
    pa->set_category(a.category);
    if (a.phase) pa->set_phase(std::string(PhaseName(*a.phase)));
    if (a.step) pa->set_step(*a.step);
    pa->set_module(a.module);
    pa->set_op(a.op);
  }
  for (const auto& [name, bytes] : r.categories.Named()) {
    v1::CategoryBytes* c = p.add_categories();
    c->set_category(name);
    c->set_bytes(bytes);
  }
  for (const memory::StepPeaks& s : r.recent_steps) {
    v1::OomStepPeaks* ps = p.add_recent_steps();
    ps->set_step(s.step);
    for (const auto& pp : s.phase_peaks) {
      v1::PhasePeak* pk = ps->add_phase_peaks();
      pk->set_device(pp.device);
      pk->set_phase(std::string(PhaseName(pp.phase)));
      pk->set_peak_bytes(pp.peak_bytes);
    }
  }
  return p;
}

v1::DataParallelStatus ToProto(const WorldSpec& world,
                               const DataParallelCounters& counters) {
  v1::DataParallelStatus p;
  p.set_rank(world.rank);
  p.set_world_size(world.world_size);
  p.set_local_rank(world.local_rank);
  p.set_node_rank(world.node_rank);
  p.set_role(!world.distributed() ? "single" : world.rank == 0 ? "leader" : "follower");
  p.set_launcher(LauncherName(world.launcher));
  if (world.distributed()) {
    p.set_store(absl::StrCat(world.master_addr, ":", world.master_port));
  }
  p.set_has_parameter_drift(counters.parameter_drift.has_value());
  p.set_parameter_drift(counters.parameter_drift.value_or(0));
  p.set_allreduce_bytes(counters.allreduce_bytes);
  p.set_allreduce_exposed_seconds(counters.allreduce_exposed_seconds);
  p.set_sharding(std::string(ShardingName(counters.sharding)));
  p.set_owned_parameter_bytes(counters.owned_parameter_bytes);
  p.set_peak_gathered_parameter_bytes(counters.peak_gathered_parameter_bytes);
  p.set_parameter_gathers(counters.parameter_gathers);
  p.set_gather_exposed_seconds(counters.gather_exposed_seconds);
  p.set_model_sharded(counters.model_sharded);
  p.set_whole_model_gathers(counters.whole_model_gathers_total);
  return p;
}

void AddRanks(const MemoryAcrossRanks& ranks, v1::MemoryStats* stats) {
  for (const RankMemory& m : ranks.ranks) {
    v1::RankMemory* p = stats->add_ranks();
    p->set_rank(m.rank);
    p->set_node_rank(m.node_rank);
    p->set_ok(m.ok);
    p->set_error(m.error);
    p->set_device(m.device);
    p->set_current_bytes(m.current_bytes);
    p->set_peak_bytes(m.peak_bytes);
    p->set_last_step_peak_bytes(m.last_step_peak_bytes);
    p->set_steps_total(m.steps_total);
    p->set_age_seconds(m.age_seconds);
  }
  stats->set_step_peak_imbalance_bytes(ranks.step_peak_imbalance_bytes);
  stats->set_current_imbalance_bytes(ranks.current_imbalance_bytes);
}

}  // namespace memprofd
