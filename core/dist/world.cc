#include "core/dist/world.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

// The integer in `name`, or `fallback` when it is unset. INVALID_ARGUMENT when
// it is set but not an integer in [min, max].
absl::StatusOr<int> IntVariable(const EnvLookup& env, absl::string_view name,
                                int fallback, int min, int max) {
  std::optional<std::string> value = env(name);
  if (!value.has_value()) return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < min || parsed > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", *value, "' must be an integer from ", min, " to ", max));
  }
  return parsed;
}

absl::Status CheckRankInWorld(const WorldSpec& w, absl::string_view rank_source) {
  if (w.rank >= w.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        rank_source, " is ", w.rank, " but the world has ", w.world_size, " ranks (0 to ",
        w.world_size - 1, "): set a rank below the world size"));
  }
  if (w.local_rank >= w.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LOCAL_RANK is ", w.local_rank, " but LOCAL_WORLD_SIZE is ", w.local_world_size));
  }
  return absl::OkStatus();
}

// Whether `addr` can name a host at all: an IPv4 or IPv6 literal (IPv6 also
// in brackets), or a host name as RFC 1123 spells one (labels of letters,
// digits and hyphens, 1 to 63 bytes, not starting or ending with a hyphen,
// at most 253 bytes in all, a trailing dot allowed). Anything else could only
// fail in the store's connect loop after its whole timeout.
bool IsHostAddress(absl::string_view addr) {
  if (absl::StartsWith(addr, "[") && absl::EndsWith(addr, "]")) {
    addr = addr.substr(1, addr.size() - 2);
  }
  const std::string text(addr);
  unsigned char buf[sizeof(struct in6_addr)];
  if (::inet_pton(AF_INET, text.c_str(), buf) == 1 ||
      ::inet_pton(AF_INET6, text.c_str(), buf) == 1) {
    return true;
  }
  if (absl::EndsWith(addr, ".")) addr.remove_suffix(1);
  if (addr.empty() || addr.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(addr, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' ||
        label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

// MASTER_ADDR/MASTER_PORT (or the PET_ names): torchrun's defaults when unset,
// so a one-host run needs no address.
absl::Status ReadMaster(const EnvLookup& env, absl::string_view addr_name,
                        absl::string_view port_name, WorldSpec& w) {
  if (std::optional<std::string> addr = env(addr_name)) {
    if (addr->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(addr_name, " is empty: set it to rank 0's host name or address"));
    }
    if (!IsHostAddress(*addr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          addr_name, " is ", Echo(*addr),
          ", which is neither an IP address nor a host name: set it to rank 0's host "
          "name or address"));
    }
    w.master_addr = *addr;
  }
  ASSIGN_OR_RETURN(w.master_port, IntVariable(env, port_name, w.master_port, 1, 65535));
  return absl::OkStatus();
}

absl::Status ReadElastic(const EnvLookup& env, WorldSpec& w) {
  ASSIGN_OR_RETURN(w.restart_count,
                   IntVariable(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30));
  if (std::optional<std::string> id = env("TORCHELASTIC_RUN_ID")) w.run_id = *id;
  std::optional<std::string> agent = env("TORCHELASTIC_USE_AGENT_STORE");
  w.use_agent_store =
      agent.has_value() && (*agent == "True" || *agent == "true" || *agent == "1");
  return absl::OkStatus();
}

constexpr int kMaxWorld = 1 << 20;

absl::StatusOr<WorldSpec> ReadTorchrun(const EnvLookup& env) {
  if (!env("RANK").has_value() || !env("WORLD_SIZE").has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(env("RANK").has_value() ? "RANK" : "WORLD_SIZE", " is set but ",
                     env("RANK").has_value() ? "WORLD_SIZE" : "RANK",
                     " is not: set both (torchrun sets both)"));
  }
  WorldSpec w;
  w.launcher = Launcher::kTorchrun;
  ASSIGN_OR_RETURN(w.world_size, IntVariable(env, "WORLD_SIZE", 1, 1, kMaxWorld));
  ASSIGN_OR_RETURN(w.rank, IntVariable(env, "RANK", 0, 0, kMaxWorld));
  ASSIGN_OR_RETURN(w.local_world_size,
                   IntVariable(env, "LOCAL_WORLD_SIZE", 1, 1, kMaxWorld));
  ASSIGN_OR_RETURN(w.local_rank, IntVariable(env, "LOCAL_RANK", 0, 0, kMaxWorld));
  // Without GROUP_RANK (Kubeflow's PyTorchJob sets none), ranks fill hosts
  // LOCAL_WORLD_SIZE at a time, as torchrun numbers them.
  ASSIGN_OR_RETURN(w.node_rank, IntVariable(env, "GROUP_RANK",
                                            w.rank / w.local_world_size, 0, kMaxWorld));
  RETURN_IF_ERROR(CheckRankInWorld(w, "RANK"));
  RETURN_IF_ERROR(ReadMaster(env, "MASTER_ADDR", "MASTER_PORT", w));
  RETURN_IF_ERROR(ReadElastic(env, w));
  return w;
}

absl::StatusOr<WorldSpec> ReadKubeflowTrainer(const EnvLookup& env) {
  WorldSpec w;
  w.launcher = Launcher::kKubeflowTrainer;
  ASSIGN_OR_RETURN(int nodes, IntVariable(env, "PET_NNODES", 1, 1, kMaxWorld));
  ASSIGN_OR_RETURN(w.local_world_size,
                   IntVariable(env, "PET_NPROC_PER_NODE", 1, 1, kMaxWorld));
  ASSIGN_OR_RETURN(w.node_rank, IntVariable(env, "PET_NODE_RANK", 0, 0, kMaxWorld));
  ASSIGN_OR_RETURN(w.local_rank, IntVariable(env, "LOCAL_RANK", 0, 0, kMaxWorld));
  if (w.node_rank >= nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PET_NODE_RANK is ", w.node_rank, " but PET_NNODES is ", nodes));
  }
  w.world_size = nodes * w.local_world_size;
  w.rank = w.node_rank * w.local_world_size + w.local_rank;
  RETURN_IF_ERROR(CheckRankInWorld(w, "PET_NODE_RANK * PET_NPROC_PER_NODE + LOCAL_RANK"));
  RETURN_IF_ERROR(ReadMaster(env, "PET_MASTER_ADDR", "PET_MASTER_PORT", w));
  return w;
}

absl::StatusOr<WorldSpec> ReadStatefulSet(const EnvLookup& env) {
  WorldSpec w;
  w.launcher = Launcher::kStatefulSet;
  ASSIGN_OR_RETURN(w.world_size,
                   IntVariable(env, "MEMPROFD_WORLD_SIZE", 1, 1, kMaxWorld));
  if (env("MEMPROFD_POD_INDEX").has_value()) {
    ASSIGN_OR_RETURN(w.rank, IntVariable(env, "MEMPROFD_POD_INDEX", 0, 0, kMaxWorld));
  } else {
    const std::string host = env("HOSTNAME").value_or("");
    const size_t dash = host.rfind('-');
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(host).substr(dash + 1), &w.rank) ||
        w.rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MEMPROFD_WORLD_SIZE is set but the rank is unknown: set MEMPROFD_POD_INDEX "
          "(from the pod label apps.kubernetes.io/pod-index) or run in a StatefulSet pod "
          "whose HOSTNAME ends in its ordinal (HOSTNAME is '",
          host, "')"));
    }
  }
  w.node_rank = w.rank;
  RETURN_IF_ERROR(CheckRankInWorld(w, "the pod index"));
  RETURN_IF_ERROR(ReadMaster(env, "MASTER_ADDR", "MASTER_PORT", w));
  return w;
}

}  // namespace

const char* LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "single process";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kKubeflowTrainer:
      return "kubeflow trainer";
    case Launcher::kStatefulSet:
      return "statefulset";
  }
  return "unknown";
}

EnvLookup ProcessEnvironment() {
  return [](absl::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<WorldSpec> ReadWorldSpec(const EnvLookup& env) {
  if (env("RANK").has_value() || env("WORLD_SIZE").has_value()) return ReadTorchrun(env);
  if (env("PET_NNODES").has_value() || env("PET_NODE_RANK").has_value()) {
    return ReadKubeflowTrainer(env);
  }
  if (env("MEMPROFD_WORLD_SIZE").has_value()) return ReadStatefulSet(env);
  return WorldSpec();
}

std::string DescribeWorld(const WorldSpec& w) {
  if (!w.distributed()) return "single process (world size 1)";
  return absl::StrCat(
      "rank ", w.rank, " of ", w.world_size, " (", LauncherName(w.launcher), ", local ",
      w.local_rank, " of ", w.local_world_size, ", node ", w.node_rank, "), store ",
      w.master_addr, ":", w.master_port, w.use_agent_store ? " (torchrun agent's)" : "",
      ", attempt ", w.restart_count);
}

std::string ExpandRankPlaceholders(absl::string_view text, const WorldSpec& world) {
  return absl::StrReplaceAll(text, {{"{rank}", absl::StrCat(world.rank)},
                                    {"{local_rank}", absl::StrCat(world.local_rank)},
                                    {"{node_rank}", absl::StrCat(world.node_rank)}});
}

}  // namespace memprofd
