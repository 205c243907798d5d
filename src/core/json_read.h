// JSON that comes from files (checkpoints, model configs, tokenizers, corpora, shard manifests,
// safetensors headers) is parsed with a nesting limit. nlohmann's parser is iterative, but
// dump() — which error messages call to show the offending value — and the readers' own walks
// recurse once per level: a crafted document nested ~100k deep overflowed the stack. Real files
// nest a few levels (an HF tokenizer.json about six); deeper than kMaxJsonDepth is a UserError
// naming the file.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "lowbit/core/error.h"

namespace lowbit {

inline constexpr int kMaxJsonDepth = 128;

// Json::parse(input) with the limit; `what` names the source in the error (a path, "path:line").
// Syntax errors still throw nlohmann's parse_error, as Json::parse does.
template <class Json = nlohmann::json, class Input>
Json parse_json_limited(Input&& input, const std::string& what) {
  const typename Json::parser_callback_t limit = [&what](int depth, typename Json::parse_event_t,
                                                         Json&) {
    if (depth > kMaxJsonDepth) {
      throw UserError(
          fmt::format("{}: JSON nested deeper than {} levels; no file of this kind "
                      "nests that deep: it is damaged or not what it claims to be",
                      what, kMaxJsonDepth));
    }
    return true;
  };
  return Json::parse(std::forward<Input>(input), limit);
}

}  // namespace lowbit
