#ifndef MEMPROFD_TESTS_TESTING_TEMP_DIR_H_
#define MEMPROFD_TESTS_TESTING_TEMP_DIR_H_

// A fresh directory per test (or per fixture) that goes away with everything
// in it, so that tests neither collide (ctest runs them in parallel, and one
// test binary's cases in separate processes) nor leave files behind.

#include <string>

#include "absl/strings/string_view.h"

namespace memprofd {
namespace testing {

// A new, empty directory under gtest's temporary directory ($TEST_TMPDIR, else
// /tmp), named memprofd-test-XXXXXX, removed recursively on destruction.
// Thread-compatible; not copyable.
class TempDir {
 public:
  // Aborts the test binary when the directory cannot be created: no test
  // that needs one could run.
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Join(absl::string_view name) const;
  // Writes `bytes` to Join(name), replacing what was there, and returns that
  // path. Fails the running test (ADD_FAILURE) when the file cannot be
  // written.
  std::string WriteFile(absl::string_view name, absl::string_view bytes) const;

 private:
  std::string path_;
};

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_TEMP_DIR_H_
