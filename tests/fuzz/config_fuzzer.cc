// libFuzzer target: zero::Config::FromJson (runtime/config.cc) on arbitrary bytes.
//
// The contract (include/zero/config.h, DESIGN.md): any text gives either a Config that passes
// Validate() or a Status; the library never throws, aborts or exits. So every input must
// return here: an exception escaping FromJson (std::terminate -> abort), an ASan report or a
// UBSan report (e.g. a float -> int conversion out of range) is a crash that libFuzzer saves.
//
// Seeds: tests/fuzz/corpus/config/ (valid configs); dictionary: tests/fuzz/config.dict.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "zero/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zero::StatusOr<zero::Config> config = zero::Config::FromJson(text);
  if (config.ok()) {
    // What FromJson returns has been validated: validating it again must agree.
    if (!config->Validate().ok()) std::abort();
    (void)zero::OptimizerTypeName(config->optimizer.type);
  } else {
    (void)config.status().ToString();
  }
  return 0;
}
