// memprofctl memory top: where the bytes are by module, op or category
// (GetMemoryBreakdown); memprofctl memory diff A B: what grew between two
// steps (DiffMemory). Only the flags given are sent: the daemon's defaults
// and checks apply to the rest.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {
namespace {

std::string Bytes(int64_t b) { return HumanBytes(static_cast<double>(b)); }

std::string Signed(int64_t b) { return b < 0 ? "-" + Bytes(-b) : "+" + Bytes(b); }

}  // namespace

int MemoryTopCommand(const Context& c, const Args& args) {
  if (args.size() != 1) return Usage("memory top takes no arguments, only flags");
  v1::GetMemoryBreakdownRequest req;
  if (auto by = GivenFlag(FLAGS_by)) req.set_by(*by);
  if (auto phase = GivenFlag(FLAGS_phase)) req.set_phase(*phase);
  if (auto top = GivenFlag(FLAGS_top)) req.set_top(*top);
  v1::MemoryBreakdown b;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().GetMemoryBreakdown(ctx.get(), req, &b);
  if (!s.ok()) return ReportRpcError("memory top", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(b).c_str());
    return kExitOk;
  }
  std::printf("%s, last step %lld, by %s%s: %lld of %lld rows\n", b.device().c_str(),
              static_cast<long long>(b.step()), b.by().c_str(),
              b.phase().empty() ? "" : absl::StrCat(", peaks in ", b.phase()).c_str(),
              static_cast<long long>(b.rows_size()),
              static_cast<long long>(b.total_rows()));
  if (b.by() == "op") {
    std::printf("  %-48s %14s %14s\n", "op", "last step", "total");
    for (const auto& r : b.rows()) {
      std::printf("  %-48s %14s %14s\n", r.key().c_str(),
                  Bytes(r.allocated_bytes()).c_str(),
                  Bytes(r.allocated_bytes_total()).c_str());
    }
  } else {
    std::printf("  %-48s %-18s %12s %12s  %s\n",
                b.by() == "module" ? "module" : "category",
                b.by() == "module" ? "category" : "", "live", "step peak", "in");
    for (const auto& r : b.rows()) {
      std::printf("  %-48s %-18s %12s %12s  %s\n",
                  r.key().empty() ? "(no module)" : r.key().c_str(),
                  b.by() == "module" ? r.category().c_str() : "",
                  Bytes(r.live_bytes()).c_str(), Bytes(r.peak_bytes()).c_str(),
                  r.peak_phase().c_str());
    }
  }
  std::printf("\nlive by category (%s attributed, allocator %s):\n",
              Bytes(b.attributed_bytes()).c_str(), Bytes(b.allocator_bytes()).c_str());
  for (const auto& cat : b.categories()) {
    if (cat.bytes() == 0) continue;
    std::printf("  %-28s %12s\n", cat.category().c_str(), Bytes(cat.bytes()).c_str());
  }
  if (b.offloaded_host_bytes() > 0 || b.offloaded_disk_bytes() > 0) {
    std::printf("  outside the allocator: offloaded host %s, disk %s\n",
                Bytes(b.offloaded_host_bytes()).c_str(),
                Bytes(b.offloaded_disk_bytes()).c_str());
  }
  return kExitOk;
}

int MemoryDiffCommand(const Context& c, const Args& args) {
  int64_t a = 0, b = 0;
  if (args.size() != 3 || !absl::SimpleAtoi(args[1], &a) ||
      !absl::SimpleAtoi(args[2], &b)) {
    return Usage("memory diff needs two step numbers: memory diff STEP_A STEP_B");
  }
  v1::DiffMemoryRequest req;
  req.set_step_a(a);
  req.set_step_b(b);
  if (auto top = GivenFlag(FLAGS_top)) req.set_top(*top);
  v1::MemoryDiff d;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().DiffMemory(ctx.get(), req, &d);
  if (!s.ok()) return ReportRpcError("memory diff", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(d).c_str());
    return kExitOk;
  }
  std::printf("%s, step %lld -> %lld\n", d.device().c_str(),
              static_cast<long long>(d.step_a()), static_cast<long long>(d.step_b()));
  std::printf("  %-48s %-18s %12s %12s %12s\n", "module", "category", "peak a", "peak b",
              "change");
  for (const auto& r : d.rows()) {
    std::printf("  %-48s %-18s %12s %12s %12s\n",
                r.module().empty() ? "(no module)" : r.module().c_str(),
                r.category().c_str(), Bytes(r.peak_a()).c_str(),
                Bytes(r.peak_b()).c_str(), Signed(r.peak_b() - r.peak_a()).c_str());
  }
  std::printf("\nby category:\n");
  for (const auto& r : d.categories()) {
    std::printf("  %-28s peak %12s -> %12s (%s), live at end %s -> %s\n",
                r.category().c_str(), Bytes(r.peak_a()).c_str(),
                Bytes(r.peak_b()).c_str(), Signed(r.peak_b() - r.peak_a()).c_str(),
                Bytes(r.live_a()).c_str(), Bytes(r.live_b()).c_str());
  }
  return kExitOk;
}

}  // namespace memprofd::cli
