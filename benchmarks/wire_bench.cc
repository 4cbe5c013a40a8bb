// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Wire-layer throughput: CRC32c, and FPDU parse + CRC verify as the receive
// path runs it (pull interface, payload committed in place as if the kernel
// had just placed it). Prints GB/s; it is a benchmark, not a test.
//
//   build/release/benchmarks/wire_bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/wire/crc32c.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/fpdu.h"
#include "common/wire/fpdu_parser.h"

namespace siwx {
namespace {

void BM_Crc32c(benchmark::State& state) {
  std::vector<std::uint8_t> data(static_cast<std::size_t>(state.range(0)));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ComputeCrc32c(data));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(data.size()));
}
BENCHMARK(BM_Crc32c)->Arg(1024)->Arg(64 * 1024)->UseRealTime();

// A stream of FPDUs whose wire length is about `fpdu_size`, each carrying an
// RDMA Write segment (tagged DDP header + payload), CRC on.
std::vector<std::uint8_t> MakeStream(std::size_t fpdu_size, bool markers, std::size_t total) {
  constexpr std::uint8_t kWriteHeader[14] = {0xC1, 0x40, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t ulpdu = fpdu_size - mpa::kFpduFixedOverhead - (markers ? 4 * (fpdu_size / 512 + 1) : 0);
  std::vector<std::uint8_t> payload(ulpdu - sizeof(kWriteHeader), 0x5A);
  mpa::FpduFramer framer({.crc_enabled = true, .markers_enabled = markers, .marker_grid_offset = 0});
  auto frame = std::make_unique<mpa::FpduFrame>();
  std::vector<std::uint8_t> stream;
  while (stream.size() < total) {
    const ByteSpan piece(payload);
    if (framer.Frame(ByteSpan(kWriteHeader), std::span<const ByteSpan>(&piece, 1), *frame) !=
        mpa::FrameStatus::kOk) {
      std::abort();
    }
    for (const auto& s : frame->slices()) stream.insert(stream.end(), s.base, s.base + s.len);
  }
  return stream;
}

void BM_ParseVerify(benchmark::State& state) {
  const std::size_t fpdu_size = static_cast<std::size_t>(state.range(0));
  const bool markers = state.range(1) != 0;
  const auto stream = MakeStream(fpdu_size, markers, 1 << 20);
  std::size_t fpdus = 0;
  for (auto _ : state) {
    mpa::FpduParser parser({.crc_enabled = true, .markers_enabled = markers,
                            .marker_grid_offset = 0, .header_sizer = &rdmap::UlpduHeaderLength});
    ByteSpan rest(stream);
    while (!rest.empty()) {
      const mpa::RxDemand demand = parser.Demand();
      if (demand.kind == mpa::RxDemand::Kind::kPayload) {
        const std::size_t n = std::min(demand.length, rest.size());
        parser.CommitPayload(rest.first(n));
        rest = rest.subspan(n);
        continue;
      }
      const mpa::RxProgress progress = parser.ConsumeFraming(rest);
      rest = rest.subspan(progress.consumed);
      if (progress.event == mpa::RxEvent::kFpduComplete) ++fpdus;
      if (progress.event == mpa::RxEvent::kError) {
        state.SkipWithError("parse error");
        return;
      }
    }
  }
  benchmark::DoNotOptimize(fpdus);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(stream.size()));
}
BENCHMARK(BM_ParseVerify)
    ->ArgNames({"fpdu_bytes", "markers"})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Args({65528, 0})
    ->Args({65528, 1})
    ->UseRealTime();

}  // namespace
}  // namespace siwx

BENCHMARK_MAIN();
