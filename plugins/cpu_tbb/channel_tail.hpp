// The channel-local tail of a convolution (channel_tail.cpp): the layers after a conv that
// act on each channel alone (ReLU or another verified elementwise function, max or average
// pooling, flatten) up to the next affine layer. A candidate of the site-local path moves
// the weights or bias of one output channel (or of a few), so it changes one contiguous slice
// of that affine layer's input: its change reaches the affine layer's output as one
// [batch, slice] x [slice, out] product, instead of the whole suffix over every channel.
//
// The tail is the plugin's reading of the layers' kinds and attributes, so it is probed when
// the evaluator is built: on a random input, a perturbed channel must come out of the
// layers' own forwards exactly as the tail computes it, and every other channel unchanged.
// A layer the tail does not know ends it; a conv without a usable tail runs the suffix.
#pragma once

#include "model_plan.hpp"
#include "packets.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

struct TailStage {
  enum class Op { relu, scalar_fn, max_pool, avg_pool };
  Op op = Op::relu;
  const LayerPlan* layer = nullptr;  // scalar_fn: the layer whose elementwise_fn applies
  // pooling of one channel's [h, w] map (a 1-D pool has h = 1) into [oh, ow]
  int64_t h = 1, w = 1, kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, oh = 1, ow = 1;
  // pooling: kernel column kj reads input column oj sw + shift for oj in [first, last), so
  // the bounds are clamped once per tap, not tested per value
  struct ColumnTap {
    int64_t shift, first, last;
  };
  std::vector<ColumnTap> taps;
  bool pairs = false;  // 2 x 2 (or 1 x 2) max pooling, stride 2, no padding: a loop of its own
};

struct ChannelTail {
  bool usable = false;
  std::vector<TailStage> stages;  // in order; flatten needs none (it keeps the layout)
  std::size_t affine = 0;         // the plan's index of the affine layer the tail feeds
  int64_t channels = 0;           // the conv's output channels
  int64_t positions = 0;          // one channel's values out of the conv
  int64_t slice = 0;              // one channel's values at the affine layer's input
  std::string note;               // what the tail runs through, or why there is none
};

// The tail after plan.layers[conv] (whose output is `channels` maps of `height` x `width`),
// probed; never throws (a failure is the note).
ChannelTail plan_channel_tail(const ModelPlan& plan, std::size_t conv, int64_t channels,
                              int64_t height, int64_t width);

// One channel through the tail: `a` [batch, positions] holds the conv's output for it
// (it is overwritten); returns the channel's slice of the affine layer's input
// [batch, slice], which is `a` or `b`.
template <class S>
const Mat<S>& run_channel_tail(const ChannelTail& tail, Mat<S>& a, Mat<S>& b);

}  // namespace polyprobe::cpu_tbb
