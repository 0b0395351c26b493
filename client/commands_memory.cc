// memprofctl memory: current and peak bytes per device, phase and category;
// reset-peak; record start|stop; dump -o FILE (a memory_viz pickle).

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
  grpc::Status s =
      c.client->stub().GetMemoryStats(ctx.get(), v1::GetMemoryStatsRequest(), &stats);
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

}  // namespace

int MemoryCommand(const Context& c, const Args& args) {
  if (args.empty()) return Show(c);
  const std::string& verb = args[0];
  grpc::Status s;
  if (verb == "dump") return Dump(c);
  if (verb == "top") return MemoryTopCommand(c, args);
  if (verb == "diff") return MemoryDiffCommand(c, args);
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
