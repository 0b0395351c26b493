// The layers of DESIGN.md, checked on the source text: core/ builds without
// gRPC, protobuf or Prometheus, and server/ reaches core through
// core::Session alone.
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace {

// Expects no file under `folder` (of the source tree) with one of
// `extensions`, other than those named in `exempt`, to contain any of
// `banned`; returns how many files it read.
int ExpectNoFileMentions(const char* folder,
                         std::initializer_list<const char*> extensions,
                         std::initializer_list<const char*> banned,
                         std::initializer_list<const char*> exempt = {}) {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(MEMPROFD_SOURCE_DIR) / folder)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    bool wanted = false;
    for (const char* e : extensions) wanted = wanted || ext == e;
    for (const char* e : exempt) wanted = wanted && entry.path().filename() != e;
    if (!wanted) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    ++files;
    for (const char* b : banned) {
      EXPECT_EQ(s.find(b), std::string::npos) << entry.path() << " mentions " << b;
    }
  }
  return files;
}

TEST(LayeringTest, CoreIncludesNoServerDependencies) {
  EXPECT_GT(ExpectNoFileMentions("core", {".h", ".cc", ".txt"},
                                 {"<grpc", "\"grpc", "google/protobuf", "prometheus/",
                                  "gRPC::", "protobuf::", "prometheus-cpp::"}),
            5);
}

// "One door": the server never reaches past the session into the memory
// recorder or the operation registry, nor reads the session's options back.
TEST(LayeringTest, ServerReachesCoreOnlyThroughTheSession) {
  EXPECT_GT(ExpectNoFileMentions("server", {".h", ".cc"},
                                 {"core/memory/recorder.h", "MemoryRecorder::",
                                  "->operations()", "OperationRegistry", "->options()"}),
            5);
}

// One status mapping: absl::Status becomes grpc::Status in grpc_status.cc
// alone, and operation results are typed (no std::any to cast; std::any_of
// is an algorithm, and allowed).
TEST(LayeringTest, OneStatusMappingAndTypedResults) {
  EXPECT_GT(ExpectNoFileMentions("server", {".h", ".cc"},
                                 {"grpc::Status(", "Status(StatusCode", "<any>",
                                  "std::any_cast", "std::any "},
                                 /*exempt=*/{"grpc_status.cc"}),
            5);
  EXPECT_GT(ExpectNoFileMentions("core", {".h", ".cc"},
                                 {"<any>", "std::any_cast", "std::any "}),
            5);
}

// The recorder is passed, not reached for: in core/, only the installer
// (the allocator hooks it installs, and what they call when an allocation
// fails) and the Runtime, which hands the recorder to the session and its
// parts, name the process's instance.
TEST(LayeringTest, OnlyTheInstallerAndTheRuntimeReachTheProcessRecorder) {
  EXPECT_GT(ExpectNoFileMentions("core", {".h", ".cc"}, {"MemoryRecorder::Global()"},
                                 /*exempt=*/
                                 {"recorder.h", "recorder.cc", "install.h", "install.cc",
                                  "cpu_allocator.h", "cpu_allocator.cc", "cuda_stats.cc",
                                  "oom_report.cc", "runtime.cc"}),
            5);
}

}  // namespace
