// load_client: bench/load.py's clients written in C++ (issue 15). Prints
// figures' raw material, is not a test.
//
//   load_client --addr 127.0.0.1:PORT --seconds S [--clients 64] [--interval S]
//       [--kinds GetStatus,GetMemoryStats,metrics,StreamStepReports,WatchOperation]
//       [--dump_every 16] [--operation_id ID] [--metrics_port P] [--label probe]
//
// Each client is a thread with a connection of its own (a local subchannel
// pool: 64 clients are 64 TCP connections, as 64 orchestrators would be). It
// makes the calls in --kinds in turn, the same calls, with the same pacing,
// as load.py's Python clients: closed loop (--interval 0) or one call every S
// seconds, the clients' first calls spread over one interval.
//
// Why a second client: on a 2-core machine the load generator shares the
// cores with the daemon and its training. A Python client spends ~1 ms of
// CPU per call (and 16 of them share an interpreter's lock), long enough to
// be preempted by the training part-way through, so its p99 is partly its
// own. This one spends ~0.1 ms per call. load.py --client cpp runs both this
// load and the lone probe with it; the Python rows stay for comparison.
//
// Output, on stdout when the load ends: one JSON object,
//   {"latencies": {ROW: [seconds, ...]}, "errors": {ROW: ["message", ...]}}
// where ROW is the call's name, with " (LABEL)" after it when --label is set.
// Exit code 2 for bad flags; failed calls are data, not a failure.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "memprofd/v1/memprofd.grpc.pb.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051", "the daemon's gRPC address");
ABSL_FLAG(int, metrics_port, 0,
          "the daemon's /metrics port on 127.0.0.1 (kind 'metrics')");
ABSL_FLAG(
    std::string, operation_id, "",
    "the training operation the streams follow (StreamStepReports, WatchOperation)");
ABSL_FLAG(int, clients, 64, "concurrent clients, one thread and one connection each");
ABSL_FLAG(double, seconds, 60, "how long the load runs");
ABSL_FLAG(double, interval, 0,
          "seconds between one client's calls; 0 calls again as soon as answered");
ABSL_FLAG(std::string, kinds, "GetStatus,GetMemoryStats,metrics",
          "comma-separated calls each client takes turns at: GetStatus, GetMemoryStats, "
          "metrics, StreamStepReports, WatchOperation");
ABSL_FLAG(int, dump_every, 16,
          "one client in N also takes turns at DumpMemoryHistory (0: none)");
ABSL_FLAG(std::string, label, "", "added to every row's name as ' (LABEL)'");

namespace memprofd {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = memprofd::v1;

constexpr std::chrono::seconds kUnaryDeadline(30);
constexpr std::chrono::seconds kStreamDeadline(60);
constexpr std::chrono::seconds kDumpDeadline(120);
// Messages a stream call reads before it cancels (load.py's clients read 3).
constexpr int kStreamMessages = 3;

const char* const kKinds[] = {"GetStatus", "GetMemoryStats", "metrics",
                              "StreamStepReports", "WatchOperation"};

// One GET of /metrics over HTTP/1.0 on loopback (the server closes after the
// answer, as it does for Python's urllib): OK when it answers 200 with a body.
absl::Status ScrapeMetrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: errno ", errno));
  timeval timeout{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  absl::Status status;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    status = absl::UnavailableError(absl::StrCat("connect: errno ", errno));
  } else {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      status = absl::UnavailableError(absl::StrCat("send: errno ", errno));
    }
    char buf[65536];
    for (ssize_t n; status.ok() && (n = recv(fd, buf, sizeof(buf), 0)) != 0;) {
      if (n < 0)
        status = absl::UnavailableError(absl::StrCat("recv: errno ", errno));
      else
        answer.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  const size_t body = answer.find("\r\n\r\n");
  // "HTTP/1.x 200 ...": the status code is bytes 9 to 11.
  if (answer.size() < 12 || !absl::StartsWith(answer, "HTTP/1.") ||
      answer.compare(9, 3, "200") != 0 || body == std::string::npos ||
      body + 4 == answer.size()) {
    return absl::UnavailableError(
        absl::StrCat("unexpected answer: '", answer.substr(0, answer.find('\r')), "'"));
  }
  return absl::OkStatus();
}

std::unique_ptr<grpc::ClientContext> Context(std::chrono::seconds timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

// Reads up to kStreamMessages from a server stream, then cancels it: OK when
// that many arrived (the call then ends CANCELLED, by us).
template <typename Msg>
grpc::Status ReadThenCancel(grpc::ClientContext* ctx, grpc::ClientReader<Msg>* reader) {
  Msg msg;
  int n = 0;
  while (n < kStreamMessages && reader->Read(&msg)) ++n;
  if (n == kStreamMessages) {
    ctx->TryCancel();
    reader->Finish();
    return grpc::Status::OK;
  }
  grpc::Status status = reader->Finish();
  if (status.ok()) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("stream ended after ", n, " messages"));
  }
  return status;
}

struct Settings {
  std::string addr;
  int metrics_port = 0;
  std::string operation_id;
  Clock::duration interval{};
  Clock::time_point deadline;
  int dump_every = 0;
  std::vector<std::string> kinds;
};

// One client's latencies and failures, by call.
struct Record {
  std::map<std::string, std::vector<double>> latencies;
  std::map<std::string, std::vector<std::string>> errors;
};

class LoadClient {
 public:
  LoadClient(const Settings& settings, int index) : settings_(settings), index_(index) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stub_ = v1::Memprofd::NewStub(grpc::CreateCustomChannel(
        settings.addr, grpc::InsecureChannelCredentials(), args));
  }

  // Calls until the deadline; thread-compatible (one thread per client).
  void Run() {
    std::vector<std::string> mine = settings_.kinds;
    if (settings_.dump_every > 0 && index_ % settings_.dump_every == 0) {
      mine.push_back("DumpMemoryHistory");
    }
    Clock::time_point next = Clock::now() + settings_.interval * (index_ % 64) / 64;
    for (size_t k = static_cast<size_t>(index_); Clock::now() < settings_.deadline; ++k) {
      const std::string& kind = mine[k % mine.size()];
      if (settings_.interval > Clock::duration::zero()) {
        std::this_thread::sleep_until(next);
        next += settings_.interval;
      }
      const Clock::time_point start = Clock::now();
      const absl::Status status = Call(kind);
      record_.latencies[kind].push_back(
          std::chrono::duration<double>(Clock::now() - start).count());
      if (!status.ok()) record_.errors[kind].push_back(status.ToString());
    }
  }

  const Record& record() const { return record_; }

 private:
  absl::Status Call(const std::string& kind) {
    if (kind == "metrics") return ScrapeMetrics(settings_.metrics_port);
    grpc::Status s = CallRpc(kind);
    if (s.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }

  grpc::Status CallRpc(const std::string& kind) {
    if (kind == "GetStatus") {
      v1::ServerStatus resp;
      return stub_->GetStatus(Context(kUnaryDeadline).get(), v1::GetStatusRequest(),
                              &resp);
    }
    if (kind == "GetMemoryStats") {
      v1::MemoryStats resp;
      return stub_->GetMemoryStats(Context(kUnaryDeadline).get(),
                                   v1::GetMemoryStatsRequest(), &resp);
    }
    if (kind == "StreamStepReports") {
      v1::StreamStepReportsRequest req;
      req.set_operation_id(settings_.operation_id);
      auto ctx = Context(kStreamDeadline);
      return ReadThenCancel(ctx.get(), stub_->StreamStepReports(ctx.get(), req).get());
    }
    if (kind == "WatchOperation") {
      v1::WatchOperationRequest req;
      req.set_id(settings_.operation_id);
      auto ctx = Context(kStreamDeadline);
      return ReadThenCancel(ctx.get(), stub_->WatchOperation(ctx.get(), req).get());
    }
    // DumpMemoryHistory: read to the end.
    auto ctx = Context(kDumpDeadline);
    auto reader = stub_->DumpMemoryHistory(ctx.get(), v1::DumpMemoryHistoryRequest());
    v1::DumpChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }

  const Settings& settings_;
  const int index_;
  std::unique_ptr<v1::Memprofd::Stub> stub_;
  Record record_;
};

int Main() {
  Settings settings;
  settings.addr = absl::GetFlag(FLAGS_addr);
  settings.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  settings.operation_id = absl::GetFlag(FLAGS_operation_id);
  settings.dump_every = absl::GetFlag(FLAGS_dump_every);
  const int clients = absl::GetFlag(FLAGS_clients);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const double interval = absl::GetFlag(FLAGS_interval);
  for (absl::string_view kind :
       absl::StrSplit(absl::GetFlag(FLAGS_kinds), ',', absl::SkipEmpty())) {
    if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds)) {
      std::fprintf(stderr, "load_client: --kinds: '%s' is not one of %s\n",
                   std::string(kind).c_str(), absl::StrJoin(kKinds, ",").c_str());
      return 2;
    }
    settings.kinds.emplace_back(kind);
  }
  const bool streams = absl::c_any_of(settings.kinds, [](const std::string& k) {
    return k == "StreamStepReports" || k == "WatchOperation";
  });
  const bool scrapes = absl::c_linear_search(settings.kinds, "metrics");
  std::string problem;
  if (settings.kinds.empty())
    problem = "--kinds names no call";
  else if (clients < 1)
    problem = "--clients must be at least 1";
  else if (!(seconds > 0))
    problem = "--seconds must be positive";
  else if (!(interval >= 0))
    problem = "--interval must be 0 or more";
  else if (streams && settings.operation_id.empty())
    problem = "the streams need --operation_id";
  else if (scrapes && settings.metrics_port <= 0)
    problem = "'metrics' needs --metrics_port";
  if (!problem.empty()) {
    std::fprintf(stderr, "load_client: %s\n", problem.c_str());
    return 2;
  }
  settings.interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(interval));
  settings.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(seconds));

  std::vector<std::unique_ptr<LoadClient>> load;
  for (int i = 0; i < clients; ++i)
    load.push_back(std::make_unique<LoadClient>(settings, i));
  std::vector<std::thread> threads;
  for (auto& client : load) threads.emplace_back([&client] { client->Run(); });
  for (auto& t : threads) t.join();

  const std::string suffix = absl::GetFlag(FLAGS_label).empty()
                                 ? ""
                                 : absl::StrCat(" (", absl::GetFlag(FLAGS_label), ")");
  nlohmann::json out = {{"latencies", nlohmann::json::object()},
                        {"errors", nlohmann::json::object()}};
  for (const auto& client : load) {
    for (const auto& [kind, values] : client->record().latencies) {
      auto& row = out["latencies"][kind + suffix];
      for (double v : values) row.push_back(v);
    }
    for (const auto& [kind, messages] : client->record().errors) {
      auto& row = out["errors"][kind + suffix];
      for (const auto& m : messages) row.push_back(m);
    }
  }
  std::printf("%s\n",
              out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load_client: bench/load.py's clients in C++; prints their latencies as JSON");
  absl::ParseCommandLine(argc, argv);
  return memprofd::Main();
}
