// Packing benchmark: BFD / BFD-split / wrapped over 1,000,000 sequence lengths drawn from a
// long-tailed (log-normal) distribution with a fixed seed, packed into max_length 4096. Prints
// one JSON object: seconds per strategy (lengths only, best and median of the repeats),
// bins, packing efficiency = real tokens / (bins * max_length), tokens dropped; plus the time
// to copy the tokens of a 100,000-sequence subset into its bins (what the loader does).
//
//   OMP_NUM_THREADS=1 build/bench/bench_pack [--n 1000000] [--max_length 4096] [--repeats 5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loaders/pack.h"

namespace {

using leantune::Packing;
using leantune::PackingStrategy;

// Log-normal lengths from mt19937_64 (bit-exact everywhere) and Box-Muller: median 600 tokens,
// sigma 1.1, so about 6% exceed 4096 and a few reach tens of thousands.
std::vector<int64_t> make_lengths(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double mu = std::log(600.0), sigma = 1.1;
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& x : out) {
    const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    x = std::clamp<int64_t>(static_cast<int64_t>(std::exp(mu + sigma * z)), 1, 65536);
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Timing {
  double best = 0, median = 0;
  Packing packing;
};

Timing time_pack(const std::vector<int64_t>& lengths, int64_t max_length, PackingStrategy s,
                 int repeats) {
  std::vector<double> t;
  Timing out;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Packing p = leantune::pack_lengths(lengths, max_length, s);
    t.push_back(seconds_since(t0));
    if (r == 0) out.packing = std::move(p);
  }
  std::sort(t.begin(), t.end());
  out.best = t.front();
  out.median = t[t.size() / 2];
  return out;
}

// Copies every bin's tokens into one flat buffer, as the loader does per micro-batch.
double time_copy(const std::vector<int64_t>& lengths, int64_t max_length, PackingStrategy s,
                 int64_t* tokens_out) {
  std::vector<int64_t> offsets(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) offsets[i + 1] = offsets[i] + lengths[i];
  std::vector<int32_t> tokens(static_cast<size_t>(offsets.back()));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  const auto t0 = std::chrono::steady_clock::now();
  const Packing p = leantune::pack_lengths(lengths, max_length, s);
  std::vector<int32_t> out(static_cast<size_t>(p.real_tokens));
  size_t at = 0;
  for (const leantune::Segment& seg : p.segments) {
    std::memcpy(out.data() + at, tokens.data() + offsets[static_cast<size_t>(seg.item)] + seg.begin,
                static_cast<size_t>(seg.length) * sizeof(int32_t));
    at += static_cast<size_t>(seg.length);
  }
  const double secs = seconds_since(t0);
  *tokens_out = static_cast<int64_t>(at);
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 1000000, max_length = 4096;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n")
      n = std::atoll(argv[i + 1]);
    else if (a == "--max_length")
      max_length = std::atoll(argv[i + 1]);
    else if (a == "--repeats")
      repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::vector<int64_t> lengths = make_lengths(n, 20240917);
  int64_t total = 0, over = 0;
  for (int64_t l : lengths) {
    total += l;
    over += l > max_length;
  }

  std::printf("{\n  \"benchmark\": \"pack\",\n  \"sequences\": %lld,\n  \"max_length\": %lld,\n",
              static_cast<long long>(n), static_cast<long long>(max_length));
  std::printf("  \"distribution\": \"lognormal(median 600, sigma 1.1), clipped to [1, 65536]\",\n");
  std::printf("  \"total_tokens\": %lld,\n  \"sequences_over_max_length\": %lld,\n",
              static_cast<long long>(total), static_cast<long long>(over));
  std::printf("  \"repeats\": %d,\n  \"lengths_only\": {\n", repeats);
  const PackingStrategy strategies[] = {PackingStrategy::kBfd, PackingStrategy::kBfdSplit,
                                        PackingStrategy::kWrapped};
  for (size_t k = 0; k < 3; ++k) {
    const Timing t = time_pack(lengths, max_length, strategies[k], repeats);
    std::printf(
        "    \"%s\": {\"seconds_best\": %.4f, \"seconds_median\": %.4f, \"bins\": %lld, "
        "\"efficiency\": %.5f, \"dropped_tokens\": %lld}%s\n",
        leantune::packing_strategy_name(strategies[k]), t.best, t.median,
        static_cast<long long>(t.packing.num_bins()), t.packing.efficiency(),
        static_cast<long long>(t.packing.dropped_tokens), k < 2 ? "," : "");
  }
  const int64_t subset = std::min<int64_t>(n, 100000);
  const std::vector<int64_t> sub(lengths.begin(), lengths.begin() + subset);
  int64_t copied = 0;
  const double bfd_copy = time_copy(sub, max_length, PackingStrategy::kBfd, &copied);
  int64_t copied_split = 0;
  const double split_copy = time_copy(sub, max_length, PackingStrategy::kBfdSplit, &copied_split);
  std::printf("  },\n  \"with_token_copy\": {\"sequences\": %lld,\n",
              static_cast<long long>(subset));
  std::printf("    \"bfd\": {\"seconds\": %.4f, \"tokens\": %lld},\n", bfd_copy,
              static_cast<long long>(copied));
  std::printf("    \"bfd_split\": {\"seconds\": %.4f, \"tokens\": %lld}\n  }\n}\n", split_copy,
              static_cast<long long>(copied_split));
  return 0;
}
