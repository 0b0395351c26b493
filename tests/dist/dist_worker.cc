// One rank of a data-parallel test run, started by dist_test as a process per
// rank with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
//   --scenario=collectives  all-reduce, reduce, broadcast, all-gather (into a
//                           tensor too), reduce-scatter, barrier;
//                           checks the values and prints "collectives ok".
//   --scenario=train        trains the small test Llama for --steps steps with
//                           GradientSync (when WORLD_SIZE > 1), prints
//                           "step N loss L" per step, the sync's figures and
//                           the bytes of AdamW moments this rank holds
//                           ("optimizer_state_bytes B largest_parameter_numel
//                           N parameters P"), and writes the final
//                           parameters, float32 in state-dict order, to
//                           --out. --sharding=optimizer shards AdamW's state,
//                           --sharding=gradients the gradients too, and the
//                           rank prints its gradient bytes ("gradient_bytes
//                           peak P at_update U largest_bucket B": the last
//                           step's peak as GradientSync sampled it, the most
//                           .grad bytes held at an update, the largest
//                           bucket); --continue_steps=N then trains N more
//                           steps with a new DataParallel, as the daemon's
//                           next Train. --sharding=full also shards the
//                           parameters; the rank prints "parameter_bytes
//                           owned O peak_gathered G gathers A prefetched
//                           P" (its shards' bytes, the last step's gathered
//                           working set, its all-gathers and those started
//                           ahead of their unit) and makes the model
//                           whole again before writing --out.
//                           --eval_every_steps=N evaluates on the training
//                           data every N steps (2 batches) and prints "eval
//                           step S loss L peak_gathered G" (G: the
//                           evaluation's gathered parameters at most).
//                           --offload=disk offloads saved activations to a
//                           spill file in --spill_dir and prints "offload
//                           bytes_out B parameter_skips S" over the run.
// Exit status: 0 done; 2 a step or collective failed (its status printed);
// 3 the rank killed itself on purpose (--die_at_step).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/dist/data_parallel.h"
#include "core/dist/process_group.h"
#include "core/dist/world.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/offload/step_listener.h"
#include "core/train/adamw.h"
#include "core/train/data.h"
#include "core/train/step_listener.h"
#include "core/train/trainer.h"
#include "tests/testing/llama.h"
#include "tests/testing/train.h"

ABSL_FLAG(std::string, scenario, "train", "collectives or train");
ABSL_FLAG(int64_t, steps, 3, "optimizer steps");
ABSL_FLAG(int64_t, batch_size, 2, "windows per rank per micro-batch");
ABSL_FLAG(int64_t, grad_accumulation_steps, 1, "micro-batches per step");
ABSL_FLAG(bool, gradient_checkpointing, false, "recompute layers in backward");
ABSL_FLAG(int64_t, bucket_bytes, memprofd::GradientSync::kDefaultBucketBytes,
          "gradient bucket cap");
ABSL_FLAG(std::string, sharding, "none", "none, optimizer, gradients or full");
ABSL_FLAG(int64_t, eval_every_steps, 0, "evaluate every this many steps (0: never)");
ABSL_FLAG(std::string, offload, "none", "none or disk: offload saved activations");
ABSL_FLAG(std::string, spill_dir, "/tmp", "--offload=disk's spill directory");
ABSL_FLAG(int64_t, continue_steps, 0,
          "then this many more steps in a second run with a new DataParallel");
ABSL_FLAG(std::string, continue_sharding, "",
          "the second run's sharding (empty: --sharding's)");
ABSL_FLAG(double, max_grad_norm, 0, "gradient clipping (0: none)");
ABSL_FLAG(double, weight_decay, 0, "AdamW's weight decay");
ABSL_FLAG(int64_t, hidden_size, 0, "override the model's hidden size (a mismatch test)");
ABSL_FLAG(int64_t, num_layers, 0, "override the model's number of layers (0: keep)");
ABSL_FLAG(int64_t, die_at_step, 0, "this rank exits at the start of step N (0: never)");
ABSL_FLAG(int, die_rank, -1, "the rank --die_at_step applies to");
ABSL_FLAG(double, timeout_seconds, 60, "collective timeout");
ABSL_FLAG(std::string, out, "", "where to write the final parameters");
ABSL_FLAG(std::string, grads_out, "",
          "where to write the first step's (averaged) gradients, as --out");

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

int Fail(const absl::Status& status) {
  std::cout << "FAILED " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << std::endl;
  return 2;
}

int Collectives(ProcessGroup& group) {
  const int rank = group.rank(), world = group.world_size();
  at::Tensor sum = at::full({3}, static_cast<float>(rank + 1));
  if (absl::Status s = group.AllReduceSum(sum); !s.ok()) return Fail(s);
  const float want = world * (world + 1) / 2.0f;
  if (!at::equal(sum, at::full({3}, want))) {
    std::cout << "all-reduce gave " << sum << ", want " << want << std::endl;
    return 1;
  }
  // A reduce to the last rank: only it holds the sum; Done once waited.
  at::Tensor reduced = at::full({3}, static_cast<float>(rank + 1));
  absl::StatusOr<PendingCollective> reduce = group.StartReduceSum(reduced, world - 1);
  if (!reduce.ok()) return Fail(reduce.status());
  if (absl::Status s = reduce->Wait(); !s.ok()) return Fail(s);
  if (!reduce->Done() ||
      (rank == world - 1 && !at::equal(reduced, at::full({3}, want)))) {
    std::cout << "reduce gave " << reduced << ", want " << want << " on the root"
              << std::endl;
    return 1;
  }
  if (group.StartReduceSum(reduced, world).status().code() !=
      absl::StatusCode::kInvalidArgument) {
    std::cout << "a reduce to a rank outside the world was not refused" << std::endl;
    return 1;
  }
  at::Tensor value = at::full({2}, static_cast<float>(10 * rank));
  if (absl::Status s = group.Broadcast(value, world - 1); !s.ok()) return Fail(s);
  if (!at::equal(value, at::full({2}, 10.0f * (world - 1)))) {
    std::cout << "broadcast gave " << value << std::endl;
    return 1;
  }
  absl::StatusOr<std::vector<at::Tensor>> all =
      group.AllGather(at::full({1}, rank * 1.5));
  if (!all.ok()) return Fail(all.status());
  for (int r = 0; r < world; ++r) {
    if ((*all)[r].item<double>() != r * 1.5) {
      std::cout << "all-gather slot " << r << " holds " << (*all)[r] << std::endl;
      return 1;
    }
  }
  // All-gather into one tensor: rank r's chunk is {r, r + 0.5}; rank r's
  // input may be its own chunk of the output.
  at::Tensor gathered = at::full({2 * world}, -1.0f);
  at::Tensor mine = at::tensor({rank * 1.0f, rank + 0.5f});
  for (at::Tensor input : {mine, gathered.narrow(0, 2 * rank, 2)}) {
    if (!input.is_same(mine)) input.copy_(mine);
    absl::StatusOr<PendingCollective> all_into =
        group.StartAllGatherInto(gathered, input);
    if (!all_into.ok()) return Fail(all_into.status());
    if (absl::Status s = all_into->Wait(); !s.ok()) return Fail(s);
    for (int r = 0; r < world; ++r) {
      if (gathered[2 * r].item<float>() != r ||
          gathered[2 * r + 1].item<float>() != r + 0.5f) {
        std::cout << "all-gather into a tensor gave " << gathered << std::endl;
        return 1;
      }
    }
    gathered.fill_(-1);
  }
  // Reduce-scatter: rank q sends j + q at element j; rank r gets chunk r of
  // the sum, element k of it at j = 3r + k: world * j + world(world-1)/2.
  at::Tensor scattered = at::empty({3});
  at::Tensor input = at::arange(3 * world, at::kFloat) + rank;
  absl::StatusOr<PendingCollective> scatter =
      group.StartReduceScatterSum(scattered, input);
  if (!scatter.ok()) return Fail(scatter.status());
  if (absl::Status s = scatter->Wait(); !s.ok()) return Fail(s);
  for (int k = 0; k < 3; ++k) {
    const float want = world * (3.0f * rank + k) + world * (world - 1) / 2.0f;
    if (scattered[k].item<float>() != want) {
      std::cout << "reduce-scatter gave " << scattered << " on rank " << rank
                << std::endl;
      return 1;
    }
  }
  // Sizes that do not fit are refused before anything is sent.
  if (group.StartAllGatherInto(at::empty({2 * world + 1}), mine).status().code() !=
          absl::StatusCode::kInvalidArgument ||
      group.StartReduceScatterSum(at::empty({3}), at::empty({3 * world}, at::kDouble))
              .status()
              .code() != absl::StatusCode::kInvalidArgument) {
    std::cout << "a chunked collective of mismatched sizes or dtypes was not refused"
              << std::endl;
    return 1;
  }
  if (absl::Status s = group.Barrier(); !s.ok()) return Fail(s);
  // The store: rank 0 publishes, the others pick it up; a missing key times
  // out as DEADLINE_EXCEEDED.
  const std::string greeting_value("from rank 0\0!", 13);
  if (rank == 0) {
    if (absl::Status s = group.SetKey("greeting", greeting_value); !s.ok())
      return Fail(s);
  }
  absl::StatusOr<std::string> greeting = group.WaitKey("greeting", absl::Seconds(20));
  if (!greeting.ok()) return Fail(greeting.status());
  if (*greeting != greeting_value) {
    std::cout << "store key holds '" << *greeting << "'" << std::endl;
    return 1;
  }
  absl::StatusOr<std::string> missing =
      group.WaitKey("nobody-sets-this", absl::Milliseconds(300));
  if (missing.status().code() != absl::StatusCode::kDeadlineExceeded) {
    std::cout << "waiting for a missing key gave " << missing.status() << std::endl;
    return 1;
  }
  if (absl::Status s = group.Barrier(); !s.ok()) return Fail(s);
  std::cout << "collectives ok on " << group.backend_name() << std::endl;
  return 0;
}

// `tensors` as float32, one after the other, to `path`.
bool WriteFloats(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary);
  for (const at::Tensor& t : tensors) {
    at::Tensor values = t.detach().to(at::kFloat).contiguous();
    out.write(static_cast<const char*>(values.data_ptr()),
              static_cast<std::streamsize>(values.numel() * sizeof(float)));
  }
  return static_cast<bool>(out);
}

int Train(ProcessGroup* group, const WorldSpec& world) {
  LlamaConfig config = testing::SmallLlamaConfig();
  if (absl::GetFlag(FLAGS_hidden_size) > 0)
    config.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  if (absl::GetFlag(FLAGS_num_layers) > 0)
    config.num_hidden_layers = absl::GetFlag(FLAGS_num_layers);
  // Different seeds per rank on purpose: TakeRankZeroParameters must make
  // the replicas equal.
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Create(config, 7 + world.rank);
  if (!model.ok()) return Fail(model.status());
  Trainer trainer(model->get());
  // The worker's own part in each step: dying on cue, and writing the first
  // step's gradients. Listed after DataParallel, so the gradients
  // --grads_out writes are the averaged ones.
  class WorkerListener : public StepListener {
   public:
    WorkerListener(int rank, Trainer* trainer)
        : rank_(rank), trainer_(trainer), model_(trainer->model()) {}
    void OnStepBegin(int64_t step) override {
      if (step == absl::GetFlag(FLAGS_die_at_step) &&
          rank_ == absl::GetFlag(FLAGS_die_rank)) {
        std::cout << "rank " << rank_ << " dies at step " << step << std::endl;
        std::_Exit(3);
      }
    }
    absl::Status AfterBackward() override {
      if (first_step_ && !absl::GetFlag(FLAGS_grads_out).empty()) {
        std::vector<at::Tensor> grads;
        // Sharded, a gradient another rank owns is none here: zeros.
        for (const at::Tensor& p : model_->Parameters()) {
          grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
        }
        if (!WriteFloats(absl::GetFlag(FLAGS_grads_out), grads)) {
          return absl::InternalError("cannot write --grads_out");
        }
      }
      first_step_ = false;
      return absl::OkStatus();
    }
    // After DataParallel's: the gradients the update reads, the parameters'
    // or, sharded, their pieces'.
    void BeforeUpdate() override {
      int64_t bytes = 0;
      for (const at::Tensor& p : model_->Parameters()) {
        if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
        const at::Tensor target = trainer_->optimizer()->TargetOf(p);
        if (target.defined() && !target.is_same(p) && target.grad().defined()) {
          bytes += static_cast<int64_t>(target.grad().nbytes());
        }
      }
      grad_bytes_at_update = std::max(grad_bytes_at_update, bytes);
    }
    int64_t grad_bytes_at_update = 0;

   private:
    const int rank_;
    Trainer* const trainer_;
    LlamaModel* const model_;
    bool first_step_ = true;
  } worker(world.rank, &trainer);
  // Saved activations through the offloader (its listener first, as in the
  // daemon), accounting only unless --offload=disk.
  offload::OffloadOptions offload_options;
  offload_options.enabled = absl::GetFlag(FLAGS_offload) == "disk";
  offload_options.target = offload::Target::kDisk;
  offload_options.spill_dir = absl::GetFlag(FLAGS_spill_dir);
  absl::StatusOr<std::unique_ptr<offload::Offloader>> offloader =
      offload::Offloader::Create(offload_options, (*model)->device());
  if (!offloader.ok()) return Fail(offloader.status());
  offload::OffloadStepListener offload_listener(offloader->get(), model->get());
  // One DataParallel per run, as the daemon makes one per Train, made whole
  // (full sharding) at the run's end as the daemon does.
  std::unique_ptr<DataParallel> data_parallel;
  StepListeners listeners;
  auto join_run = [&](const std::string& sharding) -> absl::Status {
    if (data_parallel != nullptr) {
      if (absl::Status s = data_parallel->Finish(); !s.ok()) return s;
    }
    data_parallel.reset();
    listeners.clear();
    listeners.push_back(&offload_listener);
    DataParallelOptions dp_options;
    dp_options.bucket_bytes = absl::GetFlag(FLAGS_bucket_bytes);
    absl::StatusOr<Sharding> level = ParseSharding(sharding);
    if (!level.ok()) return level.status();
    dp_options.sharding = *level;
    if (group != nullptr) {
      absl::StatusOr<std::unique_ptr<DataParallel>> created =
          DataParallel::Create(group, &trainer, dp_options);
      if (!created.ok()) return created.status();
      data_parallel = std::move(*created);
      listeners.push_back(data_parallel.get());
    }
    listeners.push_back(&worker);
    return absl::OkStatus();
  };
  if (absl::Status s = join_run(absl::GetFlag(FLAGS_sharding)); !s.ok()) return Fail(s);

  TrainOptions options;
  options.steps = absl::GetFlag(FLAGS_steps);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.seq_len = 32;
  options.learning_rate = 1e-2;
  options.seed = 11;
  options.grad_accumulation_steps = absl::GetFlag(FLAGS_grad_accumulation_steps);
  options.gradient_checkpointing = absl::GetFlag(FLAGS_gradient_checkpointing);
  options.max_grad_norm = absl::GetFlag(FLAGS_max_grad_norm);
  options.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  options.eval_every_steps = absl::GetFlag(FLAGS_eval_every_steps);
  if (options.eval_every_steps > 0) {
    options.eval_data = options.data;
    options.eval_max_batches = 2;
  }
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(options.data, config.vocab_size);
  if (!data.ok()) return Fail(data.status());
  const TokenDataset* eval_data = options.eval_every_steps > 0 ? data->get() : nullptr;
  auto print_step = [](const StepReport& report) {
    std::cout << absl::StrFormat("step %d loss %.17g", report.global_step, report.loss);
    if (report.rank_loss) {
      std::cout << absl::StrFormat(" rank_loss %.17g", *report.rank_loss);
    }
    std::cout << std::endl;
    if (report.eval) {
      std::cout << absl::StrFormat("eval step %d loss %.17g peak_gathered %d",
                                   report.global_step, report.eval->loss,
                                   report.eval->peak_gathered_parameter_bytes)
                << std::endl;
    }
  };
  if (options.steps > 0) {
    absl::StatusOr<TrainResult> result = CheckAndRun(
        trainer, options, Request(print_step, {}, listeners, &**data, eval_data));
    if (!result.ok()) return Fail(result.status());
  }
  if (absl::GetFlag(FLAGS_continue_steps) > 0) {
    const std::string sharding = absl::GetFlag(FLAGS_continue_sharding);
    if (absl::Status s =
            join_run(sharding.empty() ? absl::GetFlag(FLAGS_sharding) : sharding);
        !s.ok()) {
      return Fail(s);
    }
    options.steps = absl::GetFlag(FLAGS_continue_steps);
    absl::StatusOr<TrainResult> result = CheckAndRun(
        trainer, options, Request(print_step, {}, listeners, &**data, nullptr, true));
    if (!result.ok()) return Fail(result.status());
  }
  // The moments (each rank's step counts are copies of one number).
  int64_t state_bytes = 0;
  for (const auto& [name, t] : trainer.NamedOptimizerState()) {
    if (!absl::EndsWith(name, ".step")) state_bytes += t.nbytes();
  }
  int64_t largest = 0;
  for (const at::Tensor& p : (*model)->Parameters())
    largest = std::max(largest, p.numel());
  std::cout << "optimizer_state_bytes " << state_bytes << " largest_parameter_numel "
            << largest << " parameters " << (*model)->Parameters().size() << std::endl;
  const offload::OffloadStats offloaded = (*offloader)->Totals();
  std::cout << "offload bytes_out " << offloaded.bytes_out << " parameter_skips "
            << offloaded.skipped_of(offload::SkipReason::kParameter) << std::endl;
  if (data_parallel != nullptr) {
    if (const ParameterShardingStats* p = data_parallel->parameter_stats()) {
      // The largest unit: a decoder layer, or the head (final norm and
      // lm_head, the embedding when tied).
      int64_t largest_unit = 0;
      for (int64_t i = 0; i < (*model)->num_layers(); ++i) {
        int64_t bytes = 0;
        for (const at::Tensor& t : (*model)->LayerParameters(i)) bytes += t.nbytes();
        largest_unit = std::max(largest_unit, bytes);
      }
      const auto named = (*model)->NamedParameters();
      largest_unit =
          std::max<int64_t>(largest_unit, named[named.size() - 2].second.nbytes() +
                                              named.back().second.nbytes());
      std::cout << "largest_unit_bytes " << largest_unit << std::endl;
      std::cout << "parameter_bytes owned " << p->owned_bytes << " peak_gathered "
                << p->peak_gathered_bytes << " gathers " << p->gathers << " prefetched "
                << p->prefetched << std::endl;
    }
    if (absl::Status s = data_parallel->Finish(); !s.ok()) return Fail(s);
    const GradientSyncStats& stats = data_parallel->last_step();
    std::cout << "buckets " << stats.buckets << " started_in_backward "
              << stats.buckets_started_in_backward << " bytes " << stats.bytes
              << std::endl;
    std::cout << "gradient_bytes peak " << stats.peak_bytes << " at_update "
              << worker.grad_bytes_at_update << " largest_bucket "
              << stats.largest_bucket_bytes << std::endl;
    if (data_parallel->replicated()) {
      absl::StatusOr<double> drift = data_parallel->Drift();
      if (!drift.ok()) return Fail(drift.status());
      std::cout << "drift " << *drift << std::endl;
    }
  }
  if (!WriteFloats(absl::GetFlag(FLAGS_out), (*model)->Parameters())) {
    std::cout << "cannot write " << absl::GetFlag(FLAGS_out) << std::endl;
    return 1;
  }
  std::cout << "done" << std::endl;
  return 0;
}

int Main() {
  at::set_num_threads(1);
  absl::StatusOr<WorldSpec> world = ReadWorldSpec(ProcessEnvironment());
  if (!world.ok()) return Fail(world.status());
  std::unique_ptr<ProcessGroup> group;
  if (world->distributed()) {
    ProcessGroupOptions options;
    options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
    absl::StatusOr<std::unique_ptr<ProcessGroup>> connected =
        ProcessGroup::Connect(*world, options);
    if (!connected.ok()) return Fail(connected.status());
    group = std::move(*connected);
  }
  if (absl::GetFlag(FLAGS_scenario) == "collectives") {
    if (group == nullptr)
      return Fail(absl::InvalidArgumentError("collectives need WORLD_SIZE > 1"));
    return Collectives(*group);
  }
  return Train(group.get(), *world);
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return memprofd::Main();
}
