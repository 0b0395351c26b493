// Snapshot throughput and peak memory against a raw sequential write
// (dd conv=fsync) and Debian's Python torch.save, side by side in one run.
//
// usage: snapshot_bench [--dir DIR] [--mib N] [--staging_mib N] [--repeat N]
// DIR (default: the build directory) must be on the filesystem to measure;
// N MiB (default 1024) of fp32 tensors in 32 tensors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/snapshot/writer.h"

namespace {

using memprofd::snapshot::SnapshotOptions;
using memprofd::snapshot::SnapshotWriter;
using memprofd::snapshot::TensorList;

int64_t StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      int64_t kb = 0;
      std::istringstream(line.substr(std::string(field).size())) >> kb;
      return kb;
    }
  }
  return -1;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Run(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (p != nullptr) ::pclose(p);
  return out;
}

int64_t ParseMaxRssKb(const std::string& time_output) {
  const std::string key = "Maximum resident set size (kbytes):";
  const size_t pos = time_output.find(key);
  if (pos == std::string::npos) return -1;
  return std::atoll(time_output.c_str() + pos + key.size());
}

struct Result {
  double seconds = 1e30;
  double peak_extra_mib = 0;
  double allocated_mib = 0;  // the writer's own accounting
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir = MEMPROFD_BINARY_DIR;
  int64_t mib = 1024, staging_mib = 64;
  int repeat = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--mib") mib = std::atoll(argv[i + 1]);
    if (flag == "--staging_mib") staging_mib = std::atoll(argv[i + 1]);
    if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
  }
  const std::string work = absl::StrCat(dir, "/snapshot_bench.", ::getpid());
  std::filesystem::create_directories(work);
  const int64_t bytes = mib << 20;
  const int64_t kTensors = 32;
  const int64_t per_tensor = bytes / 4 / kTensors;
  const int64_t cols = 1024;
  const int64_t rows = per_tensor / cols;

  std::cout << absl::StrFormat(
      "snapshot_bench: %d MiB fp32 state dict (%d tensors [%d, %d]), staging %d MiB, dir "
      "%s\n"
      "threads: at::get_num_threads()=%d OMP_NUM_THREADS=%s; best of %d runs\n",
      mib, kTensors, rows, cols, staging_mib, work, at::get_num_threads(),
      getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)", repeat);

  // The state dict the snapshots write; the Python child builds its own.
  TensorList state;
  at::manual_seed(0);
  for (int64_t i = 0; i < kTensors; ++i) {
    state.emplace_back(absl::StrCat("model.layers.", i, ".weight"),
                       at::rand({rows, cols}, at::kFloat));
  }

  // 1. memprofd SnapshotWriter, as stored (fp32, zero copy) or converted to
  // bf16 (through the staging buffer).
  auto run_snapshot = [&](Result* result, memprofd::snapshot::SnapshotDtype dtype) {
    SnapshotOptions o;
    o.staging_bytes = staging_mib << 20;
    o.max_shard_size = int64_t{5'000'000'000};
    o.dtype = dtype;
    const int64_t rss_before = StatusKb("VmRSS:");
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM
    const auto start = std::chrono::steady_clock::now();
    auto m = SnapshotWriter(work).Write("snap", state, "{}", o);
    const double s = Seconds(start);
    if (!m.ok()) {
      std::cerr << "snapshot failed: " << m.status() << "\n";
      return false;
    }
    const int64_t hwm = StatusKb("VmHWM:");
    result->seconds = std::min(result->seconds, s);
    result->peak_extra_mib =
        std::max(result->peak_extra_mib, (hwm - rss_before) / 1024.0);
    result->allocated_mib = m->peak_extra_host_bytes / 1048576.0;
    std::filesystem::remove_all(m->directory);
    return true;
  };

  // 2. dd conv=fsync of the same byte count (64 MiB blocks).
  auto run_dd = [&](Result* result) {
    const std::string out = work + "/dd.bin";
    const auto start = std::chrono::steady_clock::now();
    const std::string text =
        Run(absl::StrCat("/usr/bin/time -v dd if=/dev/zero of=", out,
                         " bs=64M count=", bytes / (64 << 20), " conv=fsync"));
    const double s = Seconds(start);
    const int64_t rss = ParseMaxRssKb(text);
    std::filesystem::remove(out);
    if (rss < 0) {
      std::cerr << "dd failed: " << text << "\n";
      return false;
    }
    result->seconds = std::min(result->seconds, s);
    result->peak_extra_mib = rss / 1024.0;
    return true;
  };

  // 3. Debian's Python torch.save of a same-size state dict, fsynced.
  const std::string script = absl::StrCat(
      "import os, sys, time, torch\n"
      "torch.manual_seed(0)\n"
      "sd = {'model.layers.%d.weight' % i: torch.rand(",
      rows, ", ", cols, ") for i in range(", kTensors,
      ")}\n"
      "def kb(field):\n"
      "    for l in open('/proc/self/status'):\n"
      "        if l.startswith(field): return int(l.split()[1])\n"
      "before = kb('VmRSS:')\n"
      "open('/proc/self/clear_refs', 'w').write('5')\n"
      "t = time.monotonic()\n"
      "with open(sys.argv[1], 'wb') as f:\n"
      "    torch.save(sd, f)\n"
      "    f.flush(); os.fsync(f.fileno())\n"
      "dt = time.monotonic() - t\n"
      "print('RESULT', dt, kb('VmHWM:') - before)\n");
  std::ofstream(work + "/save.py") << script;
  auto run_torch_save = [&](Result* result) {
    const std::string out = work + "/torch.pt";
    const std::string text =
        Run(absl::StrCat("/usr/bin/python3 ", work, "/save.py ", out));
    std::filesystem::remove(out);
    const size_t pos = text.find("RESULT ");
    if (pos == std::string::npos) {
      std::cerr << "torch.save failed: " << text << "\n";
      return false;
    }
    double s = 0, extra_kb = 0;
    std::istringstream(text.substr(pos + 7)) >> s >> extra_kb;
    result->seconds = std::min(result->seconds, s);
    result->peak_extra_mib = std::max(result->peak_extra_mib, extra_kb / 1024.0);
    return true;
  };

  // Interleaved, so that load from other processes hits all alike.
  Result snap, snap_bf16, dd, ts;
  for (int r = 0; r < repeat; ++r) {
    if (!run_snapshot(&snap, memprofd::snapshot::SnapshotDtype::kKeep) || !run_dd(&dd) ||
        !run_snapshot(&snap_bf16, memprofd::snapshot::SnapshotDtype::kBFloat16) ||
        !run_torch_save(&ts)) {
      std::filesystem::remove_all(work);
      return 1;
    }
  }
  std::filesystem::remove_all(work);

  const double mb = bytes / 1e6;
  auto row = [&](const char* name, const Result& r, const char* note) {
    std::cout << absl::StrFormat(
        "%-28s %8.3f s %9.1f MB/s  peak extra RSS %8.1f MiB  (%s)\n", name, r.seconds,
        mb / r.seconds, r.peak_extra_mib, note);
  };
  row("memprofd SnapshotWriter", snap,
      absl::StrFormat("over the resident state dict; writer allocated %.0f MiB",
                      snap.allocated_mib)
          .c_str());
  std::cout << absl::StrFormat(
      "%-28s %8.3f s %9.1f MB/s  peak extra RSS %8.1f MiB  (%s)\n",
      "memprofd SnapshotWriter bf16", snap_bf16.seconds, mb / snap_bf16.seconds,
      snap_bf16.peak_extra_mib,
      absl::StrFormat(
          "MB/s of fp32 input; writes half the bytes; staging allocated %.0f MiB",
          snap_bf16.allocated_mib));
  row("dd bs=64M conv=fsync", dd, "whole dd process");
  row("python torch.save + fsync", ts, "over the resident state dict");
  std::cout << absl::StrFormat(
      "ratios: snapshot/dd throughput %.2fx (target >= 0.9x); snapshot/torch.save "
      "throughput %.2fx; peak extra RSS snapshot/torch.save %.2fx\n",
      dd.seconds / snap.seconds, ts.seconds / snap.seconds,
      snap.peak_extra_mib / std::max(ts.peak_extra_mib, 1e-9));
  return 0;
}
