// Checkpoints: saved during training, resumed at the same world size and stage (bit-identical
// continuation) and at other world sizes and stages (the same trajectory within float summation
// order), with clear errors for a different model or optimizer.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/engine/toy_trainer.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/status_matchers.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;

std::vector<ToyResult> Train(int world, const Config& config, const ToyOptions& options, std::vector<Status>* statuses) {
  std::vector<ToyResult> results(world);
  *statuses = testing::RunOnRanks(world, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    return testing::TrainToy(*engine, options, &results[r]);
  });
  return results;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ScratchDir("zerort-ckpt");
    // The uninterrupted run: 20 steps on 2 ranks at stage 2, saved after step 9.
    ToyOptions full;
    full.steps = 20;
    full.save_dir = dir_;
    full.save_after = 9;
    std::vector<Status> statuses;
    full_ = Train(2, ToyConfig(2), full, &statuses)[0];
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ToyOptions Resume() const {
    ToyOptions o;
    o.steps = 10;
    o.first_step = 10;
    o.load_dir = dir_;
    return o;
  }

  std::string dir_;
  ToyResult full_;
};

TEST_F(Checkpoint, ResumesBitIdenticallyAtTheSameWorldSizeAndStage) {
  std::vector<Status> statuses;
  const ToyResult resumed = Train(2, ToyConfig(2), Resume(), &statuses)[0];
  ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_EQ(resumed.losses, std::vector<double>(full_.losses.begin() + 10, full_.losses.end()));
  EXPECT_EQ(resumed.final_params, full_.final_params);
  EXPECT_EQ(resumed.infos.back().step, full_.infos.back().step);  // the step count came back
}

TEST_F(Checkpoint, ResumesAtAnyWorldSizeAndStage) {
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{1, 0}, {3, 1}, {4, 3}, {3, 2}}) {
    std::vector<Status> statuses;
    const ToyResult resumed = Train(world, ToyConfig(stage), Resume(), &statuses)[0];
    ASSERT_THAT(statuses, Each(IsOk())) << "world " << world << " stage " << stage;
    for (size_t i = 0; i < resumed.losses.size(); ++i) {
      EXPECT_NEAR(resumed.losses[i], full_.losses[10 + i], 1e-5 * full_.losses[10 + i])
          << "world " << world << " stage " << stage << " step " << 10 + i;
    }
  }
}

TEST_F(Checkpoint, ADifferentModelOrOptimizerIsAClearError) {
  auto group = comm::CreateLocalGroup(1);
  {
    auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
    ASSERT_THAT(engine, IsOk());
    ASSERT_THAT((*engine)->RegisterParam({"fc1.weight", {37, 14}}), IsOk());  // 14, not 13
    ASSERT_THAT((*engine)->Finalize(), IsOk());
    EXPECT_THAT((*engine)->LoadCheckpoint(dir_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fc1.weight")));
  }
  Config sgd = ToyConfig(2);
  sgd.optimizer.type = OptimizerType::kSgd;
  ToyOptions o = Resume();
  std::vector<Status> statuses;
  Train(1, sgd, o, &statuses);
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer")));
  o.load_dir = dir_ + "-missing";
  Train(1, ToyConfig(2), o, &statuses);
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kNotFound));
}

// An engine with the toy model registered (the checkpoint's model), and its params' values.
struct LoadedToy {
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<Engine> engine;
};

LoadedToy ToyEngine(const std::string& dir_to_load) {
  auto group = comm::CreateLocalGroup(1);
  LoadedToy toy{std::move((*group)[0]), nullptr};
  auto engine = Engine::Create(ToyConfig(2), *toy.comm);
  EXPECT_THAT(engine, IsOk());
  toy.engine = std::move(*engine);
  const std::vector<std::pair<const char*, std::vector<int64_t>>> specs = {
      {"fc1.weight", {37, 13}}, {"fc1.bias", {37}}, {"fc2.weight", {5, 37}}, {"fc2.bias", {5}}};
  for (size_t p = 0; p < specs.size(); ++p) {
    EXPECT_THAT(toy.engine->RegisterParam({specs[p].first, specs[p].second, DType::kFP32, true, 0,
                                           static_cast<int>(p / 2)}),
                IsOk());
  }
  EXPECT_THAT(toy.engine->Finalize(), IsOk());
  if (!dir_to_load.empty()) {
    EXPECT_THAT(toy.engine->LoadCheckpoint(dir_to_load), IsOk());
  }
  return toy;
}

std::vector<float> Param0(Engine& engine) {
  std::vector<float> values(13 * 37);
  EXPECT_THAT(engine.GetParam(0, values.data()), IsOk());
  return values;
}

// Frozen params have no records: a stage-3 run that registers a model's frozen base (and a
// stage-2 run that leaves it out) save and load each other's checkpoints. The trainable params
// are matched in order; a param frozen on one side and trainable on the other is an error.
TEST_F(Checkpoint, FrozenParamsRegisteredOnOneSideOnlyAreNoDifference) {
  const std::vector<float> want = Param0(*ToyEngine(dir_).engine);
  // embed.weight registered first, or last (as zerort.torch registers frozen params).
  auto with_frozen = [](bool trainable_embed, bool embed_last = false) {
    auto group = comm::CreateLocalGroup(1);
    LoadedToy toy{std::move((*group)[0]), nullptr};
    toy.engine = std::move(*Engine::Create(ToyConfig(3), *toy.comm));
    const ParamSpec embed{"embed.weight", {7, 3}, DType::kFP32, trainable_embed, 0, 9};
    if (!embed_last) {
      EXPECT_THAT(toy.engine->RegisterParam(embed), IsOk());
    }
    const std::vector<std::pair<const char*, std::vector<int64_t>>> specs = {
        {"fc1.weight", {37, 13}}, {"fc1.bias", {37}}, {"fc2.weight", {5, 37}}, {"fc2.bias", {5}}};
    for (size_t p = 0; p < specs.size(); ++p) {
      EXPECT_THAT(toy.engine->RegisterParam({specs[p].first, specs[p].second, DType::kFP32, true, 0, static_cast<int>(p / 2)}),
                  IsOk());
    }
    if (embed_last) {
      EXPECT_THAT(toy.engine->RegisterParam(embed), IsOk());
    }
    EXPECT_THAT(toy.engine->Finalize(), IsOk());
    return toy;
  };
  LoadedToy frozen = with_frozen(false);
  const std::vector<float> embed(21, 0.5f);
  ASSERT_THAT(frozen.engine->SetParam(0, embed.data()), IsOk());
  ASSERT_THAT(frozen.engine->LoadCheckpoint(dir_), IsOk());  // saved without embed.weight
  std::vector<float> fc1(13 * 37), kept(21);
  ASSERT_THAT(frozen.engine->GetParam(1, fc1.data()), IsOk());
  EXPECT_EQ(fc1, want);
  ASSERT_THAT(frozen.engine->GetParam(0, kept.data()), IsOk());
  EXPECT_EQ(kept, embed) << "a frozen param the checkpoint does not have keeps its values";
  const std::string again = dir_ + "-with-frozen";
  ASSERT_THAT(frozen.engine->SaveCheckpoint(again), IsOk());
  EXPECT_EQ(Param0(*ToyEngine(again).engine), want);  // loaded where embed.weight is not registered
  EXPECT_THAT(with_frozen(true).engine->LoadCheckpoint(again),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"embed.weight\" was frozen when saved")));
  // Saved frozen and last, loaded trainable and first: named as the param that changed, not as
  // the positional mismatch it makes of the trainable params ("fc1.weight" against it).
  const std::string last = dir_ + "-frozen-last";
  ASSERT_THAT(with_frozen(false, true).engine->SaveCheckpoint(last), IsOk());
  EXPECT_THAT(with_frozen(true).engine->LoadCheckpoint(last),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"embed.weight\" was frozen when saved")));
  std::filesystem::remove_all(again);
  std::filesystem::remove_all(last);
}

void FlipByte(const std::string& path, std::streamoff at) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(at);
  char c = 0;
  file.get(c);
  file.seekp(at);
  file.put(static_cast<char>(c ^ 0x40));
}

TEST_F(Checkpoint, DamageAnywhereIsAnErrorNamingTheFileAndLoadsNothing) {
  const std::string copy = dir_ + "-copy";
  LoadedToy toy = ToyEngine(dir_);  // the engine holds the checkpoint's values
  const std::vector<float> before = Param0(*toy.engine);
  const std::string victim = copy + "/rank-1-of-2.bin";
  const auto size = static_cast<std::streamoff>(std::filesystem::file_size(dir_ + "/rank-1-of-2.bin"));
  int64_t records = 0;
  std::ifstream(dir_ + "/rank-1-of-2.bin", std::ios::binary).seekg(8).read(reinterpret_cast<char*>(&records), 8);
  const std::streamoff index_checksum = 16 + 40 * records;
  // Flipped bytes: the magic, the record count, an index entry, the index's checksum, the
  // first payload, the middle, the last byte.
  for (const std::streamoff at : {std::streamoff{3}, std::streamoff{9}, std::streamoff{30}, index_checksum + 2,
                                  index_checksum + 8, size / 2, size - 1}) {
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir_, copy);
    FlipByte(victim, at);
    EXPECT_THAT(toy.engine->LoadCheckpoint(copy),
                AnyOf(StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1-of-2.bin")),
                      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank-1-of-2.bin"))))
        << "byte " << at;
    EXPECT_EQ(Param0(*toy.engine), before) << "byte " << at << ": half loaded";
  }
  // Truncated at several lengths, or with bytes appended.
  for (const std::streamoff length : {std::streamoff{5}, std::streamoff{20}, index_checksum + 4, size / 2, size - 1,
                                      size + 1}) {
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir_, copy);
    std::filesystem::resize_file(victim, static_cast<uintmax_t>(length));
    EXPECT_THAT(toy.engine->LoadCheckpoint(copy), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1-of-2.bin")))
        << "length " << length;
    EXPECT_EQ(Param0(*toy.engine), before) << "length " << length << ": half loaded";
  }
  // A rank file missing.
  std::filesystem::remove(victim);
  EXPECT_THAT(toy.engine->LoadCheckpoint(copy), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("missing")));
  std::filesystem::remove_all(copy);
}

// meta.json's text as a save before rank files were named wrote it: no "rank_files", and as
// format 3, which has no checksum to recompute.
std::string StripMetaChecksumAndRankFiles(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text);
  json.erase("rank_files");
  json.erase("checksum");
  json["format"] = 3;
  return json.dump(1);
}

// Every rank file of another save has the same layout (same world, stage and params), so its
// records tile the params exactly as the right file's would: meta.json names each rank file by
// its index checksum, and a loader, the reader and a reshard refuse a file it does not name.
TEST_F(Checkpoint, ARankFileOfAnotherSaveIsRefusedAndLoadsNothing) {
  const std::string later = dir_ + "-later", mixed = dir_ + "-mixed", out = dir_ + "-resharded";
  ToyOptions o = Resume();
  o.save_dir = later;
  o.save_after = 14;
  std::vector<Status> statuses;
  Train(2, ToyConfig(2), o, &statuses);
  ASSERT_THAT(statuses, Each(IsOk()));
  std::filesystem::copy(dir_, mixed);
  std::filesystem::copy_file(later + "/rank-1-of-2.bin", mixed + "/rank-1-of-2.bin",
                             std::filesystem::copy_options::overwrite_existing);
  LoadedToy toy = ToyEngine(dir_);
  const std::vector<float> before = Param0(*toy.engine);
  EXPECT_THAT(toy.engine->LoadCheckpoint(mixed),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("rank-1-of-2.bin"), HasSubstr("another save"))));
  EXPECT_EQ(Param0(*toy.engine), before) << "half loaded";
  auto reader = CheckpointReader::Open(mixed);
  ASSERT_THAT(reader, IsOk());
  EXPECT_THAT((*reader)->files()[0].status, IsOk());
  EXPECT_THAT((*reader)->files()[1].status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("another save")));
  EXPECT_THAT(ReshardCheckpoint(mixed, 3, out), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("another save")));
  EXPECT_FALSE(std::filesystem::exists(out));
  // A resharded checkpoint names its own files, and loads.
  ASSERT_THAT(ReshardCheckpoint(dir_, 3, out), IsOk());
  EXPECT_THAT(toy.engine->LoadCheckpoint(out), IsOk());
  EXPECT_EQ(Param0(*toy.engine), before);
  // meta.json written before files were named (no "rank_files"; format 3, no checksum) loads.
  std::ifstream meta_in(dir_ + "/meta.json");
  std::string meta((std::istreambuf_iterator<char>(meta_in)), std::istreambuf_iterator<char>());
  ASSERT_NE(meta.find("\"rank_files\""), std::string::npos);
  const std::string stripped = StripMetaChecksumAndRankFiles(meta);
  std::filesystem::remove_all(mixed);
  std::filesystem::copy(dir_, mixed);
  std::ofstream(mixed + "/meta.json") << stripped;
  EXPECT_THAT(toy.engine->LoadCheckpoint(mixed), IsOk());
  EXPECT_EQ(Param0(*toy.engine), before);
  for (const std::string& d : {later, mixed, out}) std::filesystem::remove_all(d);
}

TEST_F(Checkpoint, ADamagedMetaFieldIsNamedNeverThrown) {
  const std::string copy = dir_ + "-meta";
  LoadedToy toy = ToyEngine("");
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"world", "\"two\""}, {"world", "-3"}, {"step", "1.5"}, {"optimizer", "7"},
           {"loss_scaler", "[]"}, {"params", "{}"}, {"moments", "1e300"}}) {
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir_, copy);
    std::ifstream in(copy + "/meta.json");
    std::string meta((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t key = meta.find("\"" + field + "\"");
    ASSERT_NE(key, std::string::npos) << field;
    const size_t start = meta.find(':', key) + 1;
    size_t end = start;
    for (int depth = 0; end < meta.size(); ++end) {  // the value: up to the next , or } at depth 0
      const char c = meta[end];
      if (c == '[' || c == '{') ++depth;
      if (c == ']' || c == '}') {
        if (depth == 0) break;
        --depth;
      }
      if (c == ',' && depth == 0) break;
    }
    meta.replace(start, end - start, " " + value);
    std::ofstream(copy + "/meta.json") << meta;
    EXPECT_THAT(toy.engine->LoadCheckpoint(copy), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)))
        << field;
  }
  std::filesystem::remove_all(copy);
}

// Damage that leaves meta.json valid (another step, another loss scale, a misspelt user_data
// key) is caught by its checksum; a meta.json that is a directory, and a `latest` file that a
// crash left zeroed, are errors, not a thrown exception.
TEST_F(Checkpoint, MetaJsonChangesThatStillParseAreDataLoss) {
  const std::string copy = dir_ + "-flip";
  LoadedToy toy = ToyEngine("");
  const std::vector<float> before = Param0(*toy.engine);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"step\": ", "\"step\": 1"}, {"\"user_data\"", "\"user_dat4\""}, {"\"scale\": ", "\"scale\": -"}}) {
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir_, copy);
    std::ifstream in(copy + "/meta.json");
    std::string meta((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = meta.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    meta.replace(at, from.size(), to);
    std::ofstream(copy + "/meta.json") << meta;
    const Status loaded = toy.engine->LoadCheckpoint(copy);
    EXPECT_FALSE(loaded.ok()) << to;
    EXPECT_THAT(loaded, ::testing::AnyOf(StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")),
                                         StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale"))))
        << to;
    EXPECT_EQ(Param0(*toy.engine), before) << to;
  }
  std::filesystem::remove_all(copy);
  std::filesystem::copy(dir_, copy);
  std::filesystem::remove(copy + "/meta.json");
  std::filesystem::create_directory(copy + "/meta.json");
  EXPECT_THAT(toy.engine->LoadCheckpoint(copy), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
  std::filesystem::remove_all(copy);
  std::filesystem::create_directories(copy + "/step-1");
  std::ofstream(copy + "/latest") << std::string("\0step-1\n", 8);
  EXPECT_THAT(toy.engine->LoadCheckpoint(copy), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("latest")));
  std::filesystem::remove_all(copy);
}

TEST_F(Checkpoint, AnUnfinishedSaveNeverHidesTheLastCheckpoint) {
  // A save that died: DIR.partial with a half-written file beside the complete DIR.
  std::filesystem::create_directories(dir_ + ".partial");
  std::ofstream(dir_ + ".partial/rank-0-of-2.bin") << "ZRTCKPT2 half";
  LoadedToy toy = ToyEngine(dir_);
  const std::vector<float> saved = Param0(*toy.engine);
  EXPECT_EQ(toy.engine->checkpoint_user_data(), "");  // saved without any
  // The next save replaces both, and a trailing slash names the same checkpoint; the
  // trainer's state goes with it.
  toy.engine->set_checkpoint_user_data(R"({"epoch": 3, "sample": 1200})");
  ASSERT_THAT(toy.engine->SaveCheckpoint(dir_ + "/"), IsOk());
  toy.engine->set_checkpoint_user_data("");
  EXPECT_FALSE(std::filesystem::exists(dir_ + ".partial"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/rank-0-of-1.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/rank-1-of-2.bin"));  // the old files went with it
  ASSERT_THAT(toy.engine->LoadCheckpoint(dir_), IsOk());
  EXPECT_EQ(Param0(*toy.engine), saved);
  EXPECT_EQ(toy.engine->checkpoint_user_data(), R"({"epoch": 3, "sample": 1200})");
  // No DIR, only DIR.partial: said so.
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_ + ".partial");
  EXPECT_THAT(toy.engine->LoadCheckpoint(dir_), StatusIs(absl::StatusCode::kNotFound, HasSubstr("did not finish")));
  std::filesystem::remove_all(dir_ + ".partial");
}

// User data that is not UTF-8 (meta.json cannot hold it) is refused before the save writes
// anything: no DIR.partial is left that a load would report as a save that did not finish.
TEST_F(Checkpoint, UserDataThatIsNotUtf8IsRefusedBeforeAnythingIsWritten) {
  LoadedToy toy = ToyEngine(dir_);
  const std::string other = dir_ + "-binary";
  toy.engine->set_checkpoint_user_data(std::string("epoch \xff\xfe", 8));
  EXPECT_THAT(toy.engine->SaveCheckpoint(other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("user data is not UTF-8")));
  EXPECT_FALSE(std::filesystem::exists(other + ".partial"));
  EXPECT_FALSE(std::filesystem::exists(other));
  toy.engine->set_checkpoint_user_data("epoch 3");  // the engine saves as before
  ASSERT_THAT(toy.engine->SaveCheckpoint(other), IsOk());
  std::filesystem::remove_all(other);
}

// A stage-2 engine of the toy model on `comm`, one step trained.
StatusOr<std::unique_ptr<Engine>> ToyEngineAfterOneStep(comm::Communicator& comm) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ToyConfig(2), comm));
  ToyOptions o;
  o.steps = 1;
  ToyResult result;
  ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
  return engine;
}

// A checkpoint of another optimizer whose state means something else (Lion's momentum read as
// SGD's) is refused naming both; "" is not a directory; a symlinked directory stays a symlink.
TEST(CheckpointMisuse, AnotherOptimizerAnEmptyNameAndASymlinkedDirectory) {
  const std::string root = testing::ScratchDir("zerort-ckpt-misuse");
  const std::vector<Status> statuses = RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
    Config lion = ToyConfig(2);
    lion.optimizer.type = OptimizerType::kLion;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> saver, Engine::Create(lion, c));
    testing::ToyOptions o;
    o.steps = 1;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*saver, o, &result));
    ZERO_RETURN_IF_ERROR(saver->SaveCheckpoint(root + "/lion"));
    const Status empty = saver->SaveCheckpoint("");
    if (empty.code() != absl::StatusCode::kInvalidArgument) return absl::InternalError("save(\"\") accepted");
    Config sgd = ToyConfig(2);
    sgd.optimizer.type = OptimizerType::kSgd;
    sgd.optimizer.momentum = 0.9f;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> loader, Engine::Create(sgd, c));
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*loader, o, &result));
    const Status loaded = loader->LoadCheckpoint(root + "/lion");
    if (loaded.code() != absl::StatusCode::kInvalidArgument || !absl::StrContains(loaded.message(), "lion")) {
      return absl::InternalError(absl::StrCat("a Lion checkpoint loaded into SGD: ", loaded.ToString()));
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_FALSE(std::filesystem::exists(".partial"));
  // Saving through a symlink writes where it points and keeps the link.
  std::filesystem::create_directories(root + "/real");
  std::filesystem::create_directory_symlink(root + "/real", root + "/link");
  const std::vector<Status> saved = RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, ToyEngineAfterOneStep(c));
    return engine->SaveCheckpoint(root + "/link");
  });
  ASSERT_THAT(saved, ::testing::Each(IsOk()));
  EXPECT_TRUE(std::filesystem::is_symlink(root + "/link"));
  EXPECT_TRUE(std::filesystem::exists(root + "/real/meta.json"));
  std::filesystem::remove_all(root);
}

// User data that is not UTF-8 cannot go into meta.json: the save fails on every rank with the
// reason (it used to throw out of the library); a FIFO named `latest` is refused, not waited on.
TEST(CheckpointMisuse, BinaryUserDataAndAFifoAreErrorsNotACrashOrAHang) {
  const std::string root = testing::ScratchDir("zerort-ckpt-binary");
  const std::vector<Status> statuses = RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, ToyEngineAfterOneStep(c));
    engine->set_checkpoint_user_data(std::string("\xff\xfe rng", 6));
    return engine->SaveCheckpoint(root + "/ckpt");
  });
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kAborted));
  EXPECT_FALSE(std::filesystem::exists(root + "/ckpt"));
  std::filesystem::create_directories(root + "/series");
  ASSERT_EQ(::mkfifo((root + "/series/latest").c_str(), 0644), 0);
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  ASSERT_THAT((*engine)->RegisterParam({"w", {8}}), IsOk());
  ASSERT_THAT((*engine)->Finalize(), IsOk());
  EXPECT_THAT((*engine)->LoadCheckpoint(root + "/series"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
  std::filesystem::remove_all(root);
}

// A save replaces its directory whole: only an earlier checkpoint or an empty directory may
// be there. A directory of other data (a trainer's output directory) or a file is refused on
// every rank and left as it was; a tag that the series' `latest` could not name is refused.
// Ranks whose checkpoint paths are different directories (node-local storage; here rank 1's
// path holds a stale DIR.partial, so its own write succeeds): rank 0 does not find rank 1's
// file, and nothing is published, where it published a checkpoint without that file.
// Ranks naming different directories (each its node's own, or a typo on one) are refused on
// every rank, naming it, before anything is written: no rank file lands where no checkpoint
// will be, and no DIR.partial is left. Both save calls (a directory, a series root and tag).
// One directory spelled two ways ("x" and "./x/") saves.
TEST(CheckpointMisuse, RanksNamingDifferentDirectoriesAreRefusedBeforeAnythingIsWritten) {
  const std::string root = testing::ScratchDir("zerort-ckpt-local");
  const std::vector<Status> statuses = RunOnRanks(2, [&](int rank, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, ToyEngineAfterOneStep(c));
    const std::string node = root + (rank == 0 ? "/node0" : "/node1");
    const Status named = engine->SaveCheckpoint(node + "/ckpt");
    if (named.ok()) return absl::InternalError("saved into two directories");
    const Status tagged = engine->SaveCheckpoint(node, "step-1");
    if (tagged.code() != named.code()) return tagged;
    // One directory spelled two ways is one directory.
    const Status same = engine->SaveCheckpoint(root + (rank == 0 ? "/same" : "/./same//"), "step-1");
    return same.ok() ? named : same;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(statuses[rank], StatusIs(absl::StatusCode::kInvalidArgument,
                                         AllOf(HasSubstr("SaveCheckpoint into"),
                                               HasSubstr("the ranks pass different values"),
                                               HasSubstr(absl::StrCat("rank(s) ", 1 - rank, " differ")))));
  }
  EXPECT_FALSE(std::filesystem::exists(root + "/node0")) << "nothing written, not even a series root";
  EXPECT_FALSE(std::filesystem::exists(root + "/node1"));
  EXPECT_TRUE(std::filesystem::exists(root + "/same/step-1/meta.json"));
  std::filesystem::remove_all(root);
}

TEST(CheckpointMisuse, ASaveNeverReplacesOtherDataAndATagIsPrintable) {
  const std::string root = testing::ScratchDir("zerort-ckpt-clobber");
  std::filesystem::create_directories(root + "/output/logs");
  { std::ofstream(root + "/output/logs/train.log") << "epoch 1\n"; }
  { std::ofstream(root + "/model.bin") << "weights"; }
  std::filesystem::create_directories(root + "/empty");
  const std::vector<Status> statuses = RunOnRanks(2, [&](int rank, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, ToyEngineAfterOneStep(c));
    for (const char* other : {"/output", "/model.bin"}) {
      const Status refused = engine->SaveCheckpoint(root + other);  // rank 0 looks; the rest hear why
      if (refused.ok() || (rank == 0 && !absl::StrContains(refused.message(), "would be lost"))) {
        return absl::InternalError(absl::StrCat("saving over ", other, ": ", refused.ToString()));
      }
    }
    ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root + "/empty"));
    ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root + "/empty"));  // over its own checkpoint
    const Status newline = engine->SaveCheckpoint(root + "/series", "step-2\n");
    if (newline.code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError(absl::StrCat("a tag with a newline: ", newline.ToString()));
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_TRUE(std::filesystem::exists(root + "/output/logs/train.log"));
  EXPECT_TRUE(std::filesystem::is_regular_file(root + "/model.bin"));
  EXPECT_TRUE(std::filesystem::exists(root + "/empty/meta.json"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace zero
