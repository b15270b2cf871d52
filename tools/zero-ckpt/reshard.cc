// zero-ckpt reshard: the checkpoint loaded by `world` in-process engines and saved again, so
// its files have the shape a job at that rank count reads (each rank one file of its own).
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::tools {
namespace {

// The engine configuration that reads and writes the checkpoint: its optimizer (for the
// number of moment buffers), stage 1 (sharded states, full params: the saved records have
// the same layout at stages 1-3, and meta.json's stage is informative).
StatusOr<Config> ConfigFor(const CheckpointReader& reader) {
  ZERO_ASSIGN_OR_RETURN(Config config, Config::FromJson(absl::StrCat(R"({"stage": 1, "optimizer": {"type": ")",
                                                                     reader.optimizer(), R"("}})")));
  // SGD keeps a momentum buffer only with momentum > 0; its value does not matter here.
  if (config.optimizer.type == OptimizerType::kSgd && reader.moments() == 1) config.optimizer.momentum = 0.9f;
  config.guard.timeout_s = 600;
  return config;
}

Status ReshardOnRank(const CheckpointReader& reader, const Config& config, comm::Communicator& comm,
                     const std::string& dir, const std::string& out) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  for (const CheckpointReader::Param& p : reader.params()) {
    ZERO_RETURN_IF_ERROR(engine->RegisterParam({p.name, p.shape, p.dtype, p.saved}).status());
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(dir));
  return engine->SaveCheckpoint(out);
}

}  // namespace

Status Reshard(const std::string& dir, int world, const std::string& out) {
  if (world < 1 || world > 4096) return absl::InvalidArgumentError(absl::StrCat("--world ", world, ": 1 to 4096"));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  ZERO_RETURN_IF_ERROR(OutputOutsideCheckpoint(reader->dir(), out));
  ZERO_ASSIGN_OR_RETURN(const Config config, ConfigFor(*reader));
  ZERO_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> group, comm::CreateLocalGroup(world));
  std::vector<Status> statuses(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] { statuses[r] = ReshardOnRank(*reader, config, *group[r], reader->dir(), out); });
  }
  for (std::thread& t : ranks) t.join();
  for (const Status& s : statuses) ZERO_RETURN_IF_ERROR(s);
  std::printf("%s (world %d, step %lld) -> %s (world %d)\n", reader->dir().c_str(), reader->world(),
              static_cast<long long>(reader->step()), out.c_str(), world);
  return absl::OkStatus();
}

}  // namespace zero::tools
