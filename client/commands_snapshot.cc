// memprofctl snapshot NAME (with a progress bar) and snapshots list /
// describe / delete.

#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {
namespace {

// A snapshot kind as --kind spells it: the enum's name without its prefix,
// in lower case ("weights", "checkpoint", "adapter", "merged").
constexpr absl::string_view kKindPrefix = "SNAPSHOT_KIND_";
std::string KindName(v1::SnapshotKind kind) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::SnapshotKind_Name(kind), kKindPrefix));
}

// --kind's text as the enum; nullopt for a name it does not have.
std::optional<v1::SnapshotKind> ParseKind(const std::string& text) {
  v1::SnapshotKind kind;
  if (!v1::SnapshotKind_Parse(absl::StrCat(kKindPrefix, absl::AsciiStrToUpper(text)),
                              &kind) ||
      kind == v1::SNAPSHOT_KIND_UNSPECIFIED) {
    return std::nullopt;
  }
  return kind;
}

// "weights, checkpoint, adapter or merged".
std::string KindChoices() {
  std::vector<std::string> names;
  for (int k = v1::SnapshotKind_MIN; k <= v1::SnapshotKind_MAX; ++k) {
    if (v1::SnapshotKind_IsValid(k) && k != v1::SNAPSHOT_KIND_UNSPECIFIED) {
      names.push_back(KindName(static_cast<v1::SnapshotKind>(k)));
    }
  }
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

void PrintManifest(const Context& c, const v1::SnapshotManifest& m) {
  if (c.json) {
    std::printf("%s\n", ToJsonLine(m).c_str());
    return;
  }
  std::printf(
      "%s  %s  %s, %lld tensors, %s in %d file(s), %s, step %lld, %.2f s (%s/s)\n",
      m.name().c_str(), m.directory().c_str(),
      KindName(m.kind() == v1::SNAPSHOT_KIND_UNSPECIFIED ? v1::SNAPSHOT_KIND_WEIGHTS
                                                         : m.kind())
          .c_str(),
      static_cast<long long>(m.num_tensors()),
      HumanBytes(static_cast<double>(m.total_size())).c_str(), m.files_size(),
      m.dtype().c_str(), static_cast<long long>(m.global_step()), m.duration_seconds(),
      HumanBytes(m.throughput_bytes_per_second()).c_str());
}

}  // namespace

int SnapshotCommand(const Context& c, const Args& args) {
  if (args.size() != 1) return Usage("snapshot needs exactly one NAME");
  v1::SnapshotRequest req;
  req.set_name(args[0]);
  req.set_max_shard_size(absl::GetFlag(FLAGS_max_shard_size));
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "keep") {
    req.set_dtype(v1::SNAPSHOT_DTYPE_KEEP);
  } else if (dtype == "bf16") {
    req.set_dtype(v1::SNAPSHOT_DTYPE_BF16);
  } else if (dtype == "fp16") {
    req.set_dtype(v1::SNAPSHOT_DTYPE_FP16);
  } else if (dtype == "fp32") {
    req.set_dtype(v1::SNAPSHOT_DTYPE_FP32);
  } else {
    return Usage(
        absl::StrCat("--dtype must be keep, bf16, fp16 or fp32, not '", dtype, "'"));
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "blocking" && mode != "async") {
    return Usage(absl::StrCat("--mode must be blocking or async, not '", mode, "'"));
  }
  req.set_mode(mode == "async" ? v1::SNAPSHOT_MODE_ASYNC : v1::SNAPSHOT_MODE_BLOCKING);
  const std::string kind = absl::GetFlag(FLAGS_kind);
  if (!kind.empty()) {
    const std::optional<v1::SnapshotKind> parsed = ParseKind(kind);
    if (!parsed) {
      return Usage(absl::StrCat("--kind must be ", KindChoices(), ", not '", kind, "'"));
    }
    req.set_kind(*parsed);
  }

  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().Snapshot(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("snapshot", s);

  v1::WatchOperationRequest watch;
  watch.set_id(op.id());
  auto watch_ctx = c.client->NewContext();
  auto reader = c.client->stub().WatchOperation(watch_ctx.get(), watch);
  const bool bar = !c.json && isatty(STDERR_FILENO);
  while (reader->Read(&op)) {
    if (!bar || op.progress().total() <= 0) continue;
    const double frac = static_cast<double>(op.progress().completed()) /
                        static_cast<double>(op.progress().total());
    const int filled = static_cast<int>(frac * 30);
    std::fprintf(stderr, "\r\033[K[%s%s] %3.0f%% %s / %s",
                 std::string(filled, '#').c_str(), std::string(30 - filled, ' ').c_str(),
                 frac * 100,
                 HumanBytes(static_cast<double>(op.progress().completed())).c_str(),
                 HumanBytes(static_cast<double>(op.progress().total())).c_str());
  }
  if (bar) std::fprintf(stderr, "\n");
  s = reader->Finish();
  if (!s.ok()) return ReportRpcError("snapshot (progress)", s);
  if (op.has_snapshot()) PrintManifest(c, op.snapshot());
  if (op.has_error()) {
    std::fprintf(stderr, "memprofctl: snapshot: %s\n", op.error().message().c_str());
  }
  return ExitForOperation(op);
}

int SnapshotsCommand(const Context& c, const Args& args) {
  const std::string verb = args.empty() ? "list" : args[0];
  if (verb == "list") {
    v1::ListSnapshotsResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    grpc::Status s =
        c.client->stub().ListSnapshots(ctx.get(), v1::ListSnapshotsRequest(), &resp);
    if (!s.ok()) return ReportRpcError("snapshots list", s);
    for (const auto& m : resp.snapshots()) PrintManifest(c, m);
    return kExitOk;
  }
  if (args.size() != 2) return Usage(absl::StrCat("snapshots ", verb, " needs a NAME"));
  if (verb == "describe") {
    v1::DescribeSnapshotRequest req;
    req.set_name(args[1]);
    v1::SnapshotManifest m;
    auto ctx = c.client->NewContext(c.timeout);
    grpc::Status s = c.client->stub().DescribeSnapshot(ctx.get(), req, &m);
    if (!s.ok()) return ReportRpcError("snapshots describe", s);
    PrintManifest(c, m);
    if (!c.json) {
      for (const auto& f : m.files()) {
        std::printf("  %-40s %s\n", f.name().c_str(),
                    HumanBytes(static_cast<double>(f.bytes())).c_str());
      }
    }
    return kExitOk;
  }
  if (verb == "delete") {
    v1::DeleteSnapshotRequest req;
    req.set_name(args[1]);
    v1::DeleteSnapshotResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    grpc::Status s = c.client->stub().DeleteSnapshot(ctx.get(), req, &resp);
    if (!s.ok()) return ReportRpcError("snapshots delete", s);
    if (!c.json) std::printf("deleted %s\n", args[1].c_str());
    return kExitOk;
  }
  return Usage(absl::StrCat("unknown snapshots verb '", verb, "'"));
}

}  // namespace memprofd::cli
