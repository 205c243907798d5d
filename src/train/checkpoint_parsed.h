// The parsed trainer.json a CheckpointInfo carries (lowbit/train/checkpoint.h), for the train
// layer's own readers: the trainer takes its train_config from it instead of parsing the text
// again. Outside src/train the handle stays opaque.
#pragma once

#include <nlohmann/json.hpp>

#include "lowbit/train/checkpoint.h"

namespace lowbit {

struct CheckpointInfo::Parsed {
  nlohmann::ordered_json trainer;  // checked by read_checkpoint()
};

}  // namespace lowbit
