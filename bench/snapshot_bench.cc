// Snapshot throughput and peak memory against a raw sequential write of the
// same byte count (dd bs=64M conv=fsync) and Debian's Python torch.save of a
// state dict with the same names and shapes, side by side in one run, for
// the "small" preset and a synthetic fp32 state dict of --mib MiB.
//
// usage: snapshot_bench [--dir DIR] [--mib N] [--staging_mib N] [--repeat N]
// DIR (default: the build directory) is where everything is written: put it
// on the filesystem to measure. Runs are interleaved; the best is shown.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/snapshot/writer.h"

namespace {

using memprofd::snapshot::SnapshotDtype;
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

// torch.save of random tensors with the names and shapes in argv[2] (a file
// of "name dim dim ..." lines) into argv[1], fsynced; prints seconds and the
// peak RSS over the resident state dict.
constexpr char kTorchSaveScript[] = R"(import os, sys, time, torch
torch.manual_seed(0)
sd = {}
for line in open(sys.argv[2]):
    parts = line.split()
    sd[parts[0]] = torch.rand([int(d) for d in parts[1:]])
def kb(field):
    for l in open('/proc/self/status'):
        if l.startswith(field): return int(l.split()[1])
before = kb('VmRSS:')
open('/proc/self/clear_refs', 'w').write('5')
t = time.monotonic()
with open(sys.argv[1], 'wb') as f:
    torch.save(sd, f)
    f.flush(); os.fsync(f.fileno())
print('RESULT', time.monotonic() - t, kb('VmHWM:') - before)
)";

class Bench {
 public:
  Bench(std::string work, int64_t staging_bytes, int repeat)
      : work_(std::move(work)), staging_bytes_(staging_bytes), repeat_(repeat) {
    std::ofstream(work_ + "/save.py") << kTorchSaveScript;
  }

  bool Compare(const std::string& label, const TensorList& state) {
    int64_t bytes = 0;
    {
      std::ofstream shapes(work_ + "/shapes.txt");
      for (const auto& [name, t] : state) {
        bytes += static_cast<int64_t>(t.nbytes());
        shapes << name;
        for (const int64_t d : t.sizes()) shapes << " " << d;
        shapes << "\n";
      }
    }
    Result snap, snap_bf16, dd, ts;
    for (int r = 0; r < repeat_; ++r) {
      if (!Snapshot(state, SnapshotDtype::kKeep, &snap) || !Dd(bytes, &dd) ||
          !Snapshot(state, SnapshotDtype::kBFloat16, &snap_bf16) || !TorchSave(&ts)) {
        return false;
      }
    }
    const double mb = bytes / 1e6;
    std::cout << absl::StrFormat("\n--- %s: %d tensors, %.1f MB fp32\n", label,
                                 state.size(), mb);
    auto row = [&](const char* name, const Result& r, const std::string& note) {
      std::cout << absl::StrFormat(
          "%-30s %8.3f s %9.1f MB/s  peak extra RSS %7.1f MiB  (%s)\n", name, r.seconds,
          mb / r.seconds, r.peak_extra_mib, note);
    };
    row("memprofd snapshot (keep fp32)", snap,
        absl::StrFormat("writer allocated %.0f MiB", snap.allocated_mib));
    row("memprofd snapshot --dtype bf16", snap_bf16,
        absl::StrFormat("MB/s of fp32 input, writes half; staging allocated %.0f MiB",
                        snap_bf16.allocated_mib));
    row("dd bs=64M conv=fsync", dd, "RSS of the whole dd process");
    row("python torch.save + fsync", ts, "RSS over its resident state dict");
    std::cout << absl::StrFormat(
        "ratios: snapshot/dd throughput %.2fx (target >= 0.9x); snapshot/torch.save "
        "throughput %.2fx; peak extra RSS snapshot - torch.save %+.1f MiB\n",
        dd.seconds / snap.seconds, ts.seconds / snap.seconds,
        snap.peak_extra_mib - ts.peak_extra_mib);
    return true;
  }

 private:
  bool Snapshot(const TensorList& state, SnapshotDtype dtype, Result* result) {
    SnapshotOptions o;
    o.staging_bytes = staging_bytes_;
    o.dtype = dtype;
    const int64_t rss_before = StatusKb("VmRSS:");
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM
    const auto start = std::chrono::steady_clock::now();
    auto m = SnapshotWriter(work_).Write("snap", state, "{}", o);
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
  }

  bool Dd(int64_t bytes, Result* result) {
    const std::string out = work_ + "/dd.bin";
    const auto start = std::chrono::steady_clock::now();
    const std::string text =
        Run(absl::StrCat("/usr/bin/time -v dd if=/dev/zero of=", out,
                         " bs=64M count=", bytes, " iflag=count_bytes conv=fsync"));
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
  }

  bool TorchSave(Result* result) {
    const std::string out = work_ + "/torch.pt";
    const std::string text = Run(absl::StrCat(MEMPROFD_PYTHON " ", work_, "/save.py ",
                                              out, " ", work_, "/shapes.txt"));
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
  }

  const std::string work_;
  const int64_t staging_bytes_;
  const int repeat_;
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
  std::cout << absl::StrFormat(
      "snapshot_bench: staging %d MiB, dir %s, best of %d interleaved runs\n"
      "threads: at::get_num_threads()=%d OMP_NUM_THREADS=%s\n",
      staging_mib, work, repeat, at::get_num_threads(),
      getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
  Bench bench(work, staging_mib << 20, repeat);
  bool ok = true;

  // The "small" preset's state dict as save_pretrained sees it (tied head
  // dropped: compare the same tensors everywhere).
  auto config = memprofd::LlamaConfig::Preset("small");
  auto model =
      config.ok()
          ? memprofd::LlamaModel::Create(*config, 0)
          : absl::StatusOr<std::unique_ptr<memprofd::LlamaModel>>(config.status());
  if (model.ok()) {
    TensorList state;
    for (auto& [name, t] : (*model)->NamedParameters()) {
      if (!(config->tie_word_embeddings && name == "lm_head.weight")) {
        state.emplace_back(name, t);
      }
    }
    ok = bench.Compare("preset small", state) && ok;
  } else {
    std::cerr << "small preset unavailable: " << model.status() << "\n";
  }
  model = absl::UnavailableError("freed");

  {
    const int64_t kTensors = 32, cols = 1024;
    const int64_t rows = (mib << 20) / 4 / kTensors / cols;
    TensorList state;
    at::manual_seed(0);
    for (int64_t i = 0; i < kTensors; ++i) {
      state.emplace_back(absl::StrCat("model.layers.", i, ".weight"),
                         at::rand({rows, cols}, at::kFloat));
    }
    ok = bench.Compare(absl::StrCat("synthetic ", mib, " MiB"), state) && ok;
  }
  std::filesystem::remove_all(work);
  return ok ? 0 : 1;
}
