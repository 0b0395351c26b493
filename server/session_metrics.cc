#include "server/session_metrics.h"

#include <prometheus/metric_family.h>

#include <deque>
#include <string>
#include <utility>

#include "core/common/phase.h"
#include "core/dist/sharding.h"

namespace memprofd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<std::pair<std::string, std::string>>;

class Families {
 public:
  MetricFamily& Add(const std::string& name, const std::string& help, MetricType type) {
    MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    families_.push_back(std::move(f));
    return families_.back();
  }
  static void Sample(MetricFamily& f, double value, const Labels& labels = {}) {
    ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (f.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return {families_.begin(), families_.end()}; }

 private:
  std::deque<MetricFamily> families_;  // stable references for Add()
};

}  // namespace

SessionMetrics::SessionMetrics(Session* session)
    : session_(session),
      histograms_(std::make_shared<prometheus::Registry>()),
      step_seconds_(
          prometheus::BuildHistogram()
              .Name("memprofd_train_step_seconds")
              .Help("Wall time of training steps.")
              .Register(*histograms_)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25,
                                                           0.5, 1, 2.5, 5, 10, 30, 60})),
      snapshot_seconds_(
          prometheus::BuildHistogram()
              .Name("memprofd_snapshot_duration_seconds")
              .Help("Wall time of published snapshots.")
              .Register(*histograms_)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.5, 1, 5,
                                                               10, 30, 60, 300, 1800})) {}

std::shared_ptr<SessionMetrics> SessionMetrics::Attach(Session* session) {
  auto metrics = std::make_shared<SessionMetrics>(session);
  session->AddObserver(metrics);
  return metrics;
}

void SessionMetrics::OnStep(const SessionStepReport& report) {
  step_seconds_.Observe(report.step.step_seconds);
}

void SessionMetrics::OnSnapshotPublished(const snapshot::SnapshotManifest& manifest) {
  snapshot_seconds_.Observe(manifest.duration_seconds);
}

std::vector<MetricFamily> SessionMetrics::Collect() const {
  Families out;
  const SessionCounters c = session_->Counters();
  const memory::MemoryStatsView mem = session_->MemoryStats();

  // Training.
  Families::Sample(out.Add("memprofd_train_steps_total", "Optimizer steps completed.",
                           MetricType::Counter),
                   static_cast<double>(c.steps_total));
  Families::Sample(
      out.Add("memprofd_train_tokens_total", "Tokens trained on.", MetricType::Counter),
      static_cast<double>(c.tokens_total));
  if (c.has_loss) {
    Families::Sample(
        out.Add("memprofd_train_last_loss", "Loss of the last step.", MetricType::Gauge),
        c.last_loss);
  }
  if (c.plan_error_ratio) {
    Families::Sample(out.Add("memprofd_plan_error_ratio",
                             "The memory planner's error on the last step with a plan: "
                             "(measured peak - planned peak) / planned peak.",
                             MetricType::Gauge),
                     *c.plan_error_ratio);
  }
  if (c.last_step) {
    Families::Sample(
        out.Add("memprofd_train_tokens_per_second",
                "Throughput of the last step, in tokens per second.", MetricType::Gauge),
        c.last_step->step.tokens_per_second);
  }
  if (c.last_step) {
    Families::Sample(
        out.Add("memprofd_train_learning_rate",
                "Learning rate of the last step (the schedule's).", MetricType::Gauge),
        c.last_step->step.learning_rate);
  }
  Families::Sample(
      out.Add(
          "memprofd_train_nonfinite_steps_total",
          "Training steps whose loss or gradient norm was not finite, or whose update "
          "would have made a parameter not finite or larger than 1e6: their update "
          "was skipped and the training failed (FAILED_PRECONDITION).",
          MetricType::Counter),
      static_cast<double>(c.nonfinite_steps_total));
  Families::Sample(
      out.Add("memprofd_eval_evaluations_total",
              "Evaluations finished (Evaluate calls and training's periodic ones).",
              MetricType::Counter),
      static_cast<double>(c.evaluations_total));
  if (c.last_eval) {
    Families::Sample(
        out.Add("memprofd_eval_last_loss", "Mean cross-entropy of the last evaluation.",
                MetricType::Gauge),
        c.last_eval->loss);
    Families::Sample(out.Add("memprofd_eval_last_perplexity",
                             "Perplexity (exp of the loss) of the last evaluation.",
                             MetricType::Gauge),
                     c.last_eval->perplexity);
  }
  Families::Sample(out.Add("memprofd_operations_active", "Operations queued or running.",
                           MetricType::Gauge),
                   static_cast<double>(session_->ActiveOperationCount()));

  // Memory per device.
  MetricFamily& current = out.Add("memprofd_memory_allocated_bytes",
                                  "Bytes allocated now, per device.", MetricType::Gauge);
  MetricFamily& peak = out.Add("memprofd_memory_peak_allocated_bytes",
                               "Peak bytes allocated since start or the last reset-peak.",
                               MetricType::Gauge);
  MetricFamily& allocs = out.Add("memprofd_memory_allocations_total",
                                 "Allocation events, per device.", MetricType::Counter);
  MetricFamily& frees = out.Add("memprofd_memory_frees_total", "Free events, per device.",
                                MetricType::Counter);
  for (const auto& d : mem.devices) {
    const Labels l = {{"device", d.name}};
    Families::Sample(current, static_cast<double>(d.current_bytes), l);
    Families::Sample(peak, static_cast<double>(d.peak_bytes), l);
    Families::Sample(allocs, static_cast<double>(d.alloc_count), l);
    Families::Sample(frees, static_cast<double>(d.free_count), l);
  }
  bool any_cuda = false;
  for (const auto& d : mem.devices) any_cuda |= d.has_cuda_stats;
  if (any_cuda) {
    MetricFamily& reserved =
        out.Add("memprofd_cuda_reserved_bytes",
                "Bytes reserved by the CUDA caching allocator.", MetricType::Gauge);
    MetricFamily& retries = out.Add(
        "memprofd_cuda_alloc_retries_total",
        "CUDA allocations retried after freeing cached blocks.", MetricType::Counter);
    MetricFamily& ooms = out.Add("memprofd_cuda_ooms_total", "CUDA out-of-memory errors.",
                                 MetricType::Counter);
    for (const auto& d : mem.devices) {
      if (!d.has_cuda_stats) continue;
      const Labels l = {{"device", d.name}};
      Families::Sample(reserved, static_cast<double>(d.reserved_bytes), l);
      Families::Sample(retries, static_cast<double>(d.alloc_retries), l);
      Families::Sample(ooms, static_cast<double>(d.ooms), l);
    }
  }
  MetricFamily& phase_peak =
      out.Add("memprofd_memory_step_peak_bytes",
              "Peak bytes allocated during the last finished step, per device and phase.",
              MetricType::Gauge);
  for (const auto& p : mem.last_step_phase_peaks) {
    Families::Sample(phase_peak, static_cast<double>(p.peak_bytes),
                     {{"device", p.device}, {"phase", std::string(PhaseName(p.phase))}});
  }
  MetricFamily& category =
      out.Add("memprofd_memory_category_bytes",
              "Bytes by what they hold (compute device).", MetricType::Gauge);
  for (const auto& [name, bytes] : c.categories.Named()) {
    Families::Sample(category, static_cast<double>(bytes), {{"category", name}});
  }
  MetricFamily& by_kind = out.Add(
      "memprofd_memory_module_kind_bytes",
      "Live bytes of the compute device by module kind and category (attribution).",
      MetricType::Gauge);
  const memory::ModuleKindBytes kinds = session_->MemoryByModuleKind();
  for (int k = 0; k < kNumModuleKinds; ++k) {
    for (int cat = 0; cat < kNumCategories; ++cat) {
      const int64_t bytes = kinds[static_cast<size_t>(k)][static_cast<size_t>(cat)];
      if (bytes == 0) continue;
      Families::Sample(
          by_kind, static_cast<double>(bytes),
          {{"module_kind", std::string(ModuleKindName(static_cast<ModuleKind>(k)))},
           {"category", std::string(CategoryName(static_cast<Category>(cat)))}});
    }
  }
  Families::Sample(out.Add("memprofd_memory_history_entries",
                           "Entries in the memory history ring.", MetricType::Gauge),
                   static_cast<double>(mem.history_entries));

  // Activation offloader.
  const offload::OffloadStats& o = c.offload_totals;
  MetricFamily& saved = out.Add("memprofd_offload_saved_tensors_total",
                                "Saved tensors seen by the offloader, by what it did.",
                                MetricType::Counter);
  Families::Sample(saved, static_cast<double>(o.tensors_offloaded),
                   {{"outcome", "offloaded"}});
  for (const offload::SkipReason reason : offload::kSkipReasons) {
    Families::Sample(saved, static_cast<double>(o.skipped_of(reason)),
                     {{"outcome", std::string(offload::SkipReasonName(reason))}});
  }
  Families::Sample(out.Add("memprofd_offload_dedup_hits_total",
                           "Saved tensors whose storage was already offloaded that step.",
                           MetricType::Counter),
                   static_cast<double>(o.dedup_hits));
  Families::Sample(out.Add("memprofd_offload_dedup_saved_bytes_total",
                           "Bytes dedup kept from moving again.", MetricType::Counter),
                   static_cast<double>(o.dedup_bytes_saved));
  MetricFamily& moved =
      out.Add("memprofd_offload_moved_bytes_total",
              "Bytes moved off the compute device and back.", MetricType::Counter);
  Families::Sample(moved, static_cast<double>(o.bytes_out), {{"direction", "out"}});
  Families::Sample(moved, static_cast<double>(o.bytes_in), {{"direction", "in"}});
  Families::Sample(out.Add("memprofd_offload_prefetched_bytes_total",
                           "Bytes of the moved-in ones that the backward read-ahead "
                           "brought back before they were asked for.",
                           MetricType::Counter),
                   static_cast<double>(o.bytes_prefetched));
  Families::Sample(out.Add("memprofd_offload_reload_wait_seconds_total",
                           "Host time backward waited for offloaded bytes to come back.",
                           MetricType::Counter),
                   static_cast<double>(o.reload_wait_ns) * 1e-9);
  Families::Sample(
      out.Add("memprofd_offload_trl_baseline_bytes_total",
              "Bytes the TRL baseline (TRL's offloader) would have moved out.",
              MetricType::Counter),
      static_cast<double>(o.trl_baseline_bytes_out));
  MetricFamily& effectiveness =
      out.Add("memprofd_offload_effectiveness_bytes_total",
              "Bytes moved out, by whether their compute-device storage went free "
              "(effective) or something else kept it alive (ineffective).",
              MetricType::Counter);
  Families::Sample(effectiveness, static_cast<double>(o.effective_bytes),
                   {{"outcome", "effective"}});
  Families::Sample(effectiveness, static_cast<double>(o.ineffective_bytes),
                   {{"outcome", "ineffective"}});
  if (c.last_step) {
    Families::Sample(
        out.Add("memprofd_offload_peak_resident_saved_bytes",
                "Peak bytes of saved activations on the compute device, last step.",
                MetricType::Gauge),
        static_cast<double>(c.last_step->offload.peak_resident_saved_bytes));
  }

  Families::Sample(out.Add("memprofd_oom_reports_total",
                           "Training steps that ran out of memory (each wrote an OOM "
                           "report; GetLastOomReport serves the newest).",
                           MetricType::Counter),
                   static_cast<double>(c.oom_reports_total));

  // Snapshots.
  MetricFamily& snaps =
      out.Add("memprofd_snapshots_total", "Snapshots, by result.", MetricType::Counter);
  Families::Sample(snaps, static_cast<double>(c.snapshots_succeeded),
                   {{"result", "succeeded"}});
  Families::Sample(snaps, static_cast<double>(c.snapshots_failed),
                   {{"result", "failed"}});
  Families::Sample(out.Add("memprofd_snapshot_written_bytes_total",
                           "Bytes written by published snapshots.", MetricType::Counter),
                   static_cast<double>(c.snapshot_bytes_total));
  const DataParallelCounters& dp = c.data_parallel;
  // The run's sharding level, from start, in a data-parallel run.
  if (session_->world().distributed()) {
    Families::Sample(out.Add("memprofd_dp_sharding_info",
                             "Always 1; level says how much of the training state each "
                             "rank keeps (--sharding, the same on every rank).",
                             MetricType::Gauge),
                     1, {{"level", std::string(ShardingName(dp.sharding))}});
  }
  // Data parallel: only once a data-parallel run trained here.
  if (dp.active) {
    if (dp.parameter_drift) {
      Families::Sample(
          out.Add("memprofd_dp_parameter_drift",
                  "Spread across ranks of a float64 checksum of the parameters at the "
                  "last check (every 10 steps and a run's last step); 0 while the "
                  "replicas are bit-identical.",
                  MetricType::Gauge),
          *dp.parameter_drift);
    }
    Families::Sample(
        out.Add("memprofd_dp_drift_checks_total",
                "Parameter drift checks made across ranks.", MetricType::Counter),
        static_cast<double>(dp.drift_checks_total));
    Families::Sample(
        out.Add("memprofd_dp_allreduce_bytes",
                "Gradient bytes all-reduced in the last step.", MetricType::Gauge),
        static_cast<double>(dp.allreduce_bytes));
    MetricFamily& buckets = out.Add(
        "memprofd_dp_buckets",
        "Gradient buckets of the last step, by whether their all-reduce started inside "
        "backward (overlapped with it) or after it.",
        MetricType::Gauge);
    Families::Sample(buckets, static_cast<double>(dp.buckets_overlapped),
                     {{"started", "in_backward"}});
    Families::Sample(buckets, static_cast<double>(dp.buckets - dp.buckets_overlapped),
                     {{"started", "after_backward"}});
    Families::Sample(out.Add("memprofd_dp_allreduce_exposed_seconds",
                             "Time the last step's gradient all-reduce added after "
                             "backward (the part not overlapped with it).",
                             MetricType::Gauge),
                     dp.allreduce_exposed_seconds);
    Families::Sample(out.Add("memprofd_dp_allreduce_exposed_seconds_total",
                             "Gradient all-reduce time not overlapped with backward, "
                             "over all steps.",
                             MetricType::Counter),
                     dp.allreduce_exposed_seconds_total);
    if (dp.sharding == Sharding::kFull) {
      Families::Sample(out.Add("memprofd_dp_owned_parameter_bytes",
                               "Bytes of this rank's parameter shards, kept between uses "
                               "(full sharding).",
                               MetricType::Gauge),
                       static_cast<double>(dp.owned_parameter_bytes));
      Families::Sample(
          out.Add("memprofd_dp_gathered_parameter_bytes_peak",
                  "The most bytes of whole parameters held at once in the last "
                  "step (full sharding's gathered working set).",
                  MetricType::Gauge),
          static_cast<double>(dp.peak_gathered_parameter_bytes));
      Families::Sample(out.Add("memprofd_dp_parameter_gathers",
                               "Parameter all-gathers from the ranks' shards in the last "
                               "step (full sharding).",
                               MetricType::Gauge),
                       static_cast<double>(dp.parameter_gathers));
      Families::Sample(out.Add("memprofd_dp_gather_exposed_seconds_total",
                               "Time spent waiting for parameter gathers, not hidden by "
                               "compute, over all steps (full sharding).",
                               MetricType::Counter),
                       dp.gather_exposed_seconds_total);
      Families::Sample(out.Add("memprofd_dp_model_sharded",
                               "1 while the model is kept sharded between runs (full "
                               "sharding), else 0.",
                               MetricType::Gauge),
                       dp.model_sharded ? 1.0 : 0.0);
      Families::Sample(
          out.Add("memprofd_dp_whole_model_gathers_total",
                  "Times the sharded model was gathered whole again on every "
                  "rank (before a LoadModel).",
                  MetricType::Counter),
          static_cast<double>(dp.whole_model_gathers_total));
    }
  }
  std::vector<MetricFamily> families = out.Take();
  for (MetricFamily& f : histograms_->Collect()) families.push_back(std::move(f));
  return families;
}

}  // namespace memprofd
