// memprofctl memory: current and peak bytes per device, phase and category;
// reset-peak; record start|stop; dump -o FILE (a memory_viz pickle); oom (the
// newest OOM report).

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {
namespace {

int Show(const Context& c) {
  v1::MemoryStats stats;
  auto ctx = c.client->NewContext(c.timeout);
  v1::GetMemoryStatsRequest request;
  request.set_all_ranks(absl::GetFlag(FLAGS_all_ranks));
  grpc::Status s = c.client->stub().GetMemoryStats(ctx.get(), request, &stats);
  if (!s.ok()) return ReportRpcError("memory", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(stats).c_str());
    return kExitOk;
  }
  std::printf("%-8s %12s %12s %14s %14s\n", "device", "current", "peak", "allocations",
              "frees");
  for (const auto& d : stats.devices()) {
    std::printf("%-8s %12s %12s %14lld %14lld\n", d.device().c_str(),
                HumanBytes(static_cast<double>(d.current_bytes())).c_str(),
                HumanBytes(static_cast<double>(d.peak_bytes())).c_str(),
                static_cast<long long>(d.allocations_total()),
                static_cast<long long>(d.frees_total()));
    if (d.reserved_bytes() > 0) {
      std::printf("         reserved %s, %lld alloc retries, %lld OOMs\n",
                  HumanBytes(static_cast<double>(d.reserved_bytes())).c_str(),
                  static_cast<long long>(d.alloc_retries_total()),
                  static_cast<long long>(d.ooms_total()));
    }
  }
  if (stats.ranks_size() > 0) {
    std::printf("\n%-5s %-5s %12s %12s %15s %7s %8s\n", "rank", "node", "current", "peak",
                "last step peak", "steps", "age");
    for (const auto& r : stats.ranks()) {
      if (!r.ok()) {
        std::printf("%-5d %s\n", r.rank(), r.error().c_str());
        continue;
      }
      std::printf("%-5d %-5d %12s %12s %15s %7lld %7.1fs\n", r.rank(), r.node_rank(),
                  HumanBytes(static_cast<double>(r.current_bytes())).c_str(),
                  HumanBytes(static_cast<double>(r.peak_bytes())).c_str(),
                  HumanBytes(static_cast<double>(r.last_step_peak_bytes())).c_str(),
                  static_cast<long long>(r.steps_total()), r.age_seconds());
    }
    std::printf(
        "imbalance (max - min): last step peak %s, current %s\n",
        HumanBytes(static_cast<double>(stats.step_peak_imbalance_bytes())).c_str(),
        HumanBytes(static_cast<double>(stats.current_imbalance_bytes())).c_str());
  }
  if (stats.last_step_phase_peaks_size() > 0) {
    std::printf("\nlast step's peak by phase:\n");
    for (const auto& p : stats.last_step_phase_peaks()) {
      std::printf("  %-8s %-10s %12s\n", p.device().c_str(), p.phase().c_str(),
                  HumanBytes(static_cast<double>(p.peak_bytes())).c_str());
    }
  }
  std::printf("\nby category:\n");
  for (const auto& cat : stats.categories()) {
    std::printf("  %-28s %12s\n", cat.category().c_str(),
                HumanBytes(static_cast<double>(cat.bytes())).c_str());
  }
  std::printf("\nphase now: %s; history: %s, %lld/%lld entries, %lld dropped\n",
              stats.current_phase().c_str(),
              stats.recording() ? "recording" : "not recording",
              static_cast<long long>(stats.history_entries()),
              static_cast<long long>(stats.history_max_entries()),
              static_cast<long long>(stats.history_dropped()));
  return kExitOk;
}

int Dump(const Context& c) {
  const std::string path = absl::GetFlag(FLAGS_o);
  if (path.empty()) return Usage("memory dump needs -o FILE");
  auto ctx = c.client->NewContext();
  auto reader =
      c.client->stub().DumpMemoryHistory(ctx.get(), v1::DumpMemoryHistoryRequest());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    std::fprintf(stderr, "memprofctl: cannot write '%s'\n", path.c_str());
    return kExitUsage;
  }
  v1::DumpChunk chunk;
  int64_t bytes = 0;
  while (reader->Read(&chunk)) {
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    bytes += static_cast<int64_t>(chunk.data().size());
  }
  grpc::Status s = reader->Finish();
  out.close();
  if (!s.ok()) {
    std::remove(path.c_str());
    return ReportRpcError("memory dump", s);
  }
  if (!out) {
    std::fprintf(stderr, "memprofctl: writing '%s' failed\n", path.c_str());
    return kExitRpcError;
  }
  if (!c.json) {
    std::printf("wrote %s (%s); open it at https://pytorch.org/memory_viz\n",
                path.c_str(), HumanBytes(static_cast<double>(bytes)).c_str());
  }
  return kExitOk;
}

// The newest OOM report: a summary, or with --json the OomReport message.
int Oom(const Context& c) {
  v1::OomReport report;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().GetLastOomReport(
      ctx.get(), v1::GetLastOomReportRequest(), &report);
  if (!s.ok()) return ReportRpcError("memory oom", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(report).c_str());
    return kExitOk;
  }
  std::printf("step %lld ran out of memory: %s\n",
              static_cast<long long>(report.global_step()), report.error().c_str());
  if (report.captured()) {
    std::printf("request:  %s on %s in %s\n",
                HumanBytes(static_cast<double>(report.requested_bytes())).c_str(),
                report.device().c_str(),
                report.phase().empty() ? "an unknown phase" : report.phase().c_str());
  } else {
    std::printf("request:  not seen by an allocator (the size is unknown)\n");
  }
  auto or_unknown = [](bool has, int64_t v) {
    return has ? HumanBytes(static_cast<double>(v)) : std::string("unknown");
  };
  std::printf("device:   %s allocated, %s reserved, %s free of %s\n",
              HumanBytes(static_cast<double>(report.allocated_bytes())).c_str(),
              or_unknown(report.has_reserved_bytes(), report.reserved_bytes()).c_str(),
              or_unknown(report.has_free_bytes(), report.free_bytes()).c_str(),
              or_unknown(report.has_total_bytes(), report.total_bytes()).c_str());
  std::printf("live:     %lld allocations, %s\n",
              static_cast<long long>(report.live_allocations()),
              HumanBytes(static_cast<double>(report.live_bytes())).c_str());
  if (report.largest_allocations_size() > 0) {
    std::printf("\nlargest live allocations:\n");
    for (const auto& a : report.largest_allocations()) {
      const std::string origin = a.phase().empty()
                                     ? std::string("-")
                                     : absl::StrCat(a.phase(), " step ", a.step());
      std::printf("  %12s  %-28s %-20s %s%s%s\n",
                  HumanBytes(static_cast<double>(a.bytes())).c_str(),
                  a.category().c_str(), origin.c_str(), a.module().c_str(),
                  a.op().empty() ? "" : " ", a.op().c_str());
    }
  }
  std::printf("\nby category:\n");
  for (const auto& cat : report.categories()) {
    std::printf("  %-28s %12s\n", cat.category().c_str(),
                HumanBytes(static_cast<double>(cat.bytes())).c_str());
  }
  if (report.recent_steps_size() > 0) {
    std::printf("\nlast steps' peaks:\n");
    for (const auto& step : report.recent_steps()) {
      std::string line;
      for (const auto& p : step.phase_peaks()) {
        absl::StrAppend(&line, " ", p.device(), "/", p.phase(), " ",
                        HumanBytes(static_cast<double>(p.peak_bytes())));
      }
      std::printf("  step %-6lld%s\n", static_cast<long long>(step.step()), line.c_str());
    }
  }
  if (!report.path().empty()) {
    std::printf("\nreport: %s\n", report.path().c_str());
  } else if (!report.write_error().empty()) {
    std::printf("\nreport not written: %s\n", report.write_error().c_str());
  }
  return kExitOk;
}

}  // namespace

int MemoryCommand(const Context& c, const Args& args) {
  if (args.empty()) return Show(c);
  const std::string& verb = args[0];
  grpc::Status s;
  if (verb == "dump") return Dump(c);
  if (verb == "top") return MemoryTopCommand(c, args);
  if (verb == "diff") return MemoryDiffCommand(c, args);
  if (verb == "oom") {
    if (args.size() != 1)
      return Usage("memory oom takes no arguments (--json is a flag)");
    return Oom(c);
  }
  if (verb == "reset-peak") {
    v1::ResetPeakMemoryResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().ResetPeakMemory(ctx.get(), v1::ResetPeakMemoryRequest(), &resp);
  } else if (verb == "record" && args.size() == 2 && args[1] == "start") {
    v1::StartMemoryRecordingRequest req;
    req.set_max_entries(absl::GetFlag(FLAGS_max_entries));
    v1::StartMemoryRecordingResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().StartMemoryRecording(ctx.get(), req, &resp);
  } else if (verb == "record" && args.size() == 2 && args[1] == "stop") {
    v1::StopMemoryRecordingRequest req;
    req.set_clear(absl::GetFlag(FLAGS_clear));
    v1::StopMemoryRecordingResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().StopMemoryRecording(ctx.get(), req, &resp);
  } else {
    return Usage(absl::StrCat("unknown memory verb '", absl::StrJoin(args, " "), "'"));
  }
  if (!s.ok()) return ReportRpcError(absl::StrCat("memory ", verb), s);
  if (!c.json) std::printf("ok\n");
  return kExitOk;
}

}  // namespace memprofd::cli
