// The C ABI's checkpoint reader (zero_ckpt_*): zero::CheckpointReader for callers without
// C++, described as JSON so that one call tells everything but the values.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

#include "runtime/c_api_status.h"
#include "runtime/checkpoint_series.h"
#include "zero/checkpoint.h"
#include "zero/zero.h"

struct zero_ckpt_reader {
  std::unique_ptr<zero::CheckpointReader> reader;
  std::string description;  // the text zero_ckpt_describe returned last
};

using zero::c_api::Report;

namespace {

nlohmann::ordered_json Describe(const zero::CheckpointReader& reader) {
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const zero::CheckpointReader::Param& p : reader.params()) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"dtype", zero::DTypeName(p.dtype)},
                      {"numel", p.numel},
                      {"requires_grad", p.requires_grad},
                      {"saved", p.saved},
                      {"aliases", p.aliases}});
  }
  return {{"dir", reader.dir()},
          {"format", reader.format()},
          {"world", reader.world()},
          {"stage", reader.stage()},
          {"step", reader.step()},
          {"optimizer", reader.optimizer()},
          {"loss_scale", reader.loss_scale()},
          {"user_data", reader.user_data()},
          {"params", std::move(params)}};
}

}  // namespace

extern "C" {

zero_status zero_ckpt_open(const char* dir, zero_ckpt_reader** out) try {
  ZERO_C_REQUIRE(dir, "zero_ckpt_open");
  ZERO_C_REQUIRE(out, "zero_ckpt_open");
  *out = nullptr;
  auto reader = zero::CheckpointReader::Open(dir);
  if (!reader.ok()) return Report(reader.status());
  *out = new zero_ckpt_reader{std::move(*reader), {}};
  return ZERO_OK;
} ZERO_C_CATCH("zero_ckpt_open")

zero_status zero_ckpt_describe(zero_ckpt_reader* reader, const char** json) try {
  ZERO_C_REQUIRE(reader, "zero_ckpt_describe");
  ZERO_C_REQUIRE(json, "zero_ckpt_describe");
  // Names and user data are the trainer's bytes: replace what is not UTF-8 rather than throw.
  reader->description = Describe(*reader->reader).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  *json = reader->description.c_str();
  return ZERO_OK;
} ZERO_C_CATCH("zero_ckpt_describe")

zero_status zero_ckpt_verify(zero_ckpt_reader* reader) try {
  ZERO_C_REQUIRE(reader, "zero_ckpt_verify");
  return Report(reader->reader->Verify());
} ZERO_C_CATCH("zero_ckpt_verify")

zero_status zero_ckpt_read_param(zero_ckpt_reader* reader, int64_t index, float* out) try {
  ZERO_C_REQUIRE(reader, "zero_ckpt_read_param");
  ZERO_C_REQUIRE(out, "zero_ckpt_read_param");
  const int64_t params = static_cast<int64_t>(reader->reader->params().size());
  if (index < 0 || index >= params) {
    return Report(absl::InvalidArgumentError(absl::StrCat("zero_ckpt_read_param: index ", index, " is not a param of ",
                                                     reader->reader->dir(), " (it holds ", params, ")")));
  }
  return Report(reader->reader->ReadParam(static_cast<int>(index), out));
} ZERO_C_CATCH("zero_ckpt_read_param")

void zero_ckpt_close(zero_ckpt_reader* reader) { delete reader; }

zero_status zero_ckpt_resolve(const char* dir, const char** out) try {
  ZERO_C_REQUIRE(dir, "zero_ckpt_resolve");
  ZERO_C_REQUIRE(out, "zero_ckpt_resolve");
  thread_local std::string resolved;
  auto path = zero::runtime::ResolveCheckpointDir(dir);
  if (!path.ok()) return Report(path.status());
  resolved = std::move(*path);
  *out = resolved.c_str();
  return ZERO_OK;
} ZERO_C_CATCH("zero_ckpt_resolve")

}  // extern "C"
