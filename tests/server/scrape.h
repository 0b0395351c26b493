#ifndef MEMPROFD_TESTS_SERVER_SCRAPE_H_
#define MEMPROFD_TESTS_SERVER_SCRAPE_H_

// A scrape of a /metrics endpoint over plain HTTP, as Prometheus does it, and
// a check on the text it returns. For tests; thread-compatible.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memprofd {
namespace testing {

// The body of GET http://127.0.0.1:<port>/metrics. UNAVAILABLE when the port
// does not answer, INTERNAL for an answer that is not 200 OK.
absl::StatusOr<std::string> ScrapeMetrics(int port);

// The sample lines of `text` (Prometheus text format) that lack one of
// `labels` ("rank=\"0\""), leaving out prometheus-cpp's own exposer_*
// samples, which the exposer adds beyond the daemon's reach. Empty when every
// sample has them all; a text without samples fails the calling test.
std::vector<std::string> SamplesWithoutLabels(const std::string& text,
                                              const std::vector<std::string>& labels);

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_SERVER_SCRAPE_H_
