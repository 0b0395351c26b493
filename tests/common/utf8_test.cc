// IsValidUtf8: what it rejects and the offset it names.
#include "core/common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace memprofd {
namespace {

TEST(Utf8Test, AcceptsValidText) {
  size_t bad = 99;
  EXPECT_TRUE(
      IsValidUtf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf", &bad));
  EXPECT_EQ(bad, 99u);
  EXPECT_TRUE(IsValidUtf8(""));
}

TEST(Utf8Test, RejectsOverlongSurrogatesAndTruncationAtTheirOffset) {
  struct Case {
    std::string text;
    size_t offset;
  };
  for (const Case& c : {
           Case{"ab\xc0\xaf", 2},        // overlong '/'
           Case{"\xe0\x80\xaf", 0},      // overlong, 3 bytes
           Case{"\xf0\x80\x80\xaf", 0},  // overlong, 4 bytes
           Case{"x\xed\xa0\x80", 1},     // surrogate U+D800
           Case{"\xf4\x90\x80\x80", 0},  // above U+10FFFF
           Case{"ok\xe2\x82", 2},        // truncated
           Case{"\x80", 0},              // lone continuation byte
           Case{"\xc3\x28", 0},          // bad continuation byte
           Case{"\xff", 0},
       }) {
    size_t bad = 99;
    EXPECT_FALSE(IsValidUtf8(c.text, &bad)) << c.offset;
    EXPECT_EQ(bad, c.offset);
  }
}

TEST(Utf8Test, ToValidUtf8ReplacesEachBadByteAndKeepsTheRest) {
  EXPECT_EQ(ToValidUtf8("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(ToValidUtf8(""), "");
  EXPECT_EQ(ToValidUtf8("a\xff"
                        "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(ToValidUtf8("ok\xe2\x82"), "ok\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(ToValidUtf8("\xed\xa0\x80"
                        "x"),
            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
            "x");
  EXPECT_TRUE(IsValidUtf8(ToValidUtf8("\x80\xc3\x28\xf4\x90\x80\x80\xc3")));
}

TEST(EchoTest, QuotesEscapesAndCutsWithoutBreakingAnEscape) {
  EXPECT_EQ(Echo("step-1"), "\"step-1\"");
  EXPECT_EQ(Echo("a\nb\"c"), "\"a\\nb\\\"c\"");
  const std::string huge(20000, 'z');
  const std::string echoed = Echo(huge);
  EXPECT_EQ(echoed, "\"" + std::string(kMaxEchoBytes, 'z') + "\"... (20000 bytes)");
  // A cut that would land inside "\\377" backs up to before it.
  const std::string bytes = std::string(kMaxEchoBytes - 2, 'a') + "\xff\xff";
  const std::string cut = Echo(bytes);
  EXPECT_EQ(cut, "\"" + std::string(kMaxEchoBytes - 2, 'a') + "\"... (" +
                     std::to_string(bytes.size()) + " bytes)");
}

}  // namespace
}  // namespace memprofd
