// The pre-tokenizer's scanner (pretokenize.cpp), shared by the tokenizer and the BPE trainer.
#pragma once

#include <cstddef>
#include <string_view>

#include "lowbit/data/tokenizer.h"

namespace lowbit::data::detail {

// The end of the pre-token that starts at byte `i` of `text` (i < text.size()).
size_t pretoken_end(std::string_view text, size_t i, PreTokenizer p);

// Calls f(piece) for each pre-token of `text`, in order.
template <class F>
void for_each_pretoken(std::string_view text, PreTokenizer p, F&& f) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t e = pretoken_end(text, i, p);
    f(text.substr(i, e - i));
    i = e;
  }
}

}  // namespace lowbit::data::detail
