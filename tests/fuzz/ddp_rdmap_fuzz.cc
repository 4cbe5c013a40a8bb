// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// libFuzzer target for the DDP/RDMAP header and Terminate codecs: any octets
// decode without a crash; whatever decodes re-encodes to the same octets; the
// header sizer the FPDU parser uses agrees with the decoder.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire/ddp_rdmap.h"
#include "common/wire/terminate.h"

using namespace siwx::rdmap;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const siwx::ByteSpan in(data, size);

  const HeaderDecodeResult header = DecodeDdpRdmapHeader(in);
  if (size >= 2 && header.status == HeaderStatus::kOk &&
      UlpduHeaderLength(data[0], data[1]) != header.length) {
    __builtin_trap();
  }
  if (header.status == HeaderStatus::kOk) {
    std::vector<std::uint8_t> out(EncodedLength(header.header));
    if (EncodeDdpRdmapHeader(header.header, out).status != EncodeStatus::kOk) __builtin_trap();
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i] != data[i]) __builtin_trap();
    }
  }
  (void)TerminateCauseForHeader(header);

  for (const auto layout : {TerminateLayout::kRfc5040, TerminateLayout::kSiwSwapped}) {
    const TerminateDecodeResult term = DecodeTerminateHeader(in, layout);
    if (term.status == TerminateStatus::kOk && layout == TerminateLayout::kRfc5040) {
      std::vector<std::uint8_t> out(TerminateHeaderLength(term.header));
      if (EncodeTerminateHeader(term.header, out).status != EncodeStatus::kOk) __builtin_trap();
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (out[i] != data[i]) __builtin_trap();
      }
    }
    (void)TerminateErrorCodeName(term.header.cause);
  }
  (void)GuessTerminateLayout(in);

  // Building a Terminate that copies any segment must always encode.
  const TerminateHeader made = MakeTerminateForSegment(
      {static_cast<std::uint8_t>(size > 0 ? data[0] >> 6 : 0),
       static_cast<std::uint8_t>(size > 1 ? data[1] & 3 : 0), 0},
      in, 0);
  std::vector<std::uint8_t> out(TerminateHeaderLength(made));
  if (EncodeTerminateHeader(made, out).status != EncodeStatus::kOk) __builtin_trap();
  return 0;
}
