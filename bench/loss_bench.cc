// The fused chunked loss at a real vocabulary: a training step's peak
// allocated bytes and step time with the LM head and cross-entropy fused and
// chunked (automatic chunk size, both gradients made in forward:
// core/train/chunked_loss.h) and unchunked (loss_chunk_tokens -1, the
// [tokens x vocab] logits materialized), side by side with
// transformers' LlamaForCausalLM and its own eager loss on the same config
// (bench/loss_bench_torch.py).
//
// The model is Llama 3's vocabulary (128,256) on a small body (hidden 256,
// intermediate 1024, 2 layers, 4 heads over 2 key-value heads, tied head),
// so that the head dominates as it does in a real 1B model; 4 x 1024 tokens a
// step, float32, sdpa attention, AdamW.
//
// Peaks: memprofd's own recorder (the counting CPU allocator, every
// allocation and free): the device peak during one step (ResetPeak before
// it) minus the bytes held when it began (weights and AdamW state, after a
// warm-up step), and the absolute peak. transformers': PyTorch's profiler
// (profile_memory=True) around one step, the largest "Total Allocated" of its
// CPU memory events, which is the same "peak above the step's start"
// (loss_bench_torch.py says why). Times: the best of --steps steps after one
// warm-up, the same thread count on both sides.
//
// Usage: loss_bench [--vocab 128256] [--hidden 256] [--layers 2] [--batch 4]
//                   [--seq 1024] [--steps 2] [--threads N] [--torch 1]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/train/chunked_loss.h"
#include "core/train/trainer.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

struct Args {
  int64_t vocab = 128256;
  int64_t hidden = 256;
  int64_t layers = 2;
  int64_t batch = 4;
  int64_t seq = 1024;
  int64_t steps = 2;
  int64_t threads = 0;  // 0: LibTorch's default
  int64_t torch = 1;    // run the transformers side
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int64_t* target = flag == "--vocab"     ? &a->vocab
                      : flag == "--hidden"  ? &a->hidden
                      : flag == "--layers"  ? &a->layers
                      : flag == "--batch"   ? &a->batch
                      : flag == "--seq"     ? &a->seq
                      : flag == "--steps"   ? &a->steps
                      : flag == "--threads" ? &a->threads
                      : flag == "--torch"   ? &a->torch
                                            : nullptr;
    if (target == nullptr || !absl::SimpleAtoi(argv[i + 1], target) || *target < 0) {
      std::fprintf(stderr, "bad flag %s %s\n", argv[i], argv[i + 1]);
      return false;
    }
  }
  return (argc % 2) == 1;
}

LlamaConfig BenchConfig(const Args& a) {
  LlamaConfig c;
  c.vocab_size = a.vocab;
  c.hidden_size = a.hidden;
  c.intermediate_size = 4 * a.hidden;
  c.num_hidden_layers = a.layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = std::max<int64_t>(a.seq, 2048);
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  return c;
}

struct Figures {
  double step_seconds = 0;       // best step
  int64_t peak_above_start = 0;  // bytes over those held when the step began
  int64_t peak = 0;              // the recorder's device peak
  int64_t held = 0;              // bytes held between steps
  double loss = 0;
};

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// `steps` timed steps of a fresh model after one warm-up.
Figures BenchMemprofd(const Args& a, int64_t loss_chunk_tokens) {
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Create(BenchConfig(a), 0);
  if (!model.ok()) {
    std::fprintf(stderr, "model: %s\n", std::string(model.status().message()).c_str());
    std::exit(1);
  }
  Trainer trainer(model->get());
  TrainOptions o;
  o.steps = 1;
  o.batch_size = a.batch;
  o.seq_len = a.seq;
  o.learning_rate = 1e-4;
  o.loss_chunk_tokens = loss_chunk_tokens;
  o.data.kind = DataSpec::Kind::kInlineTokens;
  uint64_t x = 88172645463325252ull;  // xorshift: fixed tokens over the vocabulary
  for (int64_t i = 0; i < 4 * a.batch * a.seq; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    o.data.tokens.push_back(static_cast<int64_t>(x % static_cast<uint64_t>(a.vocab)));
  }
  Figures f;
  auto run = [&] {
    absl::StatusOr<TrainResult> r =
        CheckAndRun(trainer, o, Request([&](const StepReport& s) { f.loss = s.loss; }));
    if (!r.ok()) {
      std::fprintf(stderr, "step: %s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
  };
  run();  // warm-up: AdamW's state exists from here
  for (int64_t s = 0; s < a.steps; ++s) {
    recorder.ResetPeak();
    const int64_t before = recorder.CurrentBytes(memory::kCpuDevice);
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t peak = recorder.PeakBytes(memory::kCpuDevice);
    f.step_seconds = s == 0 ? seconds : std::min(f.step_seconds, seconds);
    f.peak = std::max(f.peak, peak);
    f.peak_above_start = std::max(f.peak_above_start, peak - before);
    f.held = before;
  }
  return f;
}

bool BenchTorch(const Args& a, Figures* f, std::string* versions) {
  char dir[] = "/tmp/loss_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) return false;
  std::ofstream(absl::StrCat(dir, "/config.json")) << BenchConfig(a).ToJson();
  const std::string cmd = absl::StrCat(
      MEMPROFD_PYTHON " " MEMPROFD_SOURCE_DIR "/bench/loss_bench_torch.py --config ", dir,
      " --batch ", a.batch, " --seq ", a.seq, " --steps ", a.steps, " --threads ",
      at::get_num_threads(), " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return false;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0) {
    std::fprintf(stderr, "failed: %s\n%s\n", cmd.c_str(), out.c_str());
    return false;
  }
  absl::StatusOr<Json> j = ParseJson(out);
  if (!j.ok() || !j->is_object()) {
    std::fprintf(stderr, "unexpected output: %s\n", out.c_str());
    return false;
  }
  f->step_seconds = (*j)["step_seconds"].get<double>();
  f->peak_above_start = (*j)["peak_above_start_bytes"].get<int64_t>();
  f->loss = (*j)["loss"].get<double>();
  *versions = absl::StrCat("torch ", (*j)["torch"].get<std::string>(), ", transformers ",
                           (*j)["transformers"].get<std::string>());
  return true;
}

int Main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: loss_bench [--vocab V] [--hidden H] [--layers L] [--batch B] "
                 "[--seq T] [--steps N] [--threads N] [--torch 0|1]\n");
    return 2;
  }
  if (!memory::InstallMemoryAccounting().ok()) return 1;
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  const int64_t tokens = a.batch * a.seq;
  const int64_t chunk = AutomaticLossChunkTokens(a.vocab, a.hidden);
  std::printf(
      "loss_bench: vocab %lld, hidden %lld, %lld layers, tied head, %lld x %lld tokens, "
      "float32, %d threads; automatic chunk %lld tokens (%.1f MiB of float32 logits, "
      "%lld chunks); whole logits %.1f MiB\n",
      static_cast<long long>(a.vocab), static_cast<long long>(a.hidden),
      static_cast<long long>(a.layers), static_cast<long long>(a.batch),
      static_cast<long long>(a.seq), at::get_num_threads(), static_cast<long long>(chunk),
      MiB(chunk * a.vocab * 4), static_cast<long long>((tokens + chunk - 1) / chunk),
      MiB(tokens * a.vocab * 4));
  const Figures off = BenchMemprofd(a, kLossChunkOff);
  const Figures on = BenchMemprofd(a, kLossChunkAutomatic);
  Figures hf;
  std::string versions;
  const bool have_torch = a.torch != 0 && BenchTorch(a, &hf, &versions);

  std::printf("%-26s %12s %16s %14s %10s\n", "", "s/step", "peak-start MiB", "peak MiB",
              "loss");
  std::printf("%-26s %12.3f %16.1f %14.1f %10.5f\n", "memprofd unchunked",
              off.step_seconds, MiB(off.peak_above_start), MiB(off.peak), off.loss);
  std::printf("%-26s %12.3f %16.1f %14.1f %10.5f\n", "memprofd chunked (auto)",
              on.step_seconds, MiB(on.peak_above_start), MiB(on.peak), on.loss);
  if (have_torch) {
    std::printf("%-26s %12.3f %16.1f %14s %10.5f\n", "transformers eager loss",
                hf.step_seconds, MiB(hf.peak_above_start), "-", hf.loss);
  }
  std::printf("held between steps (weights + AdamW): %.1f MiB\n", MiB(on.held));
  std::printf("chunked / unchunked: peak above start %.3f, peak %.3f, step time %.3f\n",
              static_cast<double>(on.peak_above_start) / off.peak_above_start,
              static_cast<double>(on.peak) / off.peak,
              on.step_seconds / off.step_seconds);
  if (have_torch) {
    std::printf("chunked / transformers: peak above start %.3f, step time %.3f (%s)\n",
                static_cast<double>(on.peak_above_start) / hf.peak_above_start,
                on.step_seconds / hf.step_seconds, versions.c_str());
  }
  std::printf("loss chunked vs unchunked: relative difference %.3g\n",
              std::abs(on.loss - off.loss) / off.loss);
  return 0;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) { return memprofd::Main(argc, argv); }
