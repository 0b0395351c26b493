#ifndef MEMPROFD_CORE_DIST_WORLD_H_
#define MEMPROFD_CORE_DIST_WORLD_H_

// Where this process sits in a data-parallel run: its rank, the world size and
// the rendezvous address, read from the environment the launcher set. The
// launchers memprofd follows (REFERENCE.md §6):
//   - torchrun (and any launcher with its variables): RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
//     TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID and, with
//     TORCHELASTIC_USE_AGENT_STORE=True, a store the agent already hosts;
//     Kubeflow's PyTorchJob v1 sets the same RANK/WORLD_SIZE/MASTER_*;
//   - Kubeflow Trainer v2 (JobSet): PET_NNODES, PET_NPROC_PER_NODE,
//     PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT;
//   - a StatefulSet: MEMPROFD_WORLD_SIZE with the rank from the pod index
//     (MEMPROFD_POD_INDEX, set from the `apps.kubernetes.io/pod-index` label)
//     or the ordinal suffix of HOSTNAME (`memprofd-3` is rank 3), and
//     MASTER_ADDR naming pod 0 through the headless Service.
// The first of these that is present wins, in that order. None of them, or a
// world size of 1, is a single process: today's daemon, unchanged.
//
// Pure functions of the environment they are given; thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// The launcher a WorldSpec was read from, for logs and status.
enum class Launcher { kNone, kTorchrun, kKubeflowTrainer, kStatefulSet };
const char* LauncherName(Launcher launcher);

struct WorldSpec {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // The host's index among the hosts (torchrun's GROUP_RANK, PET_NODE_RANK).
  int node_rank = 0;
  // Rendezvous: the TCP store rank 0 hosts (or, with use_agent_store, the
  // one torchrun's agent hosts).
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent hosts the store: every rank, rank 0 too, is a client.
  bool use_agent_store = false;
  // How many times the launcher restarted this run (TORCHELASTIC_RESTART_COUNT):
  // each attempt gets its own store prefix, so keys of a failed attempt are
  // never read by the next.
  int restart_count = 0;
  std::string run_id;

  bool distributed() const { return world_size > 1; }
};

// Looks a variable up; nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view name)>;

// The process's own environment (getenv).
EnvLookup ProcessEnvironment();

// Reads the spec from `env`. INVALID_ARGUMENT, naming the variable and what it
// must be, for a variable that is not an integer in range (RANK=-1, RANK >=
// WORLD_SIZE, MASTER_PORT=0), a half-set launcher (RANK without WORLD_SIZE),
// or a StatefulSet rank that cannot be found (no MEMPROFD_POD_INDEX and no
// ordinal suffix on HOSTNAME).
absl::StatusOr<WorldSpec> ReadWorldSpec(const EnvLookup& env);

// One line for logs: "rank 1 of 2 (torchrun, local 1 of 2, node 0), store
// 127.0.0.1:29500, attempt 0".
std::string DescribeWorld(const WorldSpec& world);

// `text` with "{rank}", "{local_rank}" and "{node_rank}" replaced by the
// world's numbers: the paths and addresses that ranks sharing one host must
// not share (--port_file=/run/memprofd-{rank}.json). Text without them is
// returned as it is.
std::string ExpandRankPlaceholders(absl::string_view text, const WorldSpec& world);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_WORLD_H_
