// The checkpoint's files: meta.json's fields checked one by one, rank files written index
// first and read record by record.
#include "runtime/checkpoint_format.h"

#include <fcntl.h>
#include <unistd.h>

// Header-only XXH3 (Debian's libxxhash-dev): nothing to link, and inlined into the loops.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/checkpoint_files.h"

namespace zero::runtime {
namespace {

constexpr char kMagicV1[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '1'};
constexpr char kMagicV2[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '2'};
constexpr char kMagicV3[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '3'};
constexpr int64_t kHeaderBytes = 16;      // magic, record count
constexpr int64_t kIndexEntryBytes = 40;  // param, pad, begin, numel, offset, checksum
constexpr int kMaxCheckpointWorld = 1 << 20;
constexpr int64_t kMaxStep = int64_t{1} << 62;
constexpr int64_t kMaxMetaBytes = int64_t{1} << 30;  // a million params' names and shapes fit
constexpr int kMaxMetaNesting = 16;  // meta.json's own fields are 3 deep

// Whether JSON text nests arrays and objects deeper than `limit` (strings skipped): nlohmann's
// dump and copies recurse, so a deep document must be refused before it is read.
bool NestedDeeperThan(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

Status SystemError(const char* what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("checkpoint: cannot ", what, " ", path, ": ", std::strerror(errno)));
}

Status FieldError(const std::string& path, const std::string& field, const char* expected) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, ": field \"", field,
                                                 "\" is missing or not ", expected));
}

template <typename T>
Status Field(const nlohmann::json& object, const char* key, const std::string& path,
             const std::string& field, T* out) {
  const auto it = object.find(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (it == object.end() || !it->is_string()) return FieldError(path, field, "a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (it == object.end() || !it->is_boolean()) return FieldError(path, field, "true or false");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (it == object.end() || !it->is_number()) return FieldError(path, field, "a number");
  } else {
    if (it == object.end() || !it->is_number_integer()) return FieldError(path, field, "an integer");
    const int64_t value = it->get<int64_t>();
    if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
      return FieldError(path, field, "an integer in range");
    }
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

Status ReadParams(const nlohmann::json& json, const std::string& path, CheckpointMeta* meta) {
  const auto params = json.find("params");
  if (params == json.end() || !params->is_array()) return FieldError(path, "params", "an array");
  for (size_t p = 0; p < params->size(); ++p) {
    const nlohmann::json& entry = (*params)[p];
    const std::string field = absl::StrCat("params[", p, "]");
    if (!entry.is_object()) return FieldError(path, field, "an object");
    CheckpointMeta::Param param;
    ZERO_RETURN_IF_ERROR(Field(entry, "name", path, field + ".name", &param.name));
    ZERO_RETURN_IF_ERROR(Field(entry, "dtype", path, field + ".dtype", &param.dtype));
    if (entry.contains("requires_grad")) {
      ZERO_RETURN_IF_ERROR(Field(entry, "requires_grad", path, field + ".requires_grad", &param.requires_grad));
    }
    param.saved = param.requires_grad;
    if (entry.contains("saved")) {
      ZERO_RETURN_IF_ERROR(Field(entry, "saved", path, field + ".saved", &param.saved));
      if (param.requires_grad && !param.saved) return FieldError(path, field + ".saved", "true for a trainable param");
      if (!param.requires_grad && param.saved && meta->format < kCheckpointFormatWithFrozen) {
        return FieldError(path, field + ".saved", "false for a frozen param below format 5");
      }
    }
    if (entry.contains("group")) {
      ZERO_RETURN_IF_ERROR(Field(entry, "group", path, field + ".group", &param.group));
      if (param.group < 0 || param.group > (1 << 20) || !param.requires_grad) {
        return FieldError(path, field + ".group", "a group index from 0 to 2^20, of a trainable param");
      }
    }
    if (entry.contains("aliases")) {
      const nlohmann::json& aliases = entry["aliases"];
      if (!aliases.is_array()) return FieldError(path, field + ".aliases", "an array of names");
      for (const nlohmann::json& alias : aliases) {
        if (!alias.is_string() || alias.get<std::string>().empty()) {
          return FieldError(path, field + ".aliases", "an array of names");
        }
        param.aliases.push_back(alias.get<std::string>());
      }
    }
    param.steps = meta->step;
    if (entry.contains("steps")) {
      ZERO_RETURN_IF_ERROR(Field(entry, "steps", path, field + ".steps", &param.steps));
      if (param.steps < 0 || param.steps > meta->step) {
        return FieldError(path, field + ".steps", "an integer from 0 to the checkpoint's step");
      }
    }
    const auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) return FieldError(path, field + ".shape", "an array");
    param.numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
        return FieldError(path, field + ".shape", "an array of sizes in [0, 2^40]");
      }
      param.shape.push_back(d.get<int64_t>());
      if (param.numel > (int64_t{1} << 50) / std::max<int64_t>(1, d.get<int64_t>())) {
        return FieldError(path, field + ".shape", "a shape of at most 2^50 elements");
      }
      param.numel *= d.get<int64_t>();
    }
    meta->params.push_back(std::move(param));
  }
  return absl::OkStatus();
}

// "rank_files": one 16-digit hex checksum per rank file (absent in older files).
Status ReadRankFiles(const nlohmann::json& json, const std::string& path, CheckpointMeta* meta) {
  const auto files = json.find("rank_files");
  if (files == json.end()) return absl::OkStatus();
  constexpr char kExpected[] = "an array of one 16-digit hex checksum per rank file";
  if (!files->is_array() || files->size() != static_cast<size_t>(meta->world)) {
    return FieldError(path, "rank_files", kExpected);
  }
  for (const nlohmann::json& entry : *files) {
    uint64_t checksum = 0;
    const std::string text = entry.is_string() ? entry.get<std::string>() : "";
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos ||
        !absl::SimpleHexAtoi(text, &checksum)) {
      return FieldError(path, "rank_files", kExpected);
    }
    meta->rank_files.push_back(checksum);
  }
  return absl::OkStatus();
}

// "groups": each optimizer group's hyperparameters (absent in older files). The values are
// checked against the config's ranges, so a damaged file cannot hand the kernels a bad one.
Status ReadGroups(const nlohmann::json& json, const std::string& path, CheckpointMeta* meta) {
  const auto groups = json.find("groups");
  if (groups == json.end()) return absl::OkStatus();
  if (!groups->is_array()) return FieldError(path, "groups", "an array");
  for (size_t g = 0; g < groups->size(); ++g) {
    const nlohmann::json& entry = (*groups)[g];
    const std::string field = absl::StrCat("groups[", g, "]");
    if (!entry.is_object()) return FieldError(path, field, "an object");
    OptimizerHyper h;
    ZERO_RETURN_IF_ERROR(Field(entry, "lr", path, field + ".lr", &h.lr));
    ZERO_RETURN_IF_ERROR(Field(entry, "beta1", path, field + ".beta1", &h.beta1));
    ZERO_RETURN_IF_ERROR(Field(entry, "beta2", path, field + ".beta2", &h.beta2));
    ZERO_RETURN_IF_ERROR(Field(entry, "eps", path, field + ".eps", &h.eps));
    ZERO_RETURN_IF_ERROR(Field(entry, "weight_decay", path, field + ".weight_decay", &h.weight_decay));
    ZERO_RETURN_IF_ERROR(Field(entry, "momentum", path, field + ".momentum", &h.momentum));
    ZERO_RETURN_IF_ERROR(Field(entry, "dampening", path, field + ".dampening", &h.dampening));
    ZERO_RETURN_IF_ERROR(Field(entry, "nesterov", path, field + ".nesterov", &h.nesterov));
    const Status valid = ValidateOptimizerHyper(h, field);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, ": ", valid.message()));
    }
    meta->groups.push_back(h);
  }
  return absl::OkStatus();
}

uint64_t Checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

// meta.json's checksum: the XXH3-64, in hex, of the compact JSON of every field but
// "checksum" (nlohmann writes keys sorted and numbers so that they read back the same, so the
// text is the same whenever the values are).
std::string MetaChecksum(const nlohmann::json& fields) {
  const std::string text = fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return absl::StrFormat("%016x", Checksum(text.data(), text.size()));
}

// Checks meta.json's "checksum" field against the other fields, and removes it.
Status CheckMetaChecksum(const std::string& path, nlohmann::json* json) {
  const auto it = json->find("checksum");
  if (it == json->end() || !it->is_string()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " has no checksum field (damaged?)"));
  }
  const std::string saved = it->get<std::string>();
  json->erase(it);
  if (MetaChecksum(*json) != saved) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is damaged: its checksum does not match "
                                            "its content (a byte changed after it was written)"));
  }
  return absl::OkStatus();
}

}  // namespace

Status CheckTiling(std::vector<std::pair<int64_t, int64_t>> spans, int64_t begin, int64_t end,
                   const std::string& what) {
  std::sort(spans.begin(), spans.end());
  int64_t covered = begin;
  for (const auto& [first, last] : spans) {
    if (first != covered) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint: ", what, ": elements ", first < covered ? "saved twice from " : "missing from ",
          std::min(first, covered), " (rank files of different saves?)"));
    }
    covered = last;
  }
  if (covered != end) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", what, ": elements [", covered, ", ", end,
                                            ") are in no rank file"));
  }
  return absl::OkStatus();
}

std::string TrimmedDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string RankFilePath(const std::string& dir, int rank, int world) {
  return absl::StrCat(dir, "/rank-", rank, "-of-", world, ".bin");
}

StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  StatusOr<std::string> text = ReadRegularFile(path, kMaxMetaBytes);
  if (!text.ok() && !absl::IsNotFound(text.status())) return text.status();
  if (!text.ok()) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error)) {
      if (std::filesystem::exists(dir + ".partial", error)) {
        return absl::NotFoundError(absl::StrCat(
            "checkpoint: ", dir, " does not exist; ", dir, ".partial is a save that did not finish "
            "(the job stopped while saving), not a checkpoint"));
      }
      return absl::NotFoundError(absl::StrCat("checkpoint: ", dir, " does not exist"));
    }
    return absl::NotFoundError(absl::StrCat("checkpoint: ", dir, " holds no meta.json (nor a `latest` "
                                            "file naming a checkpoint): not a ZeroRT checkpoint"));
  }
  if (NestedDeeperThan(*text, kMaxMetaNesting)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is nested more than ", kMaxMetaNesting,
                                                   " levels deep (damaged?)"));
  }
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not JSON (damaged?)"));
  }
  CheckpointMeta meta;
  ZERO_RETURN_IF_ERROR(Field(json, "format", path, "format", &meta.format));
  if (meta.format < 1 || meta.format > kCheckpointFormatWithFrozen) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " has format ", meta.format,
                                                   "; this ZeroRT reads formats 1 to ", kCheckpointFormatWithFrozen));
  }
  ZERO_RETURN_IF_ERROR(Field(json, "world", path, "world", &meta.world));
  if (meta.world < 1 || meta.world > kMaxCheckpointWorld) {
    return FieldError(path, "world", "an integer from 1 to 1048576");
  }
  if (meta.format >= 3 || json.contains("stage")) {
    ZERO_RETURN_IF_ERROR(Field(json, "stage", path, "stage", &meta.stage));
  }
  ZERO_RETURN_IF_ERROR(Field(json, "moments", path, "moments", &meta.moments));
  if (meta.moments < 0 || meta.moments > 2) return FieldError(path, "moments", "0, 1 or 2");
  ZERO_RETURN_IF_ERROR(Field(json, "step", path, "step", &meta.step));
  if (meta.step < 0 || meta.step > kMaxStep) return FieldError(path, "step", "an integer from 0 to 2^62");
  ZERO_RETURN_IF_ERROR(Field(json, "optimizer", path, "optimizer", &meta.optimizer));
  if (json.contains("series_seq")) {
    ZERO_RETURN_IF_ERROR(Field(json, "series_seq", path, "series_seq", &meta.series_seq));
    if (meta.series_seq < 0 || meta.series_seq > kMaxStep) return FieldError(path, "series_seq", "an integer ≥ 0");
  }
  const auto scaler = json.find("loss_scaler");
  if (scaler == json.end() || !scaler->is_object()) return FieldError(path, "loss_scaler", "an object");
  ZERO_RETURN_IF_ERROR(Field(*scaler, "scale", path, "loss_scaler.scale", &meta.scaler.scale));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "remaining_hysteresis", path, "loss_scaler.remaining_hysteresis",
                             &meta.scaler.remaining_hysteresis));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "iteration", path, "loss_scaler.iteration", &meta.scaler.iteration));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "last_overflow", path, "loss_scaler.last_overflow",
                             &meta.scaler.last_overflow));
  if (scaler->contains("mode")) {
    std::string mode;
    ZERO_RETURN_IF_ERROR(Field(*scaler, "mode", path, "loss_scaler.mode", &mode));
    if (mode == "none") meta.scaler.mode = LossScaleMode::kNone;
    else if (mode == "static") meta.scaler.mode = LossScaleMode::kStatic;
    else if (mode == "dynamic") meta.scaler.mode = LossScaleMode::kDynamic;
    else return FieldError(path, "loss_scaler.mode", "\"none\", \"static\" or \"dynamic\"");
  }
  const LossScaler::State& sc = meta.scaler;
  if (!std::isfinite(sc.scale) || sc.scale <= 0 || sc.scale > 0x1p64f) {
    return FieldError(path, "loss_scaler.scale", "a number > 0 and ≤ 2^64");
  }
  if (sc.remaining_hysteresis < 0 || sc.iteration < 0 || sc.iteration > kMaxStep || sc.last_overflow < -1 ||
      sc.last_overflow > sc.iteration) {
    return FieldError(path, "loss_scaler", "a loss scaler state in range (counts ≥ 0, last_overflow ≤ iteration)");
  }
  if (json.contains("user_data")) {
    ZERO_RETURN_IF_ERROR(Field(json, "user_data", path, "user_data", &meta.user_data));
  }
  ZERO_RETURN_IF_ERROR(ReadGroups(json, path, &meta));
  ZERO_RETURN_IF_ERROR(ReadParams(json, path, &meta));
  ZERO_RETURN_IF_ERROR(ReadRankFiles(json, path, &meta));
  // Last: a field that is damaged beyond reading is named above; any other change is here.
  // Required from format 4; checked in any file that has one (a format changed to 3 too).
  if (meta.format >= 4 || json.contains("checksum")) ZERO_RETURN_IF_ERROR(CheckMetaChecksum(path, &json));
  return meta;
}

int FormatFor(const CheckpointMeta& meta) {
  for (const CheckpointMeta::Param& p : meta.params) {
    if (p.saved && !p.requires_grad) return kCheckpointFormatWithFrozen;
  }
  return kCheckpointFormat;
}

StatusOr<std::string> CheckpointMetaJson(const CheckpointMeta& meta) {
  nlohmann::json json;
  json["format"] = meta.format;
  json["world"] = meta.world;
  json["stage"] = meta.stage;
  json["step"] = meta.step;
  json["optimizer"] = meta.optimizer;
  json["series_seq"] = meta.series_seq;
  json["moments"] = meta.moments;
  json["user_data"] = meta.user_data;
  const char* mode = meta.scaler.mode == LossScaleMode::kNone     ? "none"
                     : meta.scaler.mode == LossScaleMode::kStatic ? "static"
                                                                  : "dynamic";
  json["loss_scaler"] = {{"scale", meta.scaler.scale}, {"remaining_hysteresis", meta.scaler.remaining_hysteresis},
                         {"iteration", meta.scaler.iteration}, {"last_overflow", meta.scaler.last_overflow},
                         {"mode", mode}};
  json["groups"] = nlohmann::json::array();
  for (const OptimizerHyper& h : meta.groups) {
    json["groups"].push_back({{"lr", h.lr}, {"beta1", h.beta1}, {"beta2", h.beta2}, {"eps", h.eps},
                              {"weight_decay", h.weight_decay}, {"momentum", h.momentum},
                              {"dampening", h.dampening}, {"nesterov", h.nesterov}});
  }
  json["params"] = nlohmann::json::array();
  for (const CheckpointMeta::Param& p : meta.params) {
    json["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype},
                              {"requires_grad", p.requires_grad}, {"saved", p.saved}, {"steps", p.steps}});
    if (p.group >= 0) json["params"].back()["group"] = p.group;
    if (!p.aliases.empty()) json["params"].back()["aliases"] = p.aliases;
  }
  if (!meta.rank_files.empty()) {
    json["rank_files"] = nlohmann::json::array();
    for (const uint64_t checksum : meta.rank_files) json["rank_files"].push_back(absl::StrFormat("%016x", checksum));
  }
  if (meta.format >= 4) json["checksum"] = MetaChecksum(json);
  try {  // nlohmann throws on a string that is not UTF-8; the library never throws
    std::string text = json.dump(1) + "\n";
    if (static_cast<int64_t>(text.size()) > kMaxMetaBytes) {  // saved, it would not load
      return absl::ResourceExhaustedError(absl::StrCat(
          "checkpoint: meta.json would be ", text.size(), " bytes, above the ", kMaxMetaBytes,
          " a load reads; the trainer's user data is ", meta.user_data.size(),
          " bytes of it: keep large state (big buffers, data-loader state) in files of its own beside the "
          "checkpoint"));
    }
    return text;
  } catch (const nlohmann::json::type_error&) {
    return absl::InvalidArgumentError(
        "checkpoint: a param name or the trainer's user data is not UTF-8 text; JSON (meta.json) "
        "cannot hold it: encode binary user data (e.g. base64) first");
  }
}

Status CheckMetaText(std::string_view text, std::string_view what) {
  if (text.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), " holds a NUL byte at ", text.find('\0'),
        ", where C and Python callers would see the text end: encode binary data (e.g. base64) first"));
  }
  try {  // nlohmann's dump is the check meta.json's writing makes
    (void)nlohmann::json(std::string(text)).dump();
    return absl::OkStatus();
  } catch (const nlohmann::json::type_error&) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), " is not UTF-8 text, which a checkpoint's meta.json cannot hold: encode binary data (e.g. base64) "
              "first"));
  }
}

// ---- RankFileWriter ----

RankFileWriter::RankFileWriter(int fd, std::string path, std::vector<RecordExtent> records, int moments)
    : fd_(fd), path_(std::move(path)), records_(std::move(records)), moments_(moments) {}

RankFileWriter::~RankFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<RankFileWriter>> RankFileWriter::Create(const std::string& path,
                                                                  std::vector<RecordExtent> records,
                                                                  int moments) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("create", path);
  return std::unique_ptr<RankFileWriter>(new RankFileWriter(fd, path, std::move(records), moments));
}

Status RankFileWriter::Append(const float* values) {
  if (checksums_.size() >= records_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint: ", path_, ": more records than announced"));
  }
  const size_t bytes = static_cast<size_t>(PayloadFloats(records_[checksums_.size()], moments_)) * sizeof(float);
  if (checksums_.empty()) {  // the payloads start after the header, the index and its checksum
    const off_t start = kHeaderBytes + kIndexEntryBytes * static_cast<off_t>(records_.size()) + 8;
    if (::lseek(fd_, start, SEEK_SET) != start) return SystemError("seek in", path_);
  }
  checksums_.push_back(Checksum(values, bytes));
  return WriteAll(fd_, values, bytes, path_);
}

Status RankFileWriter::Close() {
  if (checksums_.size() != records_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint: ", path_, ": ", checksums_.size(),
                                                      " records appended, ", records_.size(), " announced"));
  }
  // The header and index, written last: a file cut short anywhere fails a checksum.
  std::vector<char> header(static_cast<size_t>(kHeaderBytes + kIndexEntryBytes * records_.size() + 8), 0);
  char* at = header.data();
  auto put = [&at](const auto& value) {
    std::memcpy(at, &value, sizeof value);
    at += sizeof value;
  };
  std::memcpy(at, kMagicV3, sizeof kMagicV3);
  at += sizeof kMagicV3;
  put(static_cast<int64_t>(records_.size()));
  uint64_t offset = static_cast<uint64_t>(header.size());
  for (size_t k = 0; k < records_.size(); ++k) {
    put(records_[k].param);
    put(int32_t{0});
    put(records_[k].begin);
    put(records_[k].numel);
    put(offset);
    put(checksums_[k]);
    offset += static_cast<uint64_t>(PayloadFloats(records_[k], moments_)) * sizeof(float);
  }
  index_checksum_ = Checksum(header.data(), header.size() - 8);
  put(index_checksum_);
  if (::lseek(fd_, 0, SEEK_SET) != 0) return SystemError("seek in", path_);
  ZERO_RETURN_IF_ERROR(WriteAll(fd_, header.data(), header.size(), path_));
  if (::fsync(fd_) != 0) return SystemError("sync", path_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return SystemError("close", path_);
  return absl::OkStatus();
}

// ---- RankFileReader ----

RankFileReader::~RankFileReader() { ::close(fd_); }

StatusOr<std::unique_ptr<RankFileReader>> RankFileReader::Open(const std::string& path,
                                                              const CheckpointMeta& meta, int rank) {
  StatusOr<OpenedFile> file = OpenRegularFile(path, absl::StatusCode::kDataLoss);
  if (absl::IsNotFound(file.status())) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is missing (the checkpoint is incomplete)"));
  }
  ZERO_RETURN_IF_ERROR(file.status());
  std::unique_ptr<RankFileReader> reader(new RankFileReader(file->fd, path, meta.moments, file->size));
  char magic[8] = {};
  ZERO_RETURN_IF_ERROR(reader->ReadAt(magic, sizeof magic, 0));
  if (std::memcmp(magic, kMagicV3, sizeof magic) == 0) {
    reader->format_ = 3;
    ZERO_RETURN_IF_ERROR(reader->ReadIndex(meta));
    ZERO_RETURN_IF_ERROR(reader->CheckSameSave(meta, rank));
  } else if (std::memcmp(magic, kMagicV2, sizeof magic) == 0 || std::memcmp(magic, kMagicV1, sizeof magic) == 0) {
    reader->format_ = magic[7] - '0';
    if (reader->format_ == 2) {
      ZERO_RETURN_IF_ERROR(VerifyChecksum(path));
      reader->bytes_read_ += reader->file_bytes_;
    }
    ZERO_RETURN_IF_ERROR(reader->ScanLegacy(meta));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not a ZeroRT rank file"));
  }
  if (reader->format_ != 3 && !meta.rank_files.empty()) {  // meta.json names a format-3 index
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is a rank file of format ", reader->format_,
                                            ", not the one this checkpoint's meta.json describes (a file "
                                            "copied from another save?)"));
  }
  return reader;
}

Status RankFileReader::CheckSameSave(const CheckpointMeta& meta, int rank) const {
  if (meta.rank_files.empty()) return absl::OkStatus();  // written before it was recorded
  if (rank < 0 || static_cast<size_t>(rank) >= meta.rank_files.size()) {
    return absl::InternalError(absl::StrCat("checkpoint: rank file ", rank, " asked of a checkpoint of ",
                                            meta.rank_files.size()));
  }
  if (index_checksum_ == meta.rank_files[rank]) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "checkpoint: %s is not the file this checkpoint saved: its index hashes to %016x, and meta.json "
      "records %016x for rank %d. It comes from another save (a rank file copied, or left over, from "
      "another checkpoint or step); nothing was loaded. Copy a checkpoint as a whole directory, or "
      "load an older one",
      path_, index_checksum_, meta.rank_files[rank], rank));
}

Status RankFileReader::ReadAt(void* out, int64_t bytes, int64_t offset) {
  char* next = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, next, static_cast<size_t>(bytes), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return SystemError("read", path_);
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is truncated (", file_bytes_,
                                              " bytes; the data goes on past its end)"));
    }
    next += got;
    bytes -= got;
    offset += got;
    bytes_read_ += got;
  }
  return absl::OkStatus();
}

Status RankFileReader::CheckExtent(RecordExtent* extent, const CheckpointMeta& meta, int64_t k) const {
  // A size read from the file is never trusted for an allocation (a fuzzed file asked for
  // 7e15 floats): the record must lie inside its param.
  const RecordExtent& e = *extent;
  if (e.param < 0 || static_cast<size_t>(e.param) >= meta.params.size()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is corrupt: record ", k, " names param ",
                                            e.param, " of ", meta.params.size()));
  }
  const CheckpointMeta::Param& p = meta.params[e.param];
  if (!p.saved) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is corrupt: record ", k, " holds \"", p.name,
                                            "\", which meta.json says was not saved (frozen)"));
  }
  if (e.begin < 0 || e.numel < 0 || e.begin > p.numel || e.numel > p.numel - e.begin) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is corrupt: record ", k, " holds elements [",
                                            e.begin, ", +", e.numel, ") of \"", p.name, "\", which has ", p.numel));
  }
  extent->weights_only = !p.requires_grad;
  return absl::OkStatus();
}

Status RankFileReader::ReadIndex(const CheckpointMeta& meta) {
  int64_t count = 0;
  ZERO_RETURN_IF_ERROR(ReadAt(&count, sizeof count, 8));
  if (count < 0 || count > (file_bytes_ - kHeaderBytes - 8) / kIndexEntryBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is corrupt or truncated: its header "
                                            "announces ", count, " records, more than its ", file_bytes_,
                                            " bytes can hold"));
  }
  std::vector<char> header(static_cast<size_t>(kHeaderBytes + kIndexEntryBytes * count + 8));
  ZERO_RETURN_IF_ERROR(ReadAt(header.data(), static_cast<int64_t>(header.size()), 0));
  uint64_t stored = 0;
  std::memcpy(&stored, header.data() + header.size() - 8, sizeof stored);
  const uint64_t computed = Checksum(header.data(), header.size() - 8);
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint: %s is corrupt: its index hashes to %016x but records %016x (a damaged or partly "
        "written file); load an older checkpoint", path_, computed, stored));
  }
  index_checksum_ = stored;
  const char* at = header.data() + kHeaderBytes;
  auto get = [&at](auto* value) {
    std::memcpy(value, at, sizeof *value);
    at += sizeof *value;
  };
  uint64_t expected_offset = header.size();
  for (int64_t k = 0; k < count; ++k) {
    Record r;
    int32_t pad = 0;
    get(&r.param);
    get(&pad);
    get(&r.begin);
    get(&r.numel);
    get(&r.offset);
    get(&r.checksum);
    ZERO_RETURN_IF_ERROR(CheckExtent(&r, meta, k));
    if (r.offset != expected_offset) {
      return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is corrupt: record ", k, " starts at ",
                                              r.offset, ", expected ", expected_offset));
    }
    // Each record must fit in what is left of the file (no sum can wrap around).
    const uint64_t bytes = static_cast<uint64_t>(PayloadFloats(r, moments_)) * sizeof(float);
    if (bytes > static_cast<uint64_t>(file_bytes_) - std::min<uint64_t>(expected_offset, file_bytes_)) {
      return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is truncated: record ", k, " (", bytes,
                                              " bytes at ", expected_offset, ") goes past its end (", file_bytes_,
                                              " bytes)"));
    }
    expected_offset += bytes;
    records_.push_back(r);
  }
  if (expected_offset != static_cast<uint64_t>(file_bytes_)) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is ",
                                            expected_offset > static_cast<uint64_t>(file_bytes_) ? "truncated" : "corrupt",
                                            ": its index describes ", expected_offset, " bytes, the file has ",
                                            file_bytes_));
  }
  return absl::OkStatus();
}

Status RankFileReader::ScanLegacy(const CheckpointMeta& meta) {
  int64_t offset = 8;
  int64_t count = std::numeric_limits<int64_t>::max();
  int64_t end = file_bytes_;
  if (format_ == 1) {
    ZERO_RETURN_IF_ERROR(ReadAt(&count, sizeof count, offset));
    offset += 8;
  } else {
    end -= static_cast<int64_t>(sizeof(int64_t) + kChecksumBytes);  // the record count, the checksum
  }
  for (int64_t k = 0; k < count; ++k) {
    if (format_ == 2 && offset >= end) {
      int64_t written = -1;
      ZERO_RETURN_IF_ERROR(ReadAt(&written, sizeof written, offset));
      if (written != k) {
        return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " holds ", k,
                                                " records but its footer says ", written));
      }
      break;
    }
    Record r;
    ZERO_RETURN_IF_ERROR(ReadAt(&r.param, sizeof r.param, offset));
    ZERO_RETURN_IF_ERROR(ReadAt(&r.begin, sizeof r.begin, offset + 4));
    ZERO_RETURN_IF_ERROR(ReadAt(&r.numel, sizeof r.numel, offset + 12));
    ZERO_RETURN_IF_ERROR(CheckExtent(&r, meta, k));
    r.offset = static_cast<uint64_t>(offset + 20);
    offset += 20 + PayloadFloats(r, moments_) * static_cast<int64_t>(sizeof(float));
    if (offset > end) {
      return absl::DataLossError(absl::StrCat("checkpoint: ", path_, " is truncated (record ", k, ")"));
    }
    records_.push_back(r);
  }
  return absl::OkStatus();
}

Status RankFileReader::Read(size_t k, std::vector<float>* values) {
  const Record& r = records_.at(k);
  values->resize(static_cast<size_t>(PayloadFloats(r, moments_)));
  const int64_t bytes = static_cast<int64_t>(values->size() * sizeof(float));
  ZERO_RETURN_IF_ERROR(ReadAt(values->data(), bytes, static_cast<int64_t>(r.offset)));
  if (format_ == 3) {
    const uint64_t computed = Checksum(values->data(), static_cast<size_t>(bytes));
    if (computed != r.checksum) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint: %s is corrupt: record %d (elements [%d, +%d) of param %d) hashes to %016x but its "
          "index records %016x; load an older checkpoint", path_, k, r.begin, r.numel, r.param, computed,
          r.checksum));
    }
  }
  return absl::OkStatus();
}

}  // namespace zero::runtime
