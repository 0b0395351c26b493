#include "core/memory/memory_viz.h"

#include <ATen/ATen.h>

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/phase.h"
#include "core/memory/cuda_stats.h"
#include "core/memory/pickle_writer.h"
#include "core/memory/recorder.h"
#include "gtest/gtest.h"
#include "tests/memory/test_util.h"
#include "tests/testing/command.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace memory {
namespace {

using ::memprofd::testing::RunPython;
using ::memprofd::testing::SourcePath;
using ::memprofd::testing::TempDir;

// Runs check_memory_viz.py on `pickle` (with `flags`, e.g. "--torch"); fails
// the test on a bad exit.
std::string CheckViz(const std::string& pickle, const std::string& name,
                     const std::string& flags = "") {
  const TempDir dir;
  std::vector<std::string> args = {SourcePath("tests/memory/check_memory_viz.py"),
                                   dir.WriteFile(name, pickle)};
  if (!flags.empty()) args.push_back(flags);
  std::string out;
  EXPECT_EQ(RunPython(args, &out), 0) << out;
  return out;
}

// The integer after "key": in the checker's JSON summary, -1 when absent.
int64_t Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + key + "\": (-?[0-9]+)"))) {
    return std::stoll(m[1]);
  }
  return -1;
}

TEST(PickleWriterTest, PythonLoadsEveryValueKindWithoutTorch) {
  PickleWriter w;
  w.BeginDict();
  w.Key("ints");
  w.BeginList();
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{65535},
                    int64_t{65536}, int64_t{-1}, int64_t{INT32_MIN}, int64_t{INT32_MAX},
                    int64_t{2147483648}, int64_t{-2147483649}, INT64_MAX, INT64_MIN}) {
    w.Int(v);
  }
  w.UInt(UINT64_MAX);
  w.UInt(0x7f1234567890);
  for (int64_t v : {128, 32768, 8388608, -129, -128, 2147483647}) w.Int(v);
  w.EndList();
  w.Key("floats");
  w.BeginList();
  for (double v : {0.0, 1.5, -2.25, 1e300}) w.Float(v);
  w.EndList();
  w.Key("strs");
  w.BeginList();
  w.Str("");
  w.Str("h\xc3\xa9llo \xe2\x9c\x93");
  w.Str(std::string(300, 'a'));
  w.EndList();
  w.Key("consts");
  w.BeginList();
  w.Bool(true);
  w.Bool(false);
  w.None();
  w.EndList();
  w.Key("pair");
  w.IntPair(0, 7);
  w.Key("long_list");
  w.BeginList();
  for (int i = 0; i < 2500; ++i) w.Int(i);
  w.EndList();
  w.Key("big_dict");
  w.BeginDict();
  for (int i = 0; i < 2100; ++i) {
    w.Key(absl::StrCat("k", i));
    w.Int(i);
  }
  w.EndDict();
  w.Key("shared");
  w.BeginList();
  w.BeginList();
  w.Int(1);
  w.EndList();
  const int64_t id = w.Remember();
  EXPECT_GT(id, 2100);  // past 255: LONG_BINPUT / LONG_BINGET
  w.Recall(id);
  w.InternedStr("k5");     // BINGET of an early key
  w.InternedStr("k2000");  // LONG_BINGET
  w.EndList();
  w.Key("nested");
  w.BeginDict();
  w.Key("a");
  w.BeginList();
  w.BeginDict();
  w.Key("b");
  w.BeginList();
  w.EndList();
  w.EndDict();
  w.BeginDict();
  w.EndDict();
  w.EndList();
  w.Key("empty");
  w.BeginList();
  w.EndList();
  w.EndDict();  // nested
  w.EndDict();
  const std::string bytes = w.Finish();
  ASSERT_FALSE(bytes.empty());
  const TempDir dir;
  std::string out;
  EXPECT_EQ(RunPython({SourcePath("tests/memory/check_pickle_values.py"),
                       dir.WriteFile("values.pkl", bytes)},
                      &out),
            0)
      << out;
  EXPECT_EQ(out, "OK\n");
}

TEST(PickleWriterTest, UnbalancedContainersYieldNothing) {
  PickleWriter w;
  w.BeginDict();
  w.Key("a");
  EXPECT_EQ(w.Finish(), "");
  w.BeginList();
  w.EndDict();
  EXPECT_EQ(w.Finish(), "");
  w.BeginList();
  w.EndList();
  EXPECT_EQ(w.Finish(), std::string("\x80\x02]."));
}

// Found by fuzz/pickle_fuzz: a string that is not valid UTF-8 (a module or
// op name, a path) was written as it came, and Python's pickle.load refused
// the whole dump with UnicodeDecodeError.
TEST(PickleWriterTest, InvalidUtf8IsWrittenAsReplacementCharacters) {
  PickleWriter w;
  w.BeginList();
  w.Str("ok \xc3\xa9");
  w.Str("bad \xff\xe2\x82 end");
  w.InternedStr("k\xc3");
  w.InternedStr("k\xc3");
  w.EndList();
  const std::string bytes = w.Finish();
  ASSERT_FALSE(bytes.empty());
  const TempDir dir;
  std::string out;
  EXPECT_EQ(RunPython({"-c",
                       "import pickle, sys; "
                       "print(ascii(pickle.load(open(sys.argv[1], 'rb'))))",
                       dir.WriteFile("utf8.pkl", bytes)},
                      &out),
            0)
      << out;
  EXPECT_EQ(out,
            "['ok \\xe9', 'bad \\ufffd\\ufffd\\ufffd end', 'k\\ufffd', "
            "'k\\ufffd']\n");
}

// CUDA devices a captured dump lists before the CPU (the CPU's device
// number in the dump).
int CudaDevicesInDump() {
#ifdef MEMPROFD_WITH_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

TEST(MemoryVizTest, RecordedStepDumpsAViewerReadableSnapshot) {
  EnsureAccountingInstalled();
  MemoryRecorder& r = MemoryRecorder::Global();
  at::Tensor before = at::empty({777}, at::kByte);       // live throughout
  at::Tensor freed_later = at::empty({333}, at::kByte);  // its alloc predates the trace
  r.ClearHistory();
  ASSERT_TRUE(r.StartRecording(100000).ok());
  at::Tensor b, c;
  BeginStep(5);
  {
    PhaseScope fwd(Phase::kForward);
    at::Tensor a = at::empty({1000}, at::kByte);
    b = at::empty({2000}, at::kByte);
    PhaseScope bwd(Phase::kBackward);
    a.reset();
    c = at::empty({300}, at::kByte);
    freed_later.reset();
  }
  EndStep(5);
  const std::string pickle = CaptureMemoryVizPickle(MemoryRecorder::Global());
  const int64_t current = r.CurrentBytes(kCpuDevice);
  r.StopRecording();
  r.ClearHistory();

  const std::string summary = CheckViz(pickle, "step.pkl", "");
  // The CPU comes after the CUDA devices (none on a CPU-only build or host).
  const int cpu = CudaDevicesInDump();
  EXPECT_EQ(Field(summary, "devices"), cpu + 1) << summary;
  // Recording started with a synthetic alloc for every block alive then
  // (`before`, `freed_later` and the rest of the process's), so no free is
  // unmatched: nothing alive shows as a frameless ghost.
  EXPECT_GE(Field(summary, "allocs"), 3 + 2) << summary;
  EXPECT_EQ(Field(summary, "frees"), 2) << summary;
  EXPECT_EQ(Field(summary, "unmatched_frees"), 0) << summary;
  EXPECT_EQ(Field(summary, "open_allocs"), Field(summary, "allocs") - 2) << summary;
  EXPECT_EQ(Field(summary, std::to_string(cpu)), current) << summary;  // live CPU bytes
  EXPECT_EQ(Field(summary, "cpu_reserved_minus_live"), 0) << summary;
}

TEST(MemoryVizTest, TorchsMemoryVizHelpersAcceptTheDump) {
  EnsureAccountingInstalled();
  MemoryRecorder& r = MemoryRecorder::Global();
  ASSERT_TRUE(r.StartRecording(1000).ok());
  at::Tensor keep = at::randn({32, 32});
  { at::Tensor tmp = at::matmul(keep, keep); }
  const std::string pickle = CaptureMemoryVizPickle(MemoryRecorder::Global());
  r.StopRecording();
  r.ClearHistory();
  std::string out;
  ASSERT_EQ(RunPython({"-c", "import torch.cuda._memory_viz"}, &out), 0)
      << "the venv's torch has no torch.cuda._memory_viz (run deploy/install-deps.sh): "
      << out;
  const std::string summary = CheckViz(pickle, "torch.pkl", "--torch");
  EXPECT_NE(summary.find("\"torch_ok\": true"), std::string::npos) << summary;
}

TEST(MemoryVizTest, CpuComesAfterCudaDevicesAndTheTraceWins) {
  MemoryVizInput in;
  in.num_cuda_devices = 2;
  VizSegment seg;
  seg.device = 1;
  seg.address = 0x7000000000;
  seg.total_size = 4096;
  seg.blocks = {{1024, 1000, VizBlockState::kActiveAllocated, std::nullopt},
                {3072, 0, VizBlockState::kInactive, std::nullopt}};
  in.cuda.segments.push_back(seg);
  in.cuda.device_traces.resize(2);
  in.cuda.device_traces[1].push_back({VizAction::kAlloc, 0x7000000000, 1000, 0, {}});
  // Live according to the allocator but freed by the trace (a race): dropped.
  in.live_blocks.push_back({kCpuDevice, 0x10000, 64, {}});
  // Live and untouched by the trace.
  in.live_blocks.push_back({kCpuDevice, 0x20000, 128, {}});
  auto event = [](HistoryAction a, uint64_t addr, int64_t size) {
    HistoryEntry e;
    e.action = a;
    e.addr = addr;
    e.size = size;
    e.step = 3;
    e.phase = Phase::kBackward;
    return e;
  };
  in.history.push_back(event(HistoryAction::kFree, 0x10000, 64));
  // Allocated in the trace, missing from the live list (a race): added.
  in.history.push_back(event(HistoryAction::kAlloc, 0x30000, 256));
  // Allocated and freed within the trace: its segment comes and goes with it.
  in.history.push_back(event(HistoryAction::kAlloc, 0x7f0000000000, 512));
  in.history.push_back(event(HistoryAction::kFree, 0x7f0000000000, 512));
  const std::string summary = CheckViz(BuildMemoryVizPickle(in), "synthetic.pkl");
  EXPECT_EQ(Field(summary, "devices"), 3) << summary;  // cuda:0, cuda:1, cpu=2
  EXPECT_EQ(Field(summary, "segments"), 3) << summary;
  EXPECT_EQ(Field(summary, "2"), 128 + 256) << summary;  // cpu live bytes
  EXPECT_EQ(Field(summary, "1"), 1000) << summary;
  EXPECT_EQ(Field(summary, "unmatched_frees"), 1) << summary;
  EXPECT_EQ(Field(summary, "open_allocs"), 2) << summary;
}

TEST(MemoryVizTest, LargeHistoriesStayLoadable) {
  MemoryVizInput in;
  for (int i = 0; i < 6000; ++i) {
    HistoryEntry e;
    e.addr = 0x100000 + 4096 * static_cast<uint64_t>(i % 50);
    e.size = 4096;
    e.action = (i / 50) % 2 == 0 ? HistoryAction::kAlloc : HistoryAction::kFree;
    in.history.push_back(e);
  }
  const std::string summary = CheckViz(BuildMemoryVizPickle(in), "large.pkl");
  EXPECT_EQ(Field(summary, "allocs"), 3000) << summary;
  EXPECT_EQ(Field(summary, "frees"), 3000) << summary;
  EXPECT_EQ(Field(summary, "unmatched_frees"), 0) << summary;
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
