#include "core/memory/pickle_writer.h"

#include <cstring>
#include <utility>

#include "core/common/utf8.h"

namespace memprofd {
namespace memory {
namespace {

// Opcodes (CPython Lib/pickletools.py).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple2 = '\x86';
constexpr char kBinUnicode = 'X';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';
constexpr char kBinPut = 'q';
constexpr char kLongBinPut = 'r';
constexpr char kBinGet = 'h';
constexpr char kLongBinGet = 'j';

}  // namespace

PickleWriter::PickleWriter() {
  Put(kProto);
  Put('\x02');
}

void PickleWriter::PutLe(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) Put(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Called before every value: opens a MARK at the start of a batch and closes
// the batch once it holds kBatch items (a dict item is a key and a value).
void PickleWriter::OnValue() {
  if (stack_.empty()) return;
  Frame& f = stack_.back();
  const int64_t per_batch = f.is_dict ? 2 * kBatch : kBatch;
  if (f.items_in_batch == per_batch) {
    Put(f.is_dict ? kSetItems : kAppends);
    f.items_in_batch = 0;
  }
  if (f.items_in_batch == 0) Put(kMark);
  ++f.items_in_batch;
}

void PickleWriter::BeginDict() {
  OnValue();
  Put(kEmptyDict);
  stack_.push_back({true, 0});
}

void PickleWriter::EndDict() {
  if (stack_.empty() || !stack_.back().is_dict || stack_.back().items_in_batch % 2 != 0) {
    error_ = true;
    return;
  }
  if (stack_.back().items_in_batch > 0) Put(kSetItems);
  stack_.pop_back();
}

void PickleWriter::BeginList() {
  OnValue();
  Put(kEmptyList);
  stack_.push_back({false, 0});
}

void PickleWriter::EndList() {
  if (stack_.empty() || stack_.back().is_dict) {
    error_ = true;
    return;
  }
  if (stack_.back().items_in_batch > 0) Put(kAppends);
  stack_.pop_back();
}

void PickleWriter::IntPair(int64_t a, int64_t b) {
  OnValue();
  WriteInt(a);
  WriteInt(b);
  Put(kTuple2);
}

void PickleWriter::Str(absl::string_view s) {
  // BINUNICODE must hold UTF-8: Python's pickle.load and MemoryViz.js refuse
  // the whole file over one bad string (a module or op name, a path).
  if (!IsValidUtf8(s)) {
    Str(ToValidUtf8(s));
    return;
  }
  OnValue();
  Put(kBinUnicode);
  PutLe(s.size(), 4);
  out_.append(s.data(), s.size());
}

void PickleWriter::InternedStr(absl::string_view s) {
  auto it = interned_.find(s);
  if (it != interned_.end()) {
    Recall(it->second);
    return;
  }
  Str(s);
  interned_.emplace(std::string(s), Remember());
}

int64_t PickleWriter::Remember() {
  const int64_t id = next_memo_++;
  if (id < 0x100) {
    Put(kBinPut);
    PutLe(static_cast<uint64_t>(id), 1);
  } else {
    Put(kLongBinPut);
    PutLe(static_cast<uint64_t>(id), 4);
  }
  return id;
}

void PickleWriter::Recall(int64_t id) {
  OnValue();
  if (id < 0x100) {
    Put(kBinGet);
    PutLe(static_cast<uint64_t>(id), 1);
  } else {
    Put(kLongBinGet);
    PutLe(static_cast<uint64_t>(id), 4);
  }
}

void PickleWriter::Int(int64_t v) {
  OnValue();
  WriteInt(v);
}

void PickleWriter::WriteInt(int64_t v) {
  if (v >= 0 && v < 0x100) {
    Put(kBinInt1);
    PutLe(static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 0x10000) {
    Put(kBinInt2);
    PutLe(static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    Put(kBinInt);
    PutLe(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
  } else {
    // LONG1: little-endian two's complement, shortest length that keeps the
    // sign bit right (at most 8 bytes for an int64).
    const uint64_t u = static_cast<uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const uint64_t top = (u >> (8 * (n - 1))) & 0xff;
      const uint64_t next_sign = (u >> (8 * (n - 1) - 1)) & 1;
      if ((top == 0 && next_sign == 0) || (top == 0xff && next_sign == 1)) {
        --n;
      } else {
        break;
      }
    }
    Put(kLong1);
    Put(static_cast<char>(n));
    PutLe(u, n);
  }
}

void PickleWriter::UInt(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) {
    Int(static_cast<int64_t>(v));
    return;
  }
  // Needs a 9th byte so that the value stays positive.
  OnValue();
  Put(kLong1);
  Put('\x09');
  PutLe(v, 8);
  Put('\0');
}

void PickleWriter::Float(double v) {
  OnValue();
  Put(kBinFloat);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  for (int i = 7; i >= 0; --i) Put(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::Bool(bool v) {
  OnValue();
  Put(v ? kNewTrue : kNewFalse);
}

void PickleWriter::None() {
  OnValue();
  Put(kNone);
}

std::string PickleWriter::Finish() {
  std::string result;
  if (!error_ && stack_.empty()) {
    Put(kStop);
    result = std::move(out_);
  }
  out_.clear();
  stack_.clear();
  error_ = false;
  next_memo_ = 0;
  interned_.clear();
  Put(kProto);
  Put('\x02');
  return result;
}

}  // namespace memory
}  // namespace memprofd
