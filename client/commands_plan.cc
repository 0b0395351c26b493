// memprofctl plan: a memory plan of one training step (PlanMemory), waited
// for like any operation: the peak and when, the categories at the peak, the
// model state beside the activations, the top modules and ops, and the
// verdict against --capacity; for a data-parallel run (--world_size,
// --sharding), each planned rank's peak. With --json, the plan (MemoryPlan)
// alone.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {
namespace {

// The rows shown of each top list.
constexpr int kTopRows = 5;

std::string Bytes(int64_t bytes) { return HumanBytes(static_cast<double>(bytes)); }

void PrintHolders(const char* title,
                  const google::protobuf::RepeatedPtrField<v1::PlanHolder>& holders) {
  std::printf("%s\n", title);
  for (int i = 0; i < holders.size() && i < kTopRows; ++i) {
    std::printf("  %-44s %12s\n", holders[i].name().c_str(),
                Bytes(holders[i].bytes()).c_str());
  }
}

// The planned rank with the highest peak (the first such).
int LargestRank(const v1::MemoryPlan& p) {
  const v1::RankPlan* largest = nullptr;
  for (const v1::RankPlan& r : p.ranks()) {
    if (largest == nullptr ||
        r.peak_allocated_bytes() > largest->peak_allocated_bytes()) {
      largest = &r;
    }
  }
  return largest == nullptr ? 0 : largest->rank();
}

void PrintPlan(const std::string& id, const v1::MemoryPlan& p) {
  std::printf("%s: %s on %s: peak %s in %s (step %lld of the plan's 2)\n", id.c_str(),
              p.model().c_str(), p.target().c_str(),
              Bytes(p.peak_allocated_bytes()).c_str(), p.peak_phase().c_str(),
              static_cast<long long>(p.peak_step()));
  if (p.world_size() > 1) {
    std::printf("each of %d ranks (sharding %s); the peak is rank %d's\n", p.world_size(),
                p.sharding().c_str(), LargestRank(p));
    for (const v1::RankPlan& r : p.ranks()) {
      std::printf("  rank %-4d peak %12s in %-10s owns %lld parameters\n", r.rank(),
                  Bytes(r.peak_allocated_bytes()).c_str(), r.peak_phase().c_str(),
                  static_cast<long long>(r.owned_parameter_count()));
    }
  }
  std::printf("model state %s, activations %s; %s stays between steps\n",
              Bytes(p.model_state_bytes()).c_str(), Bytes(p.activation_bytes()).c_str(),
              Bytes(p.resident_between_steps_bytes()).c_str());
  if (p.offloaded_bytes() > 0) {
    std::printf(
        "the offloader moves %s off the device in that step; its copies in flight may "
        "add up to %s to the peak\n",
        Bytes(p.offloaded_bytes()).c_str(), Bytes(p.offload_in_flight_bytes()).c_str());
  }
  if (p.reserved_bytes() > 0) {
    std::printf("the caching allocator reserves %s (simulated)\n",
                Bytes(p.reserved_bytes()).c_str());
  }
  if (p.host_rss_bytes() > 0) {
    std::printf("the daemon's resident set grows by %s on this host (RSS)\n",
                Bytes(p.host_rss_bytes()).c_str());
  }
  std::printf("categories at the peak\n");
  for (const v1::CategoryBytes& c : p.categories_at_peak()) {
    if (c.bytes() == 0) continue;
    std::printf("  %-44s %12s\n", c.category().c_str(), Bytes(c.bytes()).c_str());
  }
  PrintHolders("top modules at the peak", p.top_modules_at_peak());
  PrintHolders("top ops at the peak", p.top_ops_at_peak());
  if (p.capacity_bytes() == 0) {
    std::printf("verdict: none (give --capacity BYTES)\n");
  } else if (p.fits()) {
    std::printf("verdict: fits in %s, headroom %s\n", Bytes(p.capacity_bytes()).c_str(),
                Bytes(p.headroom_bytes()).c_str());
  } else {
    std::printf("verdict: does not fit in %s, short by %s\n",
                Bytes(p.capacity_bytes()).c_str(), Bytes(-p.headroom_bytes()).c_str());
  }
  std::printf("planned in %.2f s (%lld allocations on the meta device)\n", p.seconds(),
              static_cast<long long>(p.allocations()));
}

}  // namespace

int PlanCommand(const Context& c, const Args& args) {
  if (!args.empty()) return Usage("plan takes flags only (see usage)");
  v1::PlanMemoryRequest req;
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const std::string hf_config = absl::GetFlag(FLAGS_hf_config);
  if (!preset.empty() && !hf_config.empty()) {
    return Usage(
        "plan: give --preset or --hf_config, not both (neither: the loaded model)");
  }
  if (!preset.empty()) req.set_preset(preset);
  if (!hf_config.empty()) req.set_hf_config_dir(hf_config);
  std::string error;
  if (!TrainRequestFromFlags(req.mutable_train(), &error)) return Usage(error);
  if (auto v = GivenFlag(FLAGS_target)) req.set_target(*v);
  if (auto v = GivenFlag(FLAGS_capacity)) req.set_capacity_bytes(v->bytes);
  if (auto v = GivenFlag(FLAGS_world_size)) req.set_world_size(*v);
  if (auto v = GivenFlag(FLAGS_sharding)) req.set_sharding(*v);

  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().PlanMemory(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("plan", s);
  s = WaitForOperation(c, op.id(), &op);
  if (!s.ok()) return ReportRpcError("plan", s);
  if (op.has_plan()) {
    if (c.json) {
      std::printf("%s\n", ToJsonLine(op.plan()).c_str());
    } else {
      PrintPlan(op.id(), op.plan());
    }
  }
  if (op.has_error()) {
    std::fprintf(stderr, "memprofctl: plan: %s: %s\n", op.id().c_str(),
                 op.error().message().c_str());
  }
  return ExitForOperation(op);
}

}  // namespace memprofd::cli
