#ifndef MEMPROFD_CORE_MEMORY_PICKLE_WRITER_H_
#define MEMPROFD_CORE_MEMORY_PICKLE_WRITER_H_

// A minimal writer of Python pickle protocol 2 for plain data: dicts, lists,
// 2-tuples, str, int (any int64), float, bool and None, with memo references
// for repeated values. It emits no GLOBAL or REDUCE, so that Python's
// pickle.load reads the result without importing anything, and only opcodes
// PyTorch's MemoryViz.js unpickler (protocol 2-4, a fixed subset) knows.
// No LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace memprofd {
namespace memory {

// Streams opcodes into a string. Containers are written in the order the
// calls arrive: BeginDict(); Key("a"); Int(1); EndDict(); ... Finish().
// Batches of at most kBatch items are closed with SETITEMS/APPENDS, as
// Python's own pickler does (MemoryViz.js pushes each batch as function
// arguments, which overflows the JS stack for very large batches).
// Not thread-safe: one writer per thread. Misuse (unbalanced containers, a
// dict with an odd number of items) is a programming error and is checked
// by Finish(), which then returns an empty string.
class PickleWriter {
 public:
  static constexpr int kBatch = 1000;

  PickleWriter();

  void BeginDict();
  void EndDict();
  void BeginList();
  void EndList();
  // A 2-tuple of ints (what PyTorch writes for segment_pool_id).
  void IntPair(int64_t a, int64_t b);

  // Bytes that are not valid UTF-8 are written as U+FFFD (ToValidUtf8), so
  // that the pickle always loads.
  void Str(absl::string_view s);
  // A string written once and referenced from the memo afterwards (2-5 bytes
  // instead of 5 + size): for dict keys and enum-like values that repeat.
  // Keeps every distinct string in memory, so use it for few distinct values.
  void InternedStr(absl::string_view s);
  void Key(absl::string_view s) { InternedStr(s); }
  void Int(int64_t v);
  void UInt(uint64_t v);
  void Float(double v);
  void Bool(bool v);
  void None();

  // Memoizes the value written last (a finished container or scalar) and
  // returns its id; Recall(id) then writes that same object again by
  // reference (BINGET), e.g. one frames list shared by many trace entries.
  int64_t Remember();
  void Recall(int64_t id);

  // Appends STOP and returns the pickle; empty when the containers were
  // unbalanced. The writer is left empty.
  std::string Finish();

 private:
  struct Frame {
    bool is_dict;
    int64_t items_in_batch;
  };
  void OnValue();
  void WriteInt(int64_t v);
  void Put(char c) { out_.push_back(c); }
  void PutLe(uint64_t v, int bytes);

  std::string out_;
  std::vector<Frame> stack_;
  int64_t next_memo_ = 0;
  absl::flat_hash_map<std::string, int64_t> interned_;
  bool error_ = false;
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_PICKLE_WRITER_H_
