// JSON that comes from files (checkpoints, model configs, tokenizers, corpora, shard manifests,
// safetensors headers) is parsed with a nesting limit. nlohmann's parser is iterative, but
// dump() — which error messages call to show the offending value — and the readers' own walks
// recurse once per level: a crafted document nested ~100k deep overflowed the stack. Real files
// nest a few levels (an HF tokenizer.json about six); deeper than kMaxJsonDepth is a UserError
// naming the file.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "lowbit/core/error.h"

namespace lowbit {

inline constexpr int kMaxJsonDepth = 128;

// Json::parse(input) with the limit; `what` names the source in the error (a path, "path:line").
// With unique_top_level_keys, a key repeated in the top-level object is a UserError too (JSON
// keeps the last one silently; in a safetensors header that would hide a tensor). Syntax errors
// still throw nlohmann's parse_error, as Json::parse does.
template <class Json = nlohmann::json, class Input>
Json parse_json_limited(Input&& input, const std::string& what,
                        bool unique_top_level_keys = false) {
  std::set<std::string> top_keys;
  const typename Json::parser_callback_t limit = [&](int depth, typename Json::parse_event_t event,
                                                     Json& parsed) {
    if (depth > kMaxJsonDepth) {
      throw UserError(
          fmt::format("{}: JSON nested deeper than {} levels; no file of this kind "
                      "nests that deep: it is damaged or not what it claims to be",
                      what, kMaxJsonDepth));
    }
    if (unique_top_level_keys && depth == 1 && event == Json::parse_event_t::key &&
        parsed.is_string() && !top_keys.insert(parsed.template get<std::string>()).second) {
      throw UserError(fmt::format("{}: the key '{}' appears twice; the file is damaged", what,
                                  parsed.template get<std::string>()));
    }
    return true;
  };
  return Json::parse(std::forward<Input>(input), limit);
}

// j[key] when j is an object holding a value of that kind under key, else `fallback`
// (nlohmann's value() throws a type_error when the key is present with another type: a file
// with "format": 5 must get the reader's own message, not an internal error).
template <class Json>
std::string json_string_or(const Json& j, const char* key, const std::string& fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->template get<std::string>() : fallback;
}
template <class Json>
int64_t json_int_or(const Json& j, const char* key, int64_t fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->template get<int64_t>() : fallback;
}

}  // namespace lowbit
