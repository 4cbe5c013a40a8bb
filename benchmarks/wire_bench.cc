// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Wire-layer throughput: CRC32c, and FPDU parse + CRC verify as the receive
// path runs it (pull interface, payload committed in place as if the kernel
// had just placed it). Prints GB/s; it is a benchmark, not a test.
//
//   build/release/benchmarks/wire_bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
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

// One batch of Read Response FPDUs as the transmit side frames them with
// CRC on (engine/tx.h): 64 slots, each a 32 KiB payload copied from the
// same 64 KiB source into the slot's staging buffer, then framed over the
// copy. mode 0: what 7ca3228 did, a staging vector zero-filled when it
// grew and freed when the QP went idle after the batch, and the CRC run
// over the copy in a second pass; mode 1: staging kept, still copy then
// CRC; mode 2: staging kept, the CRC computed behind the copy in 8 KiB
// chunks (FpduFramer::FrameCopy). What sendmsg then does with the copy is
// not measured.
void BM_ReadResponseBatch(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  const bool fused = mode == 2;
  constexpr std::size_t kSlots = 64;
  constexpr std::size_t kPayload = 32 * 1024;
  constexpr std::uint8_t kHeader[14] = {0xC1, 0x41, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<std::uint8_t> source(64 * 1024, 0x5A);
  std::vector<std::vector<std::uint8_t>> old_staging(kSlots);
  std::vector<std::unique_ptr<std::uint8_t[]>> kept(kSlots);
  for (auto& k : kept) k = std::make_unique_for_overwrite<std::uint8_t[]>(kPayload);
  mpa::FpduFramer framer({.crc_enabled = true});
  auto frame = std::make_unique<mpa::FpduFrame>();
  for (auto _ : state) {
    for (std::size_t i = 0; i < kSlots; ++i) {
      const ByteSpan piece(source.data() + (i % 2) * kPayload, kPayload);
      mpa::FrameStatus status;
      if (fused) {
        status = framer.FrameCopy(ByteSpan(kHeader), std::span<const ByteSpan>(&piece, 1),
                                  kept[i].get(), *frame);
      } else {
        std::vector<std::uint8_t>& staging = old_staging[i];
        if (staging.size() < kPayload) staging.resize(kPayload);
        std::uint8_t* to = mode == 0 ? staging.data() : kept[i].get();
        std::memcpy(to, piece.data(), kPayload);
        const ByteSpan copy(to, kPayload);
        status = framer.Frame(ByteSpan(kHeader), std::span<const ByteSpan>(&copy, 1), *frame);
      }
      if (status != mpa::FrameStatus::kOk) std::abort();
      benchmark::DoNotOptimize(frame->crc());
    }
    if (mode == 0) {
      for (auto& staging : old_staging) staging = {};  // the QP went idle
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kSlots * kPayload));
}
BENCHMARK(BM_ReadResponseBatch)->ArgNames({"mode"})->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

// What the Read responder does with CRC on, sendmsg included: 64 Read
// Response FPDUs of 32 KiB (one batch, 2 MiB) framed with CRC from a 64 KiB
// source into staging copies and written to a loopback TCP connection that
// a second thread drains. Argument: staged octets per sendmsg. 2 MiB is a
// ring of 64 buffers, all framed, then one sendmsg (as before
// performance-notes 3.22); smaller, the batch goes out in pieces of that
// many octets, each framed into the same few buffers sendmsg has just read.
// CPU time of the framing and sending thread (the kernel's copy and the
// loopback delivery included), per batch.
void BM_ReadResponseSendmsg(benchmark::State& state) {
  const std::size_t per_sendmsg = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kSlots = 64;
  constexpr std::size_t kPayload = 32 * 1024;
  const std::size_t per_piece = std::max<std::size_t>(1, per_sendmsg / kPayload);
  constexpr std::uint8_t kHeader[14] = {0xC1, 0x41, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<std::uint8_t> source(64 * 1024, 0x5A);
  std::vector<std::unique_ptr<std::uint8_t[]>> staging(std::min(kSlots, per_piece));
  for (auto& b : staging) b = std::make_unique_for_overwrite<std::uint8_t[]>(kPayload);
  std::vector<std::unique_ptr<mpa::FpduFrame>> frames(staging.size());
  for (auto& f : frames) f = std::make_unique<mpa::FpduFrame>();

  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    state.SkipWithError("loopback listener failed");
    return;
  }
  const int tx = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(tx, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    state.SkipWithError("connect failed");
    return;
  }
  const int rx = accept(listener, nullptr, nullptr);
  close(listener);
  std::thread drain([rx] {
    std::vector<std::uint8_t> buf(256 * 1024);
    while (read(rx, buf.data(), buf.size()) > 0) {
    }
  });

  mpa::FpduFramer framer({.crc_enabled = true});
  std::vector<iovec> iov(4 * staging.size());
  for (auto _ : state) {
    for (std::size_t done = 0; done < kSlots;) {
      const std::size_t n = std::min(staging.size(), kSlots - done);
      std::size_t count = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const ByteSpan piece(source.data() + ((done + i) % 2) * kPayload, kPayload);
        if (framer.FrameCopy(ByteSpan(kHeader), std::span<const ByteSpan>(&piece, 1),
                             staging[i].get(), *frames[i]) != mpa::FrameStatus::kOk) {
          std::abort();
        }
        for (const mpa::IoSlice& slice : frames[i]->slices()) {
          iov[count++] = iovec{const_cast<std::uint8_t*>(slice.base), slice.len};
        }
      }
      // Blocking: sendmsg returns when the kernel has taken every octet.
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = count;
      if (sendmsg(tx, &msg, MSG_NOSIGNAL) <= 0) std::abort();
      done += n;
    }
  }
  shutdown(tx, SHUT_WR);
  drain.join();
  close(tx);
  close(rx);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kSlots * kPayload));
}
BENCHMARK(BM_ReadResponseSendmsg)
    ->ArgNames({"per_sendmsg"})
    ->Arg(128 << 10)
    ->Arg(256 << 10)
    ->Arg(512 << 10)
    ->Arg(1 << 20)
    ->Arg(2 << 20);

}  // namespace
}  // namespace siwx

BENCHMARK_MAIN();
