// core/ must build without gRPC, protobuf or Prometheus (DESIGN.md): no file
// under core/ may include their headers.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace {

TEST(LayeringTest, CoreIncludesNoServerDependencies) {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(MEMPROFD_SOURCE_DIR) / "core")) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".txt") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    ++files;
    for (const char* banned : {"<grpc", "\"grpc", "google/protobuf", "prometheus/",
                               "gRPC::", "protobuf::", "prometheus-cpp::"}) {
      EXPECT_EQ(s.find(banned), std::string::npos)
          << entry.path() << " mentions " << banned;
    }
  }
  EXPECT_GT(files, 5);
}

}  // namespace
