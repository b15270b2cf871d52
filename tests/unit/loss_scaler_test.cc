// runtime::LossScaler on its own: DeepSpeed's dynamic loss scaling step by step (hysteresis,
// window, floor), the static and "none" modes, and a state round trip that continues alike.
#include "runtime/loss_scaler.h"

#include <gtest/gtest.h>

#include <vector>

namespace zero::runtime {
namespace {

LossScaleConfig Dynamic(int initial_power, int window, int hysteresis, float min) {
  LossScaleConfig c;
  c.mode = LossScaleMode::kDynamic;
  c.initial_power = initial_power;
  c.window = window;
  c.hysteresis = hysteresis;
  c.min = min;
  return c;
}

// The scale after each update of `overflows`.
std::vector<float> Scales(LossScaler& scaler, const std::vector<bool>& overflows) {
  std::vector<float> scales;
  for (const bool overflow : overflows) {
    scaler.Update(overflow);
    scales.push_back(scaler.scale());
  }
  return scales;
}

TEST(LossScaler, DynamicHalvesAfterHysteresisAndDoublesEveryWindow) {
  LossScaler scaler(Dynamic(4, 3, 2, 1.0f));
  EXPECT_EQ(scaler.scale(), 16.0f);
  EXPECT_TRUE(scaler.skips_on_overflow());
  // The first overflow is absorbed by the hysteresis, the second halves; three clean steps
  // after the last overflow double (and restore the hysteresis), so the next one is absorbed.
  EXPECT_EQ(Scales(scaler, {true, true, false, false, false, true, false}),
            (std::vector<float>{16, 8, 8, 8, 16, 16, 16}));
}

TEST(LossScaler, NeverDropsBelowTheFloor) {
  LossScaler scaler(Dynamic(1, 1000, 1, 1.0f));
  EXPECT_EQ(Scales(scaler, {true, true, true}), (std::vector<float>{1, 1, 1}));
}

TEST(LossScaler, WithoutOverflowTheScaleDoublesOnceAWindow) {
  LossScaler scaler(Dynamic(0, 2, 2, 1.0f));
  // The count starts one step before the first (as DeepSpeed's last_overflow_iter = -1).
  EXPECT_EQ(Scales(scaler, {false, false, false, false}), (std::vector<float>{1, 2, 2, 4}));
}

TEST(LossScaler, StaticAndNoneNeverChange) {
  LossScaleConfig fixed;
  fixed.mode = LossScaleMode::kStatic;
  fixed.initial_power = 10;
  LossScaler scaler(fixed);
  EXPECT_TRUE(scaler.skips_on_overflow());
  EXPECT_EQ(Scales(scaler, {true, false, true}), (std::vector<float>{1024, 1024, 1024}));
  LossScaler none{LossScaleConfig{}};
  EXPECT_FALSE(none.skips_on_overflow());
  EXPECT_EQ(Scales(none, {true, false}), (std::vector<float>{1, 1}));
}

TEST(LossScaler, AStateRoundTripContinuesAlike) {
  const std::vector<bool> first = {true, false, false, true, false};
  const std::vector<bool> rest = {true, true, false, false, false, false, true};
  LossScaler whole(Dynamic(8, 3, 2, 0.5f));
  Scales(whole, first);
  LossScaler resumed(Dynamic(8, 3, 2, 0.5f));
  resumed.Restore(whole.state());
  EXPECT_EQ(Scales(resumed, rest), Scales(whole, rest));
}

// A checkpoint's dynamic scale reaches only a dynamic scaler: an engine configured without loss
// scaling (or with a static scale) keeps its own, so its gradients are not divided by a scale
// it never multiplied the loss by.
TEST(LossScaler, OnlyADynamicScalerTakesASavedState) {
  LossScaler saved(Dynamic(16, 1000, 2, 1.0f));
  const LossScaler::State state = saved.state();
  ASSERT_EQ(state.scale, 65536.0f);
  LossScaler none{LossScaleConfig{}};
  none.Restore(state);
  EXPECT_EQ(none.scale(), 1.0f);
  LossScaleConfig fixed;
  fixed.mode = LossScaleMode::kStatic;
  fixed.initial_power = 3;
  LossScaler static_scaler(fixed);
  static_scaler.Restore(state);
  EXPECT_EQ(static_scaler.scale(), 8.0f);
  LossScaler dynamic(Dynamic(4, 1000, 2, 1.0f));
  dynamic.Restore(state);
  EXPECT_EQ(dynamic.scale(), 65536.0f);
  // A static or no scaler's state (scale 1 or 8) does not replace a dynamic scaler's start.
  LossScaler from_static(Dynamic(4, 1000, 2, 1.0f));
  from_static.Restore(static_scaler.state());
  EXPECT_EQ(from_static.scale(), 16.0f);
}

}  // namespace
}  // namespace zero::runtime
