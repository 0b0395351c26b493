#include "core/common/host_heap.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace memprofd {

bool KeepHostHeapNearLiveBytes() {
  // mallopt returns 1 on success.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHostMmapThreshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHostMmapThreshold)) == 1;
}

namespace {

// What posix_memalign(64, n) adds to n before glibc picks where the chunk
// comes from: the alignment, the smallest chunk it may split off and the
// chunk's header, rounded up.
constexpr int64_t kMallocOverhead = 128;

}  // namespace

int64_t HostHeapFootprint(int64_t bytes) {
  if (bytes <= 0) return 0;
  const int64_t chunk = bytes + kMallocOverhead;
  if (chunk < kHostMmapThreshold) return (bytes + 16 + 15) / 16 * 16;
  static const int64_t page = [] {
    const long size = ::sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<int64_t>(size) : int64_t{4096};
  }();
  return (chunk + page - 1) / page * page;
}

void ReturnFreedHostMemory() { malloc_trim(0); }

HostResident ReadHostResident() {
  HostResident out;
  std::FILE* status = std::fopen("/proc/self/status", "re");
  if (status == nullptr) return out;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) out.rss_bytes = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) out.peak_rss_bytes = kib * 1024;
  }
  std::fclose(status);
  return out;
}

bool ResetHostPeakResident() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace memprofd
