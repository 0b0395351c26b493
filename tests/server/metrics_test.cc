// The /metrics endpoint's labels: every sample the daemon serves says which
// rank and node it came from, through the one collectable the exposer is
// given, whatever family or collectable it belongs to.

#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/labelled_collectables.h"
#include "tests/server/scrape.h"

namespace memprofd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// The labels of a sample as name -> value, and how many times each name came.
std::multimap<std::string, std::string> LabelsOf(const prometheus::ClientMetric& m) {
  std::multimap<std::string, std::string> out;
  for (const auto& l : m.label) out.emplace(l.name, l.value);
  return out;
}

class FixedCollectable : public prometheus::Collectable {
 public:
  explicit FixedCollectable(std::vector<prometheus::MetricFamily> families)
      : families_(std::move(families)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return families_; }

 private:
  std::vector<prometheus::MetricFamily> families_;
};

prometheus::MetricFamily Gauge(const std::string& name,
                               std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::MetricFamily f;
  f.name = name;
  f.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  f.metric.push_back(m);
  return f;
}

TEST(LabelledCollectablesTest, EverySampleOfEveryCollectableGetsTheLabels) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counters = prometheus::BuildCounter().Name("a_total").Register(*registry);
  counters.Add({{"method", "Train"}}).Increment();
  counters.Add({{"method", "Snapshot"}}).Increment();
  prometheus::BuildHistogram()
      .Name("b_seconds")
      .Register(*registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{1, 2})
      .Observe(1.5);
  LabelledCollectables served(prometheus::Labels{{"rank", "3"}, {"node", "1"}});
  served.Add(registry);
  served.Add(std::make_shared<FixedCollectable>(std::vector<prometheus::MetricFamily>{
      Gauge("c", {}), Gauge("d", {{"phase", "x"}})}));

  const std::vector<prometheus::MetricFamily> families = served.Collect();
  ASSERT_EQ(families.size(), 4u);
  int samples = 0;
  for (const auto& f : families) {
    for (const auto& m : f.metric) {
      ++samples;
      const auto labels = LabelsOf(m);
      EXPECT_EQ(labels.count("rank"), 1u) << f.name;
      EXPECT_EQ(labels.count("node"), 1u) << f.name;
      EXPECT_EQ(labels.find("rank")->second, "3") << f.name;
      EXPECT_EQ(labels.find("node")->second, "1") << f.name;
    }
  }
  EXPECT_EQ(samples, 5);
  // The metric's own labels stay, first and unchanged.
  EXPECT_EQ(families[3].metric[0].label.front().name, "phase");
  EXPECT_EQ(families[3].metric[0].label.size(), 3u);
}

TEST(LabelledCollectablesTest, AMetricThatSaysItsOwnRankKeepsIt) {
  LabelledCollectables served(prometheus::Labels{{"node", "0"}, {"rank", "0"}});
  served.Add(std::make_shared<FixedCollectable>(
      std::vector<prometheus::MetricFamily>{Gauge("peak_by_rank", {{"rank", "2"}})}));
  const auto families = served.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_THAT(LabelsOf(families[0].metric[0]),
              UnorderedElementsAre(Pair("rank", "2"), Pair("node", "0")));
}

TEST(LabelledCollectablesTest, CollectablesAddedLaterAreServedToo) {
  LabelledCollectables served(prometheus::Labels{{"rank", "0"}});
  EXPECT_TRUE(served.Collect().empty());
  served.Add(std::make_shared<FixedCollectable>(
      std::vector<prometheus::MetricFamily>{Gauge("late", {})}));
  const auto families = served.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_THAT(LabelsOf(families[0].metric[0]), ElementsAre(Pair("rank", "0")));
}

TEST(ServerMetricsTest, EveryServedSampleCarriesRankNodeAndTheWorldSize) {
  WorldSpec world;
  world.rank = 3;
  world.world_size = 4;
  world.node_rank = 1;
  ServerMetrics metrics(BuildLabels{"v", "t", "cpu"}, world);
  metrics.RecordRpc("GetStatus", grpc::StatusCode::OK, 0.01);
  // Added after Serve, as the server adds the session's.
  auto late = std::make_shared<FixedCollectable>(
      std::vector<prometheus::MetricFamily>{Gauge("memprofd_test_late", {})});
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  metrics.AddCollectable(late);

  absl::StatusOr<std::string> text = testing::ScrapeMetrics(*port);
  ASSERT_TRUE(text.ok()) << text.status();
  for (const char* name : {"memprofd_build_info{", "memprofd_rpc_requests_total{",
                           "memprofd_rpc_duration_seconds_bucket{",
                           "process_start_time_seconds{", "memprofd_test_late{"}) {
    EXPECT_THAT(*text, HasSubstr(name));
  }
  EXPECT_THAT(*text, HasSubstr("memprofd_world_size{node=\"1\",rank=\"3\"} 4"));
  EXPECT_THAT(testing::SamplesWithoutLabels(*text, {"rank=\"3\"", "node=\"1\""}),
              ElementsAre());
}

}  // namespace
}  // namespace memprofd
