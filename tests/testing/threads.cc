#include "tests/testing/threads.h"

#include <pthread.h>

namespace memprofd {
namespace testing {

std::string ThisThreadName() {
  char name[16] = {};  // Linux keeps 15 bytes and the terminator.
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

}  // namespace testing
}  // namespace memprofd
