// libFuzzer target: the checkpoint readers, driven through the public API: Engine::LoadCheckpoint
// (dir) on a 1-rank local engine (stage 2, AdamW) with a small registered model, exactly as a
// trainer resumes, then zero::CheckpointReader (Open, Verify, ReadParam) as zero-ckpt reads.
//
// A checkpoint directory holds meta.json and rank-R-of-N.bin files (runtime/checkpoint_format.h;
// format 3 starts with an index of records, formats 1 and 2 are scanned).
// At start-up the engine takes one real step and saves a real checkpoint; each fuzz input then
// becomes a checkpoint directory:
//   - input without the rank-file magic ("ZRTCKPT", then the format digit): the input is
//     meta.json, the rank file is the real one;
//   - input with the magic: the bytes before it are meta.json (none: the real meta.json), the
//     bytes from it on are the rank file.
// The rank file is written under every name the meta.json's "world" asks for (1..4; otherwise
// rank-0-of-1.bin), so mutated world sizes still reach the rank-file parser.
//
// The contract (DESIGN.md): a corrupt or hostile checkpoint gives a Status; the library never
// throws, aborts or exits. An exception escaping LoadCheckpoint, an ASan or UBSan report, an
// allocation over libFuzzer's -malloc_limit_mb (a size read from the file and trusted) or a
// time-out are crashes that libFuzzer saves.
//
// Seeds: tests/fuzz/corpus/checkpoint/ (this harness's real checkpoint: meta.json, the rank
// file, both joined). To write that checkpoint again (e.g. after a format change):
//   ZERO_FUZZ_KEEP_CHECKPOINT=/tmp/ckpt build-fuzz/bin/zero_fuzz_checkpoint -runs=0
// Dictionary: tests/fuzz/checkpoint.dict.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace {

constexpr std::string_view kMagic = "ZRTCKPT";  // every format's rank files start with it

// Ends the fuzzer at start-up when the harness itself cannot be set up (not a finding).
void Check(const zero::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "checkpoint_fuzzer setup: %s: %s\n", what, status.ToString().c_str());
    std::exit(2);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Harness {
  std::vector<std::unique_ptr<zero::comm::Communicator>> comms;
  std::unique_ptr<zero::Engine> engine;
  std::string root;       // this process's temporary directory
  std::string dir;        // the checkpoint each input becomes
  std::string real_meta;  // the real checkpoint's files
  std::string real_rank;

  ~Harness() {
    engine.reset();
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
};

Harness* harness = nullptr;

void SetUp() {
  harness = new Harness;
  std::atexit([] { delete harness; });
  std::string pattern = (std::filesystem::temp_directory_path() / "zerort-fuzz-ckpt-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("checkpoint_fuzzer setup: mkdtemp");
    std::exit(2);
  }
  harness->root = pattern;
  harness->dir = pattern + "/input";

  auto comms = zero::comm::CreateLocalGroup(1);
  Check(comms.status(), "CreateLocalGroup");
  harness->comms = std::move(*comms);
  auto config = zero::Config::FromJson(
      R"({"stage": 2, "buckets": {"reduce_bucket_elems": 256, "first_bucket_elems": 128}})");
  Check(config.status(), "Config");
  auto engine = zero::Engine::Create(*config, *harness->comms[0]);
  Check(engine.status(), "Engine::Create");
  zero::Engine& e = **engine;
  harness->engine = std::move(*engine);

  // A small MLP: two layers, and one frozen param (in meta.json, never in a rank file).
  const std::vector<zero::ParamSpec> specs = {
      {"fc1.weight", {16, 8}}, {"fc1.bias", {16}},
      {"norm.scale", {16}, zero::DType::kFP32, /*requires_grad=*/false},
      {"fc2.weight", {4, 16}}, {"fc2.bias", {4}}};
  for (const zero::ParamSpec& spec : specs) Check(e.RegisterParam(spec).status(), "RegisterParam");
  Check(e.Finalize(), "Finalize");
  for (size_t p = 0; p < specs.size(); ++p) {
    int64_t numel = 1;
    for (int64_t d : specs[p].shape) numel *= d;
    std::vector<float> values(static_cast<size_t>(numel));
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>((i * 7 + p) % 23) - 0.1f;
    Check(e.SetParam(static_cast<zero::ParamId>(p), values.data()), "SetParam");
  }
  // One step, so the moments are not all zero.
  Check(e.BeginIteration(), "BeginIteration");
  for (size_t p = specs.size(); p-- > 0;) {
    if (!specs[p].requires_grad) continue;
    int64_t numel = 1;
    for (int64_t d : specs[p].shape) numel *= d;
    std::vector<float> grad(static_cast<size_t>(numel), 0.5f);
    Check(e.AccumulateGrad(static_cast<zero::ParamId>(p), grad.data()), "AccumulateGrad");
  }
  Check(e.EndBackward(), "EndBackward");
  Check(e.Step().status(), "Step");

  const std::string real = harness->root + "/real";
  Check(e.SaveCheckpoint(real), "SaveCheckpoint");
  harness->real_meta = ReadFile(real + "/meta.json");
  harness->real_rank = ReadFile(real + "/rank-0-of-1.bin");
  Check(e.LoadCheckpoint(real), "LoadCheckpoint of the real checkpoint");
  if (const char* keep = std::getenv("ZERO_FUZZ_KEEP_CHECKPOINT")) {
    Check(e.SaveCheckpoint(keep), "SaveCheckpoint to ZERO_FUZZ_KEEP_CHECKPOINT");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  SetUp();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view meta = input, rank = harness->real_rank;
  if (const size_t magic = input.find(kMagic); magic != std::string_view::npos) {
    meta = magic == 0 ? std::string_view(harness->real_meta) : input.substr(0, magic);
    rank = input.substr(magic);
  }
  // The harness's own look at "world" (never throws): which rank-file names to write.
  int world = 1;
  const nlohmann::json parsed = nlohmann::json::parse(meta.begin(), meta.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    const auto it = parsed.find("world");
    if (it != parsed.end() && it->is_number_integer()) {
      const int64_t w = it->get<int64_t>();
      if (w >= 1 && w <= 4) world = static_cast<int>(w);
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(harness->dir, ignored);
  std::filesystem::create_directories(harness->dir, ignored);
  WriteFile(harness->dir + "/meta.json", meta);
  for (int q = 0; q < world; ++q) {
    WriteFile(harness->dir + "/rank-" + std::to_string(q) + "-of-" + std::to_string(world) + ".bin", rank);
  }
  // Any Status is a fine answer; only a crash is a finding.
  (void)harness->engine->LoadCheckpoint(harness->dir);
  // The same files through the engine-free reader (zero-ckpt's path), whose sizes come from
  // meta.json alone: every param it can hold in a bounded buffer.
  auto reader = zero::CheckpointReader::Open(harness->dir);
  if (reader.ok()) {
    (void)(*reader)->Verify();
    for (size_t p = 0; p < (*reader)->params().size(); ++p) {
      if ((*reader)->params()[p].numel > (int64_t{1} << 20)) continue;
      std::vector<float> values(static_cast<size_t>((*reader)->params()[p].numel));
      (void)(*reader)->ReadParam(static_cast<int>(p), values.data());
    }
  }
  return 0;
}
