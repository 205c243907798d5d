// Pre-tokenization: hand-written equivalents of the GPT-2 and LLaMA-3 split regexes (see
// include/lowbit/data/tokenizer.h), over UTF-8 with invalid bytes as single "other" characters.
//
// A regex alternative list is tried in order at each position, and each alternative matches
// greedily; the scanner below follows that order. The one look-ahead, \s+(?!\S), matches a run of
// white space whole when it ends the text or is followed by more white space, and otherwise all
// of the run but its last character (which then starts the next pre-token).
#include "data/pretokenize.h"

#include <algorithm>

#include "data/unicode_tables.h"
#include "lowbit/core/error.h"

namespace lowbit::data {

namespace {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  uint32_t cp;   // code point (the byte itself for an invalid byte)
  uint32_t len;  // bytes
  CharClass cls;
};

template <size_t N>
bool in_ranges(const unicode::CodePointRange (&r)[N], uint32_t cp) {
  const auto* it = std::upper_bound(
      r, r + N, cp, [](uint32_t v, const unicode::CodePointRange& x) { return v < x.first; });
  return it != r && cp <= (it - 1)->last;
}

CharClass classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (in_ranges(unicode::kLetterRanges, cp)) return CharClass::kLetter;
  if (in_ranges(unicode::kNumberRanges, cp)) return CharClass::kNumber;
  if (in_ranges(unicode::kWhiteSpaceRanges, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// The character at byte i: a well-formed UTF-8 sequence (no overlong forms, no surrogates, at most
// U+10FFFF), or else the single byte as an "other" character.
Char char_at(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const uint32_t b0 = p[i];
  if (b0 < 0x80) return {b0, 1, classify(b0)};
  auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
  uint32_t cp = 0, len = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) {
    cp = ((b0 & 0x1F) << 6) | (p[i + 1] & 0x3F);
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    cp = ((b0 & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    len = 3;
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) len = 0;
  } else if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    cp = ((b0 & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
         (p[i + 3] & 0x3F);
    len = 4;
    if (cp < 0x10000 || cp > 0x10FFFF) len = 0;
  }
  if (len == 0) return {b0, 1, CharClass::kOther};
  return {cp, len, classify(cp)};
}

// The end of the run of characters of class `cls` starting at i (at most max_chars of them).
size_t run_end(std::string_view s, size_t i, CharClass cls, size_t max_chars = SIZE_MAX) {
  size_t count = 0;
  while (i < s.size() && count < max_chars) {
    const Char c = char_at(s, i);
    if (c.cls != cls) break;
    i += c.len;
    ++count;
  }
  return i;
}

// 's 't 're 've 'm 'll 'd at i (text[i] == '\''): the end of the contraction, or 0.
size_t contraction_end(std::string_view s, size_t i, bool fold_case) {
  auto at = [&](size_t k) -> char {
    if (i + k >= s.size()) return '\0';
    const char c = s[i + k];
    return fold_case && c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  };
  const char a = at(1), b = at(2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

// \s+(?!\S) then \s+, for the white-space run starting at i.
size_t space_run_end(std::string_view s, size_t i) {
  size_t last = i, j = i, count = 0;
  while (j < s.size()) {
    const Char c = char_at(s, j);
    if (c.cls != CharClass::kSpace) break;
    last = j;
    j += c.len;
    ++count;
  }
  if (j == s.size() || count == 1) return j;  // the whole run (\s+(?!\S) or \s+)
  return last;                                // all but its last character
}

size_t gpt2_end(std::string_view s, size_t i) {
  if (s[i] == '\'') {
    if (const size_t e = contraction_end(s, i, false)) return e;
  }
  const Char c = char_at(s, i);
  if (c.cls != CharClass::kSpace) return run_end(s, i, c.cls);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": a space joins the run that follows it.
  if (c.cp == ' ' && i + 1 < s.size()) {
    const Char d = char_at(s, i + 1);
    if (d.cls != CharClass::kSpace) return run_end(s, i + 1, d.cls);
  }
  return space_run_end(s, i);
}

size_t llama3_end(std::string_view s, size_t i) {
  if (s[i] == '\'') {
    if (const size_t e = contraction_end(s, i, true)) return e;
  }
  const Char c = char_at(s, i);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls == CharClass::kLetter) return run_end(s, i, CharClass::kLetter);
  if (c.cp != '\r' && c.cp != '\n' && c.cls != CharClass::kNumber && i + c.len < s.size() &&
      char_at(s, i + c.len).cls == CharClass::kLetter) {
    return run_end(s, i + c.len, CharClass::kLetter);
  }
  // \p{N}{1,3}
  if (c.cls == CharClass::kNumber) return run_end(s, i, CharClass::kNumber, 3);
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  size_t start = i;
  if (c.cp == ' ' && i + 1 < s.size() && char_at(s, i + 1).cls == CharClass::kOther) start = i + 1;
  if (start != i || c.cls == CharClass::kOther) {
    size_t j = run_end(s, start, CharClass::kOther);
    while (j < s.size() && (s[j] == '\r' || s[j] == '\n')) ++j;
    return j;
  }
  // \s*[\r\n]+: the white-space run up to its last line break.
  size_t j = i, after_break = 0;
  while (j < s.size()) {
    const Char d = char_at(s, j);
    if (d.cls != CharClass::kSpace) break;
    j += d.len;
    if (d.cp == '\r' || d.cp == '\n') after_break = j;
  }
  if (after_break != 0) return after_break;
  return space_run_end(s, i);
}

}  // namespace

namespace detail {

size_t pretoken_end(std::string_view text, size_t i, PreTokenizer p) {
  return p == PreTokenizer::kGpt2 ? gpt2_end(text, i) : llama3_end(text, i);
}

}  // namespace detail

std::string_view pretokenizer_name(PreTokenizer p) {
  return p == PreTokenizer::kGpt2 ? "gpt2" : "llama3";
}

PreTokenizer pretokenizer_from_name(std::string_view name) {
  if (name == "gpt2") return PreTokenizer::kGpt2;
  if (name == "llama3") return PreTokenizer::kLlama3;
  throw UserError(
      fmt::format("unknown pre-tokenizer '{}': the known ones are gpt2 and llama3", name));
}

std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer p) {
  std::vector<std::string_view> out;
  detail::for_each_pretoken(text, p, [&](std::string_view piece) { out.push_back(piece); });
  return out;
}

size_t pretoken_safe_split(std::string_view text, size_t min_pos) {
  // Between an ASCII letter and ASCII punctuation other than the apostrophe: in both patterns the
  // pre-token holding the letter is a run of letters (or a contraction) that ends there, whether
  // or not more text follows, and the next pre-token starts at the punctuation either way (the
  // patterns look ahead, never behind).
  auto is_letter = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  auto is_punct = [&](unsigned char c) {
    return c > ' ' && c < 0x7F && c != '\'' && !is_letter(c) && !(c >= '0' && c <= '9');
  };
  for (size_t q = std::max<size_t>(min_pos, 1); q < text.size(); ++q) {
    if (is_punct(static_cast<unsigned char>(text[q])) &&
        is_letter(static_cast<unsigned char>(text[q - 1]))) {
      return q;
    }
  }
  return text.size();
}

}  // namespace lowbit::data
