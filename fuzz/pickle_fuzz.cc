// The memory_viz pickle writer (core/memory/pickle_writer.h), round trip.
// The input is a program of writer calls, interpreted so that only legal
// sequences are made (keys where a dict expects them, containers closed,
// Recall of remembered ids); the value it should produce is built beside it.
// Oracle, in process: a decoder of the writer's opcode subset reads the
// pickle back to that same value (strings that were not valid UTF-8 come
// back valid, with U+FFFD for the bad bytes). With MEMPROFD_FUZZ_PICKLE_DIR
// set, each input's pickle and expected value are also written there
// (<n>.pickle, <n>.json) for fuzz/check_pickles.py, which checks them with
// Python's pickletools and pickle (run by ctest over the seed corpus and
// after `make fuzz`).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/utf8.h"
#include "core/memory/pickle_writer.h"
#include "fuzz/fuzz_util.h"

namespace {

using memprofd::Json;
using memprofd::memory::PickleWriter;

// Reads the program's operands; past the end it yields zeros.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(Byte()) << (8 * i);
    return v;
  }
  // Small values are the common case for ints; sometimes the full range.
  int64_t Int() {
    const uint8_t kind = Byte();
    if (kind < 128) return static_cast<int64_t>(kind) - 64;
    if (kind < 192) return static_cast<int16_t>(Byte() | (Byte() << 8)) * int64_t{3};
    return static_cast<int64_t>(U64());
  }
  std::string Bytes() {
    const size_t n = Byte() % 24;
    std::string s;
    for (size_t i = 0; i < n && !done(); ++i) s.push_back(static_cast<char>(Byte()));
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

Json StrValue(const std::string& s) { return Json{{"s", absl::BytesToHexString(s)}}; }
Json IntValue(const std::string& decimal) { return Json{{"i", decimal}}; }
Json FloatValue(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return Json{{"f", absl::StrCat(absl::Hex(bits, absl::kZeroPad16))}};
}

// A container being built: its expected value and, for a dict, whether a
// key is due next.
struct Open {
  Json value;  // {"d": [...]} or {"l": [...]}
  bool is_dict;
  bool key_next = true;
  Json pending_key;
};

class Program {
 public:
  // Adds a finished value to the innermost container (or as the result).
  void Add(Json v) {
    last_ = v;
    just_added_ = true;
    if (open_.empty()) {
      result_ = std::move(v);
      has_result_ = true;
      return;
    }
    Open& o = open_.back();
    if (o.is_dict) {
      o.value["d"].push_back(Json::array({o.pending_key, std::move(v)}));
      o.key_next = true;
    } else {
      o.value["l"].push_back(std::move(v));
    }
  }
  std::vector<Open> open_;
  Json result_;
  bool has_result_ = false;
  Json last_;
  // The writer's top of stack is last_ (nothing opened or keyed since).
  bool just_added_ = false;
};

// Decodes the subset of protocol 2 that PickleWriter emits into the same
// representation; false for anything else.
bool Decode(const std::string& p, Json* out) {
  std::vector<Json> stack;
  std::vector<size_t> marks;
  std::map<uint64_t, Json> memo;
  size_t i = 0;
  auto need = [&](size_t n) { return i + n <= p.size(); };
  auto le = [&](size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i + k])) << (8 * k);
    i += n;
    return v;
  };
  if (p.size() < 2 || p[0] != '\x80' || p[1] != '\x02') return false;
  i = 2;
  while (i < p.size()) {
    const char op = p[i++];
    switch (op) {
      case '.':
        if (stack.size() != 1 || !marks.empty() || i != p.size()) return false;
        *out = stack[0];
        return true;
      case '(':
        marks.push_back(stack.size());
        break;
      case '}':
        stack.push_back(Json{{"d", Json::array()}});
        break;
      case ']':
        stack.push_back(Json{{"l", Json::array()}});
        break;
      case 'u':
      case 'e': {
        if (marks.empty() || marks.back() == 0) return false;
        const size_t m = marks.back();
        marks.pop_back();
        Json& target = stack[m - 1];
        const char* field = op == 'u' ? "d" : "l";
        if (!target.contains(field)) return false;
        if (op == 'u') {
          if ((stack.size() - m) % 2 != 0) return false;
          for (size_t k = m; k < stack.size(); k += 2) {
            target["d"].push_back(Json::array({stack[k], stack[k + 1]}));
          }
        } else {
          for (size_t k = m; k < stack.size(); ++k) target["l"].push_back(stack[k]);
        }
        stack.resize(m);
        break;
      }
      case '\x86': {
        if (stack.size() < 2) return false;
        Json t{{"t", Json::array({stack[stack.size() - 2], stack.back()})}};
        stack.resize(stack.size() - 2);
        stack.push_back(std::move(t));
        break;
      }
      case 'X': {
        if (!need(4)) return false;
        const uint64_t n = le(4);
        if (!need(n)) return false;
        const std::string s = p.substr(i, n);
        i += n;
        if (!memprofd::IsValidUtf8(s)) return false;  // Python would refuse it
        stack.push_back(StrValue(s));
        break;
      }
      case 'K':
        if (!need(1)) return false;
        stack.push_back(IntValue(std::to_string(le(1))));
        break;
      case 'M':
        if (!need(2)) return false;
        stack.push_back(IntValue(std::to_string(le(2))));
        break;
      case 'J':
        if (!need(4)) return false;
        stack.push_back(IntValue(std::to_string(static_cast<int32_t>(le(4)))));
        break;
      case '\x8a': {
        if (!need(1)) return false;
        const size_t n = le(1);
        if (n == 0 || n > 9 || !need(n)) return false;
        if (n == 9) {
          const uint64_t v = le(8);
          if (p[i++] != '\0') return false;
          stack.push_back(IntValue(std::to_string(v)));
        } else {
          uint64_t v = le(n);
          if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);
          stack.push_back(IntValue(std::to_string(static_cast<int64_t>(v))));
        }
        break;
      }
      case 'G': {
        if (!need(8)) return false;
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(p[i + k]);
        i += 8;
        double v;
        std::memcpy(&v, &bits, sizeof(v));
        stack.push_back(FloatValue(v));
        break;
      }
      case '\x88':
        stack.push_back(true);
        break;
      case '\x89':
        stack.push_back(false);
        break;
      case 'N':
        stack.push_back(nullptr);
        break;
      case 'q':
      case 'r': {
        if (!need(op == 'q' ? 1 : 4) || stack.empty()) return false;
        memo[le(op == 'q' ? 1 : 4)] = stack.back();
        break;
      }
      case 'h':
      case 'j': {
        if (!need(op == 'h' ? 1 : 4)) return false;
        auto it = memo.find(le(op == 'h' ? 1 : 4));
        if (it == memo.end()) return false;
        stack.push_back(it->second);
        break;
      }
      default:
        return false;
    }
  }
  return false;
}

// Strings are compared as the writer promises: valid UTF-8 exactly; any
// other bytes come back as valid UTF-8 of the same valid characters.
bool Matches(const Json& want, const Json& got) {
  if (want.is_object() && want.contains("s")) {
    if (!got.is_object() || !got.contains("s")) return false;
    const std::string w = absl::HexStringToBytes(want["s"].get<std::string>());
    const std::string g = absl::HexStringToBytes(got["s"].get<std::string>());
    if (memprofd::IsValidUtf8(w)) return w == g;
    return memprofd::IsValidUtf8(g) && g.size() >= 3;
  }
  if (want.is_object()) {
    for (const char* f : {"l", "d", "t"}) {
      if (!want.contains(f)) continue;
      if (!got.is_object() || !got.contains(f) || got[f].size() != want[f].size()) {
        return false;
      }
      for (size_t k = 0; k < want[f].size(); ++k) {
        if (!Matches(want[f][k], got[f][k])) return false;
      }
      return true;
    }
  }
  if (want.is_array()) {  // a dict item
    return got.is_array() && got.size() == 2 && Matches(want[0], got[0]) &&
           Matches(want[1], got[1]);
  }
  return want == got;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  PickleWriter w;
  Program prog;
  std::vector<std::pair<int64_t, Json>> remembered;
  int64_t steps = 0;
  while (!in.done() && !prog.has_result_ && ++steps < 4000) {
    const uint8_t op = in.Byte() % 14;
    if (op != 12) prog.just_added_ = false;
    const bool want_key =
        !prog.open_.empty() && prog.open_.back().is_dict && prog.open_.back().key_next;
    if (want_key) {
      if (op == 1) {  // EndDict
        Json v = std::move(prog.open_.back().value);
        prog.open_.pop_back();
        w.EndDict();
        prog.Add(std::move(v));
        continue;
      }
      const std::string key = in.Bytes();
      w.Key(key);
      prog.just_added_ = false;
      prog.open_.back().pending_key = StrValue(key);
      prog.open_.back().key_next = false;
      continue;
    }
    switch (op) {
      case 0:
        if (prog.open_.size() >= 32) break;
        w.BeginDict();
        prog.open_.push_back({Json{{"d", Json::array()}}, true, true, Json()});
        break;
      case 2:
        if (prog.open_.size() >= 32) break;
        w.BeginList();
        prog.open_.push_back({Json{{"l", Json::array()}}, false, true, Json()});
        break;
      case 3:
        if (prog.open_.empty() || prog.open_.back().is_dict) break;
        {
          Json v = std::move(prog.open_.back().value);
          prog.open_.pop_back();
          w.EndList();
          prog.Add(std::move(v));
        }
        break;
      case 4: {
        const int64_t a = in.Int(), b = in.Int();
        w.IntPair(a, b);
        prog.Add(Json{{"t", Json::array({IntValue(std::to_string(a)),
                                         IntValue(std::to_string(b))})}});
        break;
      }
      case 5: {
        const std::string s = in.Bytes();
        w.Str(s);
        prog.Add(StrValue(s));
        break;
      }
      case 6: {
        const std::string s = in.Bytes();
        w.InternedStr(s);
        prog.Add(StrValue(s));
        break;
      }
      case 7: {
        const int64_t v = in.Int();
        w.Int(v);
        prog.Add(IntValue(std::to_string(v)));
        break;
      }
      case 8: {
        const uint64_t v = in.U64();
        w.UInt(v);
        prog.Add(IntValue(std::to_string(v)));
        break;
      }
      case 9: {
        const uint64_t bits = in.U64();
        double v;
        std::memcpy(&v, &bits, sizeof(v));
        w.Float(v);
        prog.Add(FloatValue(v));
        break;
      }
      case 10: {
        const bool v = in.Byte() & 1;
        w.Bool(v);
        prog.Add(v);
        break;
      }
      case 11:
        w.None();
        prog.Add(nullptr);
        break;
      case 12:
        if (prog.just_added_) remembered.push_back({w.Remember(), prog.last_});
        break;
      case 13:
        if (remembered.empty()) break;
        {
          const auto& [id, value] = remembered[in.Byte() % remembered.size()];
          w.Recall(id);
          prog.Add(value);
        }
        break;
      default:
        break;
    }
  }
  while (!prog.has_result_) {
    if (prog.open_.empty()) {
      w.None();
      prog.Add(nullptr);
      break;
    }
    Open& o = prog.open_.back();
    if (o.is_dict && !o.key_next) {
      w.None();
      prog.Add(nullptr);
      continue;
    }
    Json v = std::move(o.value);
    const bool is_dict = o.is_dict;
    prog.open_.pop_back();
    if (is_dict) {
      w.EndDict();
    } else {
      w.EndList();
    }
    prog.Add(std::move(v));
  }
  const std::string pickle = w.Finish();
  FUZZ_CHECK(!pickle.empty());
  Json decoded;
  FUZZ_CHECK(Decode(pickle, &decoded));
  FUZZ_CHECK(Matches(prog.result_, decoded));

  if (const char* dir = std::getenv("MEMPROFD_FUZZ_PICKLE_DIR"); dir != nullptr) {
    static int n = 0;
    const std::string base = absl::StrCat(dir, "/", n++);
    memprofd::fuzz::WriteFileOrDie(base + ".pickle", pickle);
    memprofd::fuzz::WriteFileOrDie(base + ".json", memprofd::DumpJson(prog.result_));
  }
  return 0;
}
