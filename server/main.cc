// memprofd: the training daemon. Flags fill ServerOptions; everything else
// lives in Server.

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "core/common/log.h"
#include "core/common/threads.h"
#include "core/dist/sharding.h"
#include "core/dist/world.h"
#include "core/offload/offload_fields.h"
#include "core/session/runtime.h"
#include "server/option_flags.h"
#include "server/options.h"
#include "server/server.h"

namespace {

// Every flag's default is the field's default in SessionOptions (or
// ServerOptions), so that the two cannot drift apart; these two spell
// defaults that are not plain values as their flags write them.
std::string DefaultOffloadTarget() {
  const memprofd::SessionOptions defaults;
  if (defaults.offload_target_auto) return "auto";
  return std::string(memprofd::offload::TargetName(defaults.offload.target));
}

std::string DefaultPrefetchDepth() {
  const int depth = memprofd::SessionOptions().offload.prefetch_depth;
  return depth == memprofd::offload::kPrefetchAuto ? "auto" : absl::StrCat(depth);
}

// A daemon offload flag's value as OffloadOptions keeps it: scalars as they
// are, a target by name ("auto": left as it is, resolved by the session), a
// read-ahead depth as "auto" or a number >= 0.
template <typename T>
absl::Status OffloadDefaultFromFlag(T value, T* out) {
  *out = value;
  return absl::OkStatus();
}
absl::Status OffloadDefaultFromFlag(const std::string& text,
                                    memprofd::offload::Target* out) {
  if (text == "auto") return absl::OkStatus();
  absl::StatusOr<memprofd::offload::Target> target = memprofd::offload::ParseTarget(text);
  if (!target.ok()) return target.status();
  *out = *target;
  return absl::OkStatus();
}
absl::Status OffloadDefaultFromFlag(const std::string& text, int* out) {
  absl::StatusOr<int> depth = memprofd::offload::ParsePrefetchDepth(text);
  if (!depth.ok()) return depth.status();
  *out = *depth;
  return absl::OkStatus();
}

// --sharding's help: the levels as sharding.h names them.
std::string ShardingHelp() {
  std::vector<std::string> names;
  for (memprofd::Sharding s : memprofd::AllShardings()) {
    names.emplace_back(memprofd::ShardingName(s));
  }
  return absl::StrCat(
      "data parallel: how much of the training state each rank keeps, one of ",
      absl::StrJoin(names, ", "),
      " (none: all of it; optimizer: a 1/N share of AdamW's state, ZeRO-1; "
      "gradients: and of the gradients, ZeRO-2; full: and of the parameters, "
      "ZeRO-3). Every rank must be started with the same level; a level this build "
      "does not implement is refused at start. A single process trains unsharded");
}

}  // namespace

ABSL_FLAG(std::string, listen, memprofd::ServerOptions().listen,
          "gRPC address host:port (port 0 picks a free one)");
ABSL_FLAG(std::string, metrics_listen, memprofd::ServerOptions().metrics_listen,
          "Prometheus /metrics address host:port (port 0 picks a free one)");
ABSL_FLAG(std::string, port_file, memprofd::ServerOptions().port_file,
          "write the bound ports as JSON {\"grpc_port\": N, \"metrics_port\": M} here");
ABSL_FLAG(std::string, auth_token_file, memprofd::ServerOptions().auth_token_file,
          "require 'authorization: Bearer <token>' on every RPC but health; the token is "
          "this file's first line");
ABSL_FLAG(std::string, tls_cert, memprofd::ServerOptions().tls_cert,
          "PEM certificate chain for TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, memprofd::ServerOptions().tls_key,
          "PEM private key for TLS (with --tls_cert)");
ABSL_FLAG(std::string, device, memprofd::SessionOptions().device,
          "compute device: auto, cpu, cuda or cuda:N");
ABSL_FLAG(std::string, model, memprofd::SessionOptions().model,
          "model loaded at start: a preset (tiny, small, smollm2-135m, qwen2.5-0.5b, "
          "llama-3.2-1b) or a Hugging Face "
          "directory "
          "(config.json + safetensors); empty for none");
ABSL_FLAG(int64_t, device_memory_limit,
          memprofd::SessionOptions().device_memory_limit_bytes,
          "the most bytes memprofd may allocate on its compute device (0: all it has); "
          "beyond it an allocation fails as out of memory, with an OOM report, as on a "
          "device of that size (on a CPU device, every tensor of the process counts)");
ABSL_FLAG(uint64_t, model_seed, memprofd::SessionOptions().model_seed,
          "seed of the start model's initialisation");
ABSL_FLAG(std::string, snapshot_root, memprofd::SessionOptions().snapshot_root,
          "directory for snapshots; empty turns snapshots off");
ABSL_FLAG(std::string, data_root,
          absl::StrJoin(memprofd::SessionOptions().data_roots, ","),
          "a directory that paths named by clients (data files, LoadModel's "
          "hf_directory) must resolve into, after symbolic links; repeat the flag or "
          "separate with ',' for several. None: clients may name no file (only the "
          "embedded corpus, inline tokens, presets and snapshots)");
ABSL_FLAG(int64_t, max_data_file_bytes, memprofd::SessionOptions().max_data_file_bytes,
          "the largest data file a client may name (it is mapped, not read into "
          "memory)");
ABSL_FLAG(int64_t, keep_last, memprofd::SessionOptions().keep_last,
          "keep only the newest N snapshots (0 keeps all)");
ABSL_FLAG(int64_t, snapshot_every_steps, memprofd::SessionOptions().snapshot_every_steps,
          "snapshot every N training steps (0: never)");
ABSL_FLAG(bool, refuse_unfit_steps, memprofd::SessionOptions().refuse_unfit_steps,
          "refuse a training whose step is planned to peak above what the device has "
          "free, before it allocates anything; false: run it, and let an allocation fail "
          "(with an OOM report)");
ABSL_FLAG(bool, snapshot_on_shutdown, memprofd::ServerOptions().snapshot_on_shutdown,
          "take a final snapshot on SIGTERM/SIGINT");
ABSL_FLAG(double, drain_seconds, 25.0,
          "after SIGTERM/SIGINT, the longest the daemon waits for running work (a step, "
          "an evaluation, the shutdown snapshot) before it exits anyway, with status 1; "
          "a second signal exits at once. Below Kubernetes' default 30 s grace period");
ABSL_FLAG(std::string, auto_snapshot_kind,
          std::string(memprofd::snapshot::SnapshotKindName(
              memprofd::SessionOptions().auto_snapshot_kind)),
          "what the daemon's own snapshots (--snapshot_every_steps, "
          "--snapshot_on_shutdown) hold: checkpoint (weights, optimizer and training "
          "state, to resume from), weights, or adapter (the LoRA adapters of a daemon "
          "that trains them)");
ABSL_FLAG(std::string, resume, memprofd::SessionOptions().resume,
          "at start, resume from a checkpoint under --snapshot_root instead of loading "
          "--model: latest (the newest checkpoint; --model when there is none yet) or a "
          "snapshot name; then Train with resume goes on at the next step");
ABSL_FLAG(int64_t, snapshot_staging_bytes,
          memprofd::SessionOptions().snapshot_staging_bytes,
          "the snapshot writer's staging buffer, in bytes");
ABSL_FLAG(bool, offload, memprofd::SessionOptions().offload.enabled,
          "offload saved activations by default in training");
ABSL_FLAG(
    std::string, offload_target, DefaultOffloadTarget(),
    "where offloaded activations go: auto (disk on CPU, host on CUDA), host or disk");
ABSL_FLAG(int64_t, min_offload_bytes,
          memprofd::SessionOptions().offload.min_offload_bytes,
          "saved tensors moving fewer bytes stay put");
ABSL_FLAG(int32_t, max_copies_in_flight,
          memprofd::SessionOptions().offload.max_copies_in_flight,
          "offloader: copies off the device in flight at once during forward");
ABSL_FLAG(std::string, offload_prefetch_depth, DefaultPrefetchDepth(),
          "offloaded storages backward reads ahead of need: auto (2 on CUDA, 0 on "
          "CPU), 0 (off) or N");
ABSL_FLAG(bool, offload_head, memprofd::SessionOptions().offload.offload_head,
          "also offload the LM head's activations");
ABSL_FLAG(std::string, spill_dir, memprofd::SessionOptions().offload.spill_dir,
          "directory of the offloader's spill file");
ABSL_FLAG(int64_t, host_limit_bytes, memprofd::SessionOptions().offload.host_limit_bytes,
          "host target: spill to disk beyond this many bytes held (0: no limit)");
ABSL_FLAG(std::string, report_dir, memprofd::SessionOptions().report_dir,
          "where a training step that runs out of memory writes its OOM report "
          "(empty: kept in memory only, for GetLastOomReport)");
ABSL_FLAG(std::string, peak_file, memprofd::SessionOptions().peak_file,
          "write the last completed step's peaks there (JSON, replaced atomically "
          "every step; empty: off)");
ABSL_FLAG(double, max_plan_seconds,
          absl::ToDoubleSeconds(memprofd::SessionOptions().max_plan_time),
          "the wall-clock cap on one memory plan (PlanMemory, a training's admission, a "
          "budget's candidates); past it the plan fails DEADLINE_EXCEEDED");
ABSL_FLAG(double, collective_timeout_seconds,
          absl::ToDoubleSeconds(memprofd::SessionOptions().collective_timeout),
          "data parallel: the bound on the rendezvous and on every collective; a rank "
          "that died or hangs makes the others fail within it");
ABSL_FLAG(std::string, sharding,
          std::string(memprofd::ShardingName(memprofd::SessionOptions().sharding)),
          ShardingHelp());
ABSL_FLAG(bool, return_host_memory, memprofd::SessionOptions().return_host_memory,
          "keep the process's resident set near its tensors' bytes: heap blocks of "
          "128 KiB or more mapped on their own and given back when freed, free heap "
          "pages returned after each piece of work (false: glibc's defaults, faster CPU "
          "steps, RSS up to several times the allocator's bytes)");
ABSL_FLAG(int32_t, bulk_nice, memprofd::SessionOptions().bulk_nice,
          "nice increment (0..19, over the process's) of the daemon's bulk work: the "
          "training's threads (the "
          "owner thread, its intra-op pool, the offloader's and snapshot writers' "
          "threads) and the memory-history dump builder; above 0 the gRPC and metrics "
          "threads, which keep the process's, answer ahead of a training that fills "
          "the cores");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace {

// Signals reach a dedicated thread through a self-pipe: the handler only
// writes one byte (async-signal-safe); gRPC's Shutdown must never run in a
// handler. Blocking the signals instead is not enough: OpenBLAS and OpenMP
// start threads before main(), and any of them could take the signal.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char byte = static_cast<char>(sig);
  ssize_t unused = write(g_signal_pipe[1], &byte, 1);
  (void)unused;
}

void InstallSignalHandlers() {
  if (pipe(g_signal_pipe) != 0) return;
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A write past RLIMIT_FSIZE must fail that snapshot (EFBIG, reported as
  // RESOURCE_EXHAUSTED), not kill the daemon.
  signal(SIGXFSZ, SIG_IGN);
  // A client that disconnects mid-write must not kill it either.
  signal(SIGPIPE, SIG_IGN);
}

// Every --data_root given: absl keeps only the last of a repeated flag.
std::vector<std::string> DataRoots(int argc, char** argv) {
  std::vector<std::string> roots;
  auto add = [&roots](absl::string_view list) {
    for (absl::string_view r : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      roots.emplace_back(r);
    }
  };
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    for (absl::string_view prefix : {"--data_root=", "-data_root="}) {
      if (absl::StartsWith(arg, prefix)) add(arg.substr(prefix.size()));
    }
    if ((arg == "--data_root" || arg == "-data_root") && i + 1 < argc) add(argv[++i]);
  }
  return roots;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "memprofd: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "memprofd: a training daemon that knows where every byte of memory goes.\n"
      "Usage: memprofd [--listen=127.0.0.1:50051] [--metrics_listen=127.0.0.1:9464] ...");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return Fail(absl::StrCat("unexpected argument '", rest[1],
                             "': memprofd takes only --flags (see --help)"));
  }
  memprofd::LogLevel level;
  if (!memprofd::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return Fail(absl::StrCat("bad --log_level='", absl::GetFlag(FLAGS_log_level),
                             "': write debug, info, warning or error"));
  }
  memprofd::SetLogLevel(level);

  // Rank and world from the launcher's environment (torchrun, Kubeflow, a
  // StatefulSet); none is a single process.
  absl::StatusOr<memprofd::WorldSpec> world =
      memprofd::ReadWorldSpec(memprofd::ProcessEnvironment());
  if (!world.ok()) return Fail(std::string(world.status().message()));
  // Ranks that share a host must not share ports or files: "{rank}" in these
  // flags becomes this rank's number.
  auto per_rank = [&world](const std::string& flag) {
    return memprofd::ExpandRankPlaceholders(flag, *world);
  };
  memprofd::ServerOptions options;
  options.listen = per_rank(absl::GetFlag(FLAGS_listen));
  options.metrics_listen = per_rank(absl::GetFlag(FLAGS_metrics_listen));
  options.port_file = per_rank(absl::GetFlag(FLAGS_port_file));
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  memprofd::SessionOptions& session = options.session;
  session.device = absl::GetFlag(FLAGS_device);
  session.model = absl::GetFlag(FLAGS_model);
  session.model_seed = absl::GetFlag(FLAGS_model_seed);
  session.device_memory_limit_bytes = absl::GetFlag(FLAGS_device_memory_limit);
  session.snapshot_root = absl::GetFlag(FLAGS_snapshot_root);
  session.data_roots = DataRoots(argc, argv);
  session.max_data_file_bytes = absl::GetFlag(FLAGS_max_data_file_bytes);
  session.keep_last = absl::GetFlag(FLAGS_keep_last);
  session.snapshot_every_steps = absl::GetFlag(FLAGS_snapshot_every_steps);
  session.snapshot_staging_bytes = absl::GetFlag(FLAGS_snapshot_staging_bytes);
  session.report_dir = per_rank(absl::GetFlag(FLAGS_report_dir));
  session.peak_file = per_rank(absl::GetFlag(FLAGS_peak_file));
  session.world = *world;
  const double collective_timeout = absl::GetFlag(FLAGS_collective_timeout_seconds);
  // absl::Seconds would make NaN an infinite timeout.
  if (std::isnan(collective_timeout)) {
    return Fail("--collective_timeout_seconds is not a number: give seconds > 0");
  }
  session.collective_timeout = absl::Seconds(collective_timeout);
  const double max_plan_seconds = absl::GetFlag(FLAGS_max_plan_seconds);
  if (std::isnan(max_plan_seconds)) {
    return Fail("--max_plan_seconds is not a number: give seconds > 0");
  }
  session.max_plan_time = absl::Seconds(max_plan_seconds);
  absl::StatusOr<memprofd::Sharding> sharding =
      memprofd::ParseSharding(absl::GetFlag(FLAGS_sharding));
  if (!sharding.ok()) {
    return Fail(absl::StrCat("--sharding: ", sharding.status().message()));
  }
  session.sharding = *sharding;
  session.bulk_nice = absl::GetFlag(FLAGS_bulk_nice);
  session.return_host_memory = absl::GetFlag(FLAGS_return_host_memory);
  session.refuse_unfit_steps = absl::GetFlag(FLAGS_refuse_unfit_steps);
  options.snapshot_on_shutdown = absl::GetFlag(FLAGS_snapshot_on_shutdown);
  absl::StatusOr<memprofd::snapshot::SnapshotKind> auto_kind =
      memprofd::snapshot::ParseSnapshotKind(absl::GetFlag(FLAGS_auto_snapshot_kind));
  if (!auto_kind.ok()) {
    return Fail(absl::StrCat("--auto_snapshot_kind: ", auto_kind.status().message()));
  }
  session.auto_snapshot_kind = *auto_kind;
  session.resume = absl::GetFlag(FLAGS_resume);
  memprofd::offload::OffloadOptions& offload = session.offload;
  // Every field of offload_fields.h has a flag (its DAEMON_FLAG): the defaults
  // a request's offload options are merged over. "auto" leaves the target to
  // the compute device.
  session.offload_target_auto = absl::GetFlag(FLAGS_offload_target) == "auto";
#define MEMPROFD_OFFLOAD_DEFAULT_FROM_FLAG_(name, type, cli_flag, flag)       \
  if (absl::Status s =                                                        \
          OffloadDefaultFromFlag(absl::GetFlag(FLAGS_##flag), &offload.name); \
      !s.ok()) {                                                              \
    return Fail(absl::StrCat("--" #flag ": ", s.message()));                  \
  }
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_DEFAULT_FROM_FLAG_)
#undef MEMPROFD_OFFLOAD_DEFAULT_FROM_FLAG_
  offload.spill_dir = per_rank(absl::GetFlag(FLAGS_spill_dir));
  offload.host_limit_bytes = absl::GetFlag(FLAGS_host_limit_bytes);
  if (absl::Status s = memprofd::ValidateSessionOptions(session); !s.ok()) {
    return Fail(absl::StrCat("bad flags: ", memprofd::MessageWithFlag(s)));
  }
  if (!world->distributed() && session.sharding != memprofd::Sharding::kNone) {
    memprofd::LogWarning(
        absl::StrCat("--sharding=", memprofd::ShardingName(session.sharding),
                     " has no effect in a single process: one rank keeps all the "
                     "training state"));
  }

  const double drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (!(drain_seconds > 0)) return Fail("--drain_seconds must be positive");
  // The process's memory accounting and offload engine, installed once,
  // before any tensor of the model exists.
  absl::StatusOr<memprofd::Runtime*> runtime = memprofd::Runtime::Install();
  if (!runtime.ok()) {
    return Fail(absl::StrCat("cannot start: ", runtime.status().message()));
  }
  InstallSignalHandlers();
  memprofd::Server server(options, **runtime);
  // The signal thread runs from before Start: a signal while the daemon
  // starts (a rank waiting at the rendezvous for up to
  // --collective_timeout_seconds, a model loading) exits at once, since
  // nothing has been started that a drain would keep.
  enum class Stage { kStarting, kServing, kStartFailed };
  std::atomic<Stage> stage{Stage::kStarting};
  std::thread signal_thread([&server, &stage, drain_seconds] {
    memprofd::NameThisThread("mpd-signals");
    char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) != 1) sig = 0;
    if (stage.load() == Stage::kStartFailed) return;
    if (sig != 0 && stage.load() == Stage::kStarting) {
      memprofd::LogInfo(absl::StrFormat(
          "received signal %d while starting (joining the run or loading the model): "
          "exiting now; nothing was started",
          static_cast<int>(sig)));
      _exit(0);
    }
    if (sig != 0) {
      memprofd::LogInfo(absl::StrFormat(
          "received signal %d; draining and shutting down (at most %.1f s; a second "
          "signal exits at once)",
          static_cast<int>(sig), drain_seconds));
      // The drain's deadline: whatever still runs then (a step between
      // micro-batches, the shutdown snapshot) is abandoned. A snapshot is
      // published by a rename only when complete, so none is half-written.
      std::thread([drain_seconds] {
        pollfd p{g_signal_pipe[0], POLLIN, 0};
        const int ready =
            poll(&p, 1, static_cast<int>(std::min(drain_seconds, 86400.0) * 1000));
        char next = 0;
        if (ready > 0 && read(g_signal_pipe[0], &next, 1) == 1 && next == 0) return;
        memprofd::LogError(ready > 0 ? "second signal: exiting now, abandoning the drain"
                                     : "drain deadline passed: exiting now, abandoning "
                                       "the work still running");
        _exit(1);
      }).detach();
    }
    server.Shutdown();
  });
  auto wake_signal_thread = [] {
    const char wake = 0;
    ssize_t unused = write(g_signal_pipe[1], &wake, 1);
    (void)unused;
  };
  if (absl::Status s = server.Start(); !s.ok()) {
    stage.store(Stage::kStartFailed);
    wake_signal_thread();
    signal_thread.join();
    return Fail(absl::StrCat("cannot start: ", memprofd::MessageWithFlag(s)));
  }
  stage.store(Stage::kServing);
  server.Wait();
  // Wakes the signal thread when Shutdown came from elsewhere.
  wake_signal_thread();
  signal_thread.join();
  const int exit_code = server.exit_code();
  memprofd::LogInfo(exit_code == 0 ? "stopped"
                                   : "stopped: the data-parallel run is broken; exiting "
                                     "non-zero so that every rank is restarted");
  return exit_code;
}
