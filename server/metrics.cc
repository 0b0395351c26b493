#include "server/metrics.h"

#include <prometheus/gauge.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/common/host_heap.h"
#include "core/common/log.h"
#include "server/grpc_status.h"

namespace memprofd {
namespace {

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help,
                                     double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric m;
  m.gauge.value = value;
  f.metric.push_back(std::move(m));
  return f;
}

// process_* metrics of the standard exporters, read at scrape time.
class ProcessCollectable : public prometheus::Collectable {
 public:
  ProcessCollectable() : start_seconds_(absl::ToUnixMicros(absl::Now()) / 1e6) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    out.push_back(GaugeFamily(
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, in seconds.", start_seconds_));
    if (const int64_t rss = ReadHostResident().rss_bytes; rss >= 0) {
      out.push_back(GaugeFamily("process_resident_memory_bytes",
                                "Resident memory size in bytes.",
                                static_cast<double>(rss)));
    }
    return out;
  }

 private:
  const double start_seconds_;
};

}  // namespace

absl::Status ValidateListenAddress(const std::string& flag, const std::string& address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "='", address, "' is not a listen address (", why,
        "); write host:port, e.g. 127.0.0.1:50051, 0.0.0.0:0 or [::1]:9464"));
  };
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host:port");
  std::string host = address.substr(0, colon);
  if (host.front() == '[' && host.back() != ']') return bad("unclosed [");
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return bad("port must be a number 0..65535");
  }
  for (char c : host) {
    if (c == ' ' || c == '/' || c == '\t') return bad("bad character in host");
  }
  return absl::OkStatus();
}

ServerMetrics::ServerMetrics(const BuildLabels& build, const WorldSpec& world)
    : registry_(std::make_shared<prometheus::Registry>()),
      served_(std::make_shared<LabelledCollectables>(prometheus::Labels{
          {"rank", absl::StrCat(world.rank)}, {"node", absl::StrCat(world.node_rank)}})),
      rpc_requests_(prometheus::BuildCounter()
                        .Name("memprofd_rpc_requests_total")
                        .Help("RPCs handled, by method and gRPC status code.")
                        .Register(*registry_)),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("memprofd_rpc_duration_seconds")
                        .Help("Time to handle an RPC (streams: until the stream ends).")
                        .Register(*registry_)) {
  prometheus::BuildGauge()
      .Name("memprofd_build_info")
      .Help("Always 1; labels say what was built.")
      .Register(*registry_)
      .Add({{"version", build.version},
            {"torch_version", build.torch_version},
            {"device", build.device}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("memprofd_world_size")
      .Help(
          "Ranks in the data-parallel run this daemon is part of (1: a single "
          "process).")
      .Register(*registry_)
      .Add({})
      .Set(world.world_size);
  served_->Add(registry_);
  served_->Add(std::make_shared<ProcessCollectable>());
}

absl::StatusOr<int> ServerMetrics::Serve(const std::string& listen) {
  if (absl::Status s = ValidateListenAddress("metrics_listen", listen); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Create(listen, [served = served_] {
        return prometheus::TextSerializer().Serialize(served->Collect());
      });
  if (!http.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on --metrics_listen=", listen, ": ",
                     http.status().message(),
                     " (is the port in use? pick another or use "
                     "port 0)"));
  }
  http_ = *std::move(http);
  return http_->port();
}

void ServerMetrics::RecordRpc(const std::string& method, grpc::StatusCode code,
                              double seconds) {
  rpc_requests_.Add({{"method", method}, {"code", GrpcCodeName(code)}}).Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60};
  rpc_duration_.Add({{"method", method}}, kBuckets).Observe(seconds);
}

void ServerMetrics::AddCollectable(std::shared_ptr<prometheus::Collectable> collectable) {
  served_->Add(std::move(collectable));
}

}  // namespace memprofd
