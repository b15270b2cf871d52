// Checkpoint save and load against the storage roofline measured in the same run: writing the
// same bytes with write() + fsync() (and reading them back), so the ratio shows what the
// format (index, XXH3 per record, staging through host copies) costs over plain I/O.
//
//   build/bin/zero_bench_checkpoint [--benchmark_min_time=1] ; ZERO_BENCH_DIR picks the file
//   system (default: the temporary directory).
//
// One rank, stage 1, AdamW: every element saves its fp32 weight and two moments (12 bytes).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace {

constexpr int64_t kParams = 8;                 // params of kElems elements each
constexpr int64_t kElems = int64_t{1} << 21;  // 2M: 8 × 2M × 12 bytes = 192 MiB per checkpoint

std::string Dir() {
  const char* dir = std::getenv("ZERO_BENCH_DIR");
  return (dir != nullptr ? std::string(dir) : std::filesystem::temp_directory_path().string()) + "/zerort-bench-ckpt";
}

struct Model {
  std::unique_ptr<zero::comm::Communicator> comm;
  std::unique_ptr<zero::Engine> engine;
};

Model Build(benchmark::State& state) {
  Model m;
  m.comm = std::move((*zero::comm::CreateLocalGroup(1))[0]);
  auto config = zero::Config::FromJson(R"({"stage": 1})");
  m.engine = std::move(*zero::Engine::Create(*config, *m.comm));
  std::vector<float> values(kElems, 0.25f);
  for (int p = 0; p < kParams; ++p) {
    (void)m.engine->RegisterParam({"w" + std::to_string(p), {kElems}});
  }
  if (!m.engine->Finalize().ok()) state.SkipWithError("Finalize failed");
  for (int p = 0; p < kParams; ++p) (void)m.engine->SetParam(p, values.data());
  return m;
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kParams * kElems * 12);
}

// Writes a checkpoint's worth of bytes to `path` with plain write() calls (and fsync when
// `sync`): the roofline's file. False if a write fell short.
bool WriteRawFile(const std::string& path, const std::vector<char>& chunk, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  bool written = fd >= 0;
  for (int p = 0; written && p < kParams * 3; ++p) {
    written = ::write(fd, chunk.data(), chunk.size()) == static_cast<ssize_t>(chunk.size());
  }
  if (sync) ::fsync(fd);
  ::close(fd);
  return written;
}

void BM_RawWriteAndSync(benchmark::State& state) {
  const std::string path = Dir() + "-raw.bin";
  std::vector<char> chunk(kElems * 4, 1);
  for (auto _ : state) {
    if (!WriteRawFile(path, chunk, /*sync=*/true)) state.SkipWithError("write");
  }
  SetBytes(state);
  std::filesystem::remove(path);
}
BENCHMARK(BM_RawWriteAndSync)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SaveCheckpoint(benchmark::State& state) {
  Model m = Build(state);
  for (auto _ : state) {
    if (!m.engine->SaveCheckpoint(Dir()).ok()) state.SkipWithError("SaveCheckpoint failed");
  }
  SetBytes(state);
  std::filesystem::remove_all(Dir());
}
BENCHMARK(BM_SaveCheckpoint)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RawRead(benchmark::State& state) {
  const std::string path = Dir() + "-raw.bin";
  std::vector<char> chunk(kElems * 4, 1);
  if (!WriteRawFile(path, chunk, /*sync=*/false)) state.SkipWithError("write");
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    for (int p = 0; p < kParams * 3; ++p) {
      if (::read(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) state.SkipWithError("read");
    }
    ::close(fd);
  }
  SetBytes(state);
  std::filesystem::remove(path);
}
BENCHMARK(BM_RawRead)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LoadCheckpoint(benchmark::State& state) {
  Model m = Build(state);
  if (!m.engine->SaveCheckpoint(Dir()).ok()) state.SkipWithError("SaveCheckpoint failed");
  for (auto _ : state) {
    if (!m.engine->LoadCheckpoint(Dir()).ok()) state.SkipWithError("LoadCheckpoint failed");
  }
  SetBytes(state);
  std::filesystem::remove_all(Dir());
}
BENCHMARK(BM_LoadCheckpoint)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
