// memprofctl: the command-line client of memprofd.
//
//   memprofctl [flags] <command> [args] [flags]
//
// Flags (client/flags.cc) may stand before or after the command. Exit codes:
// see client/cli.h.

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/client.h"
#include "client/flags.h"

int main(int argc, char** argv) {
  using namespace memprofd::cli;
  absl::SetProgramUsageMessage("memprofctl: the command-line client of memprofd");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  NoteGivenFlags(argc, argv);
  if (positional.size() < 2) return Usage("no command given");
  const std::string command = positional[1];
  Args args(positional.begin() + 2, positional.end());

  static const std::map<std::string, std::function<int(const Context&, const Args&)>>
      kCommands = {{"status", StatusCommand},
                   {"health", HealthCommand},
                   {"operations", OperationsCommand},
                   {"load", LoadCommand},
                   {"model", ModelCommand},
                   {"train", TrainCommand},
                   {"snapshot", SnapshotCommand},
                   {"snapshots", SnapshotsCommand},
                   {"memory", MemoryCommand},
                   {"evaluate", EvaluateCommand},
                   {"plan", PlanCommand}};
  auto it = kCommands.find(command);
  if (it == kCommands.end())
    return Usage(absl::StrCat("unknown command '", command, "'"));

  memprofd::ClientOptions options;
  options.addr = absl::GetFlag(FLAGS_addr);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  auto client = memprofd::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "memprofctl: %s\n",
                 std::string(client.status().message()).c_str());
    return kExitUsage;
  }
  Context c;
  c.client = client->get();
  c.json = absl::GetFlag(FLAGS_json);
  c.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  return it->second(c, args);
}
