#ifndef MEMPROFD_TESTS_TESTING_COMMAND_H_
#define MEMPROFD_TESTS_TESTING_COMMAND_H_

// Running other programs from a test: the shell, and the venv's Python, which
// runs the independent consumers (check_snapshot.py, check_memory_viz.py,
// torch.cuda._memory_viz) and the references (llama_reference.py) that the C++
// results are checked against. Thread-safe.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace memprofd {
namespace testing {

// Runs `command` through /bin/sh and waits for it. Returns its exit status,
// or -1 when it could not be started or was ended by a signal; *output gets
// its stdout and stderr, interleaved. Use it as
// `EXPECT_EQ(RunCommand(cmd, &out), 0) << out;`.
int RunCommand(const std::string& command, std::string* output);

// Runs the venv's interpreter (MEMPROFD_PYTHON: torch, transformers,
// safetensors, numpy) with `args`, each quoted for the shell, e.g.
// RunPython({SourcePath("tests/memory/check_memory_viz.py"), path}, &out) or
// RunPython({"-c", "import torch"}, &out). Returns as RunCommand.
int RunPython(const std::vector<std::string>& args, std::string* output);

// `relative` (e.g. "tests/model/llama_reference.py") in the source tree this
// build was configured from.
std::string SourcePath(absl::string_view relative);

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_COMMAND_H_
