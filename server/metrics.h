#ifndef MEMPROFD_SERVER_METRICS_H_
#define MEMPROFD_SERVER_METRICS_H_

// The daemon's Prometheus endpoint: a registry of metrics the server updates
// (RPC counts and latencies, build info, world size) plus collectables that
// read the engine's published state at scrape time, so scrapes never block
// the owner thread. Every sample it serves carries rank="<world.rank>" and
// node="<world.node_rank>" (LabelledCollectables), "0" and "0" in a single
// process. The HTTP side is MetricsHttpServer (one epoll thread). Names are
// in base units; counters end in _total.
// Thread-safe: RecordRpc may be called from any thread.

#include <grpcpp/support/status.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dist/world.h"
#include "server/labelled_collectables.h"
#include "server/metrics_http.h"

namespace memprofd {

struct BuildLabels {
  std::string version;
  std::string torch_version;
  std::string device;
};

class ServerMetrics {
 public:
  // `world` gives every metric its rank and node labels.
  ServerMetrics(const BuildLabels& build, const WorldSpec& world);

  // Binds host:port (port 0 picks one) and serves /metrics; returns the bound
  // port. INVALID_ARGUMENT for an unparsable address, UNAVAILABLE when the
  // port cannot be bound.
  absl::StatusOr<int> Serve(const std::string& listen);

  // One finished RPC: counted by method and status code, timed by method.
  void RecordRpc(const std::string& method, grpc::StatusCode code, double seconds);

  // Adds a scrape-time collectable, served with the rank and node labels;
  // the ServerMetrics keeps it alive.
  void AddCollectable(std::shared_ptr<prometheus::Collectable> collectable);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  // What the exposer serves: the registry and every collectable, labelled.
  std::shared_ptr<LabelledCollectables> served_;
  prometheus::Family<prometheus::Counter>& rpc_requests_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  std::unique_ptr<MetricsHttpServer> http_;  // serving once Serve succeeded
};

// Parses "host:port" or "[v6]:port" with port 0..65535; INVALID_ARGUMENT
// naming the flag otherwise.
absl::Status ValidateListenAddress(const std::string& flag, const std::string& address);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_METRICS_H_
