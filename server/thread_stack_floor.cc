// A floor under explicitly requested thread stack sizes, for CivetWeb.
//
// Debian's CivetWeb (under prometheus-cpp's Exposer) starts its worker
// threads with a compiled-in 100 KiB stack. glibc carves each thread's static
// TLS out of that stack, and this process's static TLS is about that large
// (OpenBLAS 60 KiB, glog 30 KiB, LibTorch 10 KiB), so pthread_create fails
// with EINVAL and the exposer reports "Cannot create threads" — /metrics
// cannot start. This definition, exported from the executable
// (--export-dynamic-symbol), takes precedence over glibc's and raises any
// request below kFloor; requests above it pass through unchanged.

#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {
constexpr size_t kFloor = size_t{1} << 20;  // 1 MiB
using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const SetStackSizeFn real =
      reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, size < kFloor ? kFloor : size);
}
