#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

TempDir::TempDir() {
  // ::testing::TempDir() ends with a slash.
  std::string tmpl = absl::StrCat(::testing::TempDir(), "memprofd-test-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror(tmpl.c_str());
    std::abort();
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Join(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

std::string TempDir::WriteFile(absl::string_view name, absl::string_view bytes) const {
  const std::string path = Join(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) ADD_FAILURE() << "cannot write " << bytes.size() << " bytes to " << path;
  return path;
}

}  // namespace testing
}  // namespace memprofd
