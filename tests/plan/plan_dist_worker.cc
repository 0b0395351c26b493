// One rank of a real data-parallel run of the two steps a plan is made of
// (calibration.h's MeasureTrainingSteps over a Gloo group on loopback), for
// planner_dist_test: the tiny preset, float32 on the CPU, batch_size x
// seq_len windows per rank. Prints one line per step:
//   "rank R step S peak P"
// P being the bytes the CPU allocator held at the step's peak above what it
// held before the model was made. Exits 1 with the status on stderr.

#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/dist/process_group.h"
#include "core/dist/sharding.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/plan/calibration.h"
#include "tests/testing/llama.h"

ABSL_FLAG(int, rank, 0, "this rank");
ABSL_FLAG(int, world_size, 2, "ranks");
ABSL_FLAG(int, port, 0, "rank 0's store port on 127.0.0.1");
ABSL_FLAG(std::string, sharding, "none", "none, optimizer, gradients or full");
ABSL_FLAG(int64_t, batch_size, 2, "windows per rank");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per window");
ABSL_FLAG(bool, bf16_checkpointed, false,
          "mixed_precision bf16 with gradient checkpointing");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  namespace plan = memprofd::plan;
  namespace memory = memprofd::memory;
  auto fail = [](const absl::Status& status) {
    std::cerr << status << "\n";
    return 1;
  };
  if (absl::Status s = memprofd::memory::InstallMemoryAccounting(); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<memprofd::Sharding> sharding =
      memprofd::ParseSharding(absl::GetFlag(FLAGS_sharding));
  if (!sharding.ok()) return fail(sharding.status());
  memprofd::WorldSpec world;
  world.rank = absl::GetFlag(FLAGS_rank);
  world.world_size = absl::GetFlag(FLAGS_world_size);
  world.master_port = absl::GetFlag(FLAGS_port);
  absl::StatusOr<std::unique_ptr<memprofd::ProcessGroup>> group =
      memprofd::ProcessGroup::Connect(world, memprofd::ProcessGroupOptions());
  if (!group.ok()) return fail(group.status());
  plan::PlanSpec spec;
  spec.model = memprofd::testing::PresetConfig("tiny");
  spec.train.batch_size = absl::GetFlag(FLAGS_batch_size);
  spec.train.seq_len = absl::GetFlag(FLAGS_seq_len);
  spec.world_size = world.world_size;
  spec.sharding = *sharding;
  if (absl::GetFlag(FLAGS_bf16_checkpointed)) {
    spec.train.mixed_precision = memprofd::MixedPrecision::kBf16;
    spec.train.gradient_checkpointing = true;
  }
  absl::StatusOr<std::vector<plan::MeasuredStep>> steps =
      plan::MeasureTrainingSteps(spec, c10::Device(c10::DeviceType::CPU),
                                 memory::MemoryRecorder::Global(), group->get());
  if (!steps.ok()) return fail(steps.status());
  for (const plan::MeasuredStep& s : *steps) {
    std::cout << "rank " << world.rank << " step " << s.step << " peak "
              << s.peak_allocated_bytes << "\n";
  }
  return 0;
}
