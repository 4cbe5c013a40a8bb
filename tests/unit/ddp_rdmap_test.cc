// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// DDP (RFC 5041 section 4) and RDMAP (RFC 5040 section 4, RFC 7306 section
// 4-6) header vectors, written from the RFC figures, plus every malformed
// header the decoder must name.
#include "common/wire/ddp_rdmap.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/wire/terminate.h"

namespace siwx::rdmap {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes Concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct Vector {
  std::string name;
  Bytes bytes;
  DdpRdmapHeader expected;
};

// One annotated ULPDU header per opcode (and the segment variants that matter).
std::vector<Vector> AllVectors() {
  std::vector<Vector> v;

  {  // RFC 5040 A.1: RDMA Write, last segment.
    DdpRdmapHeader h;
    h.tagged = true;
    h.last = true;
    h.opcode = Opcode::kRdmaWrite;
    h.stag = 0x12345678;
    h.to = 0x00007FABCDEF1000;
    v.push_back({"RdmaWrite",
                 {0xC1,                    // DDP control: T=1 L=1 Rsvd=0 DV=01
                  0x40,                    // RDMAP control: RV=01 Rsv=00 OpCode=0000 (Write)
                  0x12, 0x34, 0x56, 0x78,  // Data Sink STag
                  0x00, 0x00, 0x7F, 0xAB,  // Data Sink Tagged Offset (high)
                  0xCD, 0xEF, 0x10, 0x00},  // Data Sink Tagged Offset (low)
                 h});
  }
  {  // RFC 5040 A.3: RDMA Read Response, a middle segment (L=0).
    DdpRdmapHeader h;
    h.tagged = true;
    h.last = false;
    h.opcode = Opcode::kRdmaReadResponse;
    h.stag = 0x0000AB01;
    h.to = 0x00007F0012345000;
    v.push_back({"RdmaReadResponseMiddle",
                 {0x81,                    // DDP control: T=1 L=0 DV=01
                  0x42,                    // RDMAP control: RV=01 OpCode=0010 (Read Response)
                  0x00, 0x00, 0xAB, 0x01,  // Data Sink STag
                  0x00, 0x00, 0x7F, 0x00,  // Data Sink Tagged Offset (high)
                  0x12, 0x34, 0x50, 0x00},  // Data Sink Tagged Offset (low)
                 h});
  }
  {  // RFC 5040 A.2: RDMA Read Request with its 28-octet header (Figure 6).
    DdpRdmapHeader h;
    h.opcode = Opcode::kRdmaReadRequest;
    h.qn = 1;
    h.msn = 1;
    h.body = ReadRequestBody{0x0000AB01, 0x00007F0012345000, 0x00010000, 0x00CD0203,
                             0x00007FAABB000000};
    v.push_back({"RdmaReadRequest",
                 {0x41,                    // DDP control: T=0 L=1 DV=01
                  0x41,                    // RDMAP control: RV=01 OpCode=0001 (Read Request)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]: reserved, zero
                  0x00, 0x00, 0x00, 0x01,  // QN 1: RDMA Read Request queue
                  0x00, 0x00, 0x00, 0x01,  // MSN 1
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0x00, 0x00, 0xAB, 0x01,  // Data Sink STag
                  0x00, 0x00, 0x7F, 0x00,  // Data Sink Tagged Offset (high)
                  0x12, 0x34, 0x50, 0x00,  // Data Sink Tagged Offset (low)
                  0x00, 0x01, 0x00, 0x00,  // RDMA Read Message Size: 65536
                  0x00, 0xCD, 0x02, 0x03,  // Data Source STag
                  0x00, 0x00, 0x7F, 0xAA,  // Data Source Tagged Offset (high)
                  0xBB, 0x00, 0x00, 0x00},  // Data Source Tagged Offset (low)
                 h});
  }
  {  // RFC 5040 A.4: Send, first of several segments.
    DdpRdmapHeader h;
    h.last = false;
    h.opcode = Opcode::kSend;
    h.qn = 0;
    h.msn = 7;
    h.mo = 0;
    v.push_back({"SendFirst",
                 {0x01,                    // DDP control: T=0 L=0 DV=01
                  0x43,                    // RDMAP control: RV=01 OpCode=0011 (Send)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]: reserved
                  0x00, 0x00, 0x00, 0x00,  // QN 0: Send queue
                  0x00, 0x00, 0x00, 0x07,  // MSN 7
                  0x00, 0x00, 0x00, 0x00},  // MO 0
                 h});
  }
  {  // Send, last segment at MO 1432 (siw's segment size at MTU 1500).
    DdpRdmapHeader h;
    h.opcode = Opcode::kSend;
    h.msn = 7;
    h.mo = 1432;
    v.push_back({"SendLast",
                 {0x41,                    // DDP control: T=0 L=1 DV=01
                  0x43,                    // RDMAP control: Send
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x00,  // QN 0
                  0x00, 0x00, 0x00, 0x07,  // MSN 7
                  0x00, 0x00, 0x05, 0x98},  // MO 1432
                 h});
  }
  {  // RFC 5040 A.5: Send with Invalidate.
    DdpRdmapHeader h;
    h.opcode = Opcode::kSendWithInvalidate;
    h.invalidate_stag = 0xA1B2C3D4;
    h.msn = 5;
    v.push_back({"SendWithInvalidate",
                 {0x41,                    // DDP control: T=0 L=1 DV=01
                  0x44,                    // RDMAP control: OpCode=0100 (Send with Invalidate)
                  0xA1, 0xB2, 0xC3, 0xD4,  // Invalidate STag
                  0x00, 0x00, 0x00, 0x00,  // QN 0
                  0x00, 0x00, 0x00, 0x05,  // MSN 5
                  0x00, 0x00, 0x00, 0x00},  // MO 0
                 h});
  }
  {  // RFC 5040 A.4: Send with Solicited Event.
    DdpRdmapHeader h;
    h.opcode = Opcode::kSendWithSe;
    h.msn = 0xFFFFFFFF;
    v.push_back({"SendWithSe",
                 {0x41,                    // DDP control
                  0x45,                    // RDMAP control: OpCode=0101 (Send with SE)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x00,  // QN 0
                  0xFF, 0xFF, 0xFF, 0xFF,  // MSN 2^32-1 (wraps to 0 next)
                  0x00, 0x00, 0x00, 0x00},  // MO 0
                 h});
  }
  {  // RFC 5040 A.5: Send with SE and Invalidate.
    DdpRdmapHeader h;
    h.opcode = Opcode::kSendWithSeAndInvalidate;
    h.invalidate_stag = 0x00000100;
    h.msn = 2;
    v.push_back({"SendWithSeAndInvalidate",
                 {0x41,                    // DDP control
                  0x46,                    // RDMAP control: OpCode=0110 (Send with SE and Inv.)
                  0x00, 0x00, 0x01, 0x00,  // Invalidate STag
                  0x00, 0x00, 0x00, 0x00,  // QN 0
                  0x00, 0x00, 0x00, 0x02,  // MSN 2
                  0x00, 0x00, 0x00, 0x00},  // MO 0
                 h});
  }
  {  // RFC 5040 A.6: Terminate; the header covers the Terminate Control only.
    DdpRdmapHeader h;
    h.opcode = Opcode::kTerminate;
    h.qn = 2;
    h.msn = 1;
    h.body = TerminateControlBody{{0x12, 0x01, 0x00, 0x00}};
    v.push_back({"Terminate",
                 {0x41,                    // DDP control
                  0x47,                    // RDMAP control: OpCode=0111 (Terminate)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x02,  // QN 2: Terminate queue
                  0x00, 0x00, 0x00, 0x01,  // MSN 1
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0x12, 0x01, 0x00, 0x00},  // Terminate Control (DDP/untagged/Invalid QN)
                 h});
  }
  {  // RFC 7306 A.3: Immediate Data.
    DdpRdmapHeader h;
    h.opcode = Opcode::kImmediateData;
    h.msn = 3;
    h.body = ImmediateDataBody{{0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}};
    v.push_back({"ImmediateData",
                 {0x41,                    // DDP control
                  0x48,                    // RDMAP control: OpCode=1000 (Immediate Data)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x00,  // QN 0 (Send queue)
                  0x00, 0x00, 0x00, 0x03,  // MSN 3
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0x01, 0x02, 0x03, 0x04,  // Immediate Data
                  0x05, 0x06, 0x07, 0x08},
                 h});
  }
  {  // RFC 7306 A.3: Immediate Data with Solicited Event.
    DdpRdmapHeader h;
    h.opcode = Opcode::kImmediateDataWithSe;
    h.msn = 4;
    h.body = ImmediateDataBody{{0xFF, 0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99, 0x88}};
    v.push_back({"ImmediateDataWithSe",
                 {0x41,                    // DDP control
                  0x49,                    // RDMAP control: OpCode=1001 (Immediate Data with SE)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x00,  // QN 0
                  0x00, 0x00, 0x00, 0x04,  // MSN 4
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0xFF, 0xEE, 0xDD, 0xCC,  // Immediate Data
                  0xBB, 0xAA, 0x99, 0x88},
                 h});
  }
  {  // RFC 7306 A.1: Atomic Request, FetchAdd.
    DdpRdmapHeader h;
    h.opcode = Opcode::kAtomicRequest;
    h.qn = 1;
    h.msn = 2;
    AtomicRequestBody b;
    b.atomic_opcode = static_cast<std::uint8_t>(AtomicOpcode::kFetchAdd);
    b.request_id = 0x00000011;
    b.remote_stag = 0x00EE0001;
    b.remote_to = 0x0000000000001000;
    b.add_or_swap_data = 5;
    b.add_or_swap_mask = 0;
    b.compare_data = 0;
    b.compare_mask = 0xFFFFFFFFFFFFFFFF;
    h.body = b;
    v.push_back({"AtomicRequestFetchAdd",
                 {0x41,                    // DDP control
                  0x4A,                    // RDMAP control: OpCode=1010 (Atomic Request)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x01,  // QN 1 (shared with Read Requests)
                  0x00, 0x00, 0x00, 0x02,  // MSN 2
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0x00, 0x00, 0x00, 0x00,  // Reserved (28 bits) | AOpCode 0000 FetchAdd
                  0x00, 0x00, 0x00, 0x11,  // Request Identifier
                  0x00, 0xEE, 0x00, 0x01,  // Remote STag
                  0x00, 0x00, 0x00, 0x00,  // Remote Tagged Offset (high)
                  0x00, 0x00, 0x10, 0x00,  // Remote Tagged Offset (low)
                  0x00, 0x00, 0x00, 0x00,  // Add Data (high)
                  0x00, 0x00, 0x00, 0x05,  // Add Data (low)
                  0x00, 0x00, 0x00, 0x00,  // Add Mask: 0 = plain 64-bit add
                  0x00, 0x00, 0x00, 0x00,
                  0x00, 0x00, 0x00, 0x00,  // Compare Data: N/A, zero
                  0x00, 0x00, 0x00, 0x00,
                  0xFF, 0xFF, 0xFF, 0xFF,  // Compare Mask: N/A, all ones
                  0xFF, 0xFF, 0xFF, 0xFF},
                 h});
  }
  {  // RFC 7306 A.1: Atomic Request, CmpSwap.
    DdpRdmapHeader h;
    h.opcode = Opcode::kAtomicRequest;
    h.qn = 1;
    h.msn = 3;
    AtomicRequestBody b;
    b.atomic_opcode = static_cast<std::uint8_t>(AtomicOpcode::kCmpSwap);
    b.request_id = 0xCAFE0001;
    b.remote_stag = 0x00EE0001;
    b.remote_to = 0x0000000000001008;
    b.add_or_swap_data = 0x1111111111111111;
    b.add_or_swap_mask = 0xFFFFFFFF00000000;
    b.compare_data = 0x2222222222222222;
    b.compare_mask = 0x00000000FFFFFFFF;
    h.body = b;
    v.push_back({"AtomicRequestCmpSwap",
                 {0x41,                    // DDP control
                  0x4A,                    // RDMAP control: Atomic Request
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x01,  // QN 1
                  0x00, 0x00, 0x00, 0x03,  // MSN 3
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0x00, 0x00, 0x00, 0x02,  // Reserved | AOpCode 0010 CmpSwap
                  0xCA, 0xFE, 0x00, 0x01,  // Request Identifier
                  0x00, 0xEE, 0x00, 0x01,  // Remote STag
                  0x00, 0x00, 0x00, 0x00,  // Remote Tagged Offset
                  0x00, 0x00, 0x10, 0x08,
                  0x11, 0x11, 0x11, 0x11,  // Swap Data
                  0x11, 0x11, 0x11, 0x11,
                  0xFF, 0xFF, 0xFF, 0xFF,  // Swap Mask
                  0x00, 0x00, 0x00, 0x00,
                  0x22, 0x22, 0x22, 0x22,  // Compare Data
                  0x22, 0x22, 0x22, 0x22,
                  0x00, 0x00, 0x00, 0x00,  // Compare Mask
                  0xFF, 0xFF, 0xFF, 0xFF},
                 h});
  }
  {  // RFC 7306 A.2: Atomic Response.
    DdpRdmapHeader h;
    h.opcode = Opcode::kAtomicResponse;
    h.qn = 3;
    h.msn = 2;
    h.body = AtomicResponseBody{0xCAFE0001, 0x0123456789ABCDEF};
    v.push_back({"AtomicResponse",
                 {0x41,                    // DDP control
                  0x4B,                    // RDMAP control: OpCode=1011 (Atomic Response)
                  0x00, 0x00, 0x00, 0x00,  // RsvdULP[8:39]
                  0x00, 0x00, 0x00, 0x03,  // QN 3: Atomic Response queue
                  0x00, 0x00, 0x00, 0x02,  // MSN 2
                  0x00, 0x00, 0x00, 0x00,  // MO 0
                  0xCA, 0xFE, 0x00, 0x01,  // Original Request Identifier
                  0x01, 0x23, 0x45, 0x67,  // Original Remote Data Value
                  0x89, 0xAB, 0xCD, 0xEF},
                 h});
  }
  return v;
}

// Header length of each opcode by RFC arithmetic, written independently of
// the library's table: DDP header + fixed RDMAP body.
constexpr std::size_t kExpectedHeaderLength[12] = {
    14,           // RDMA Write: tagged header only
    18 + 28,      // RDMA Read Request: untagged + Read Request header
    14,           // RDMA Read Response
    18,           // Send
    18,           // Send with Invalidate
    18,           // Send with SE
    18,           // Send with SE and Invalidate
    18 + 4,       // Terminate: untagged + Terminate Control
    18 + 8,       // Immediate Data
    18 + 8,       // Immediate Data with SE
    18 + 52,      // Atomic Request
    18 + 12,      // Atomic Response
};
constexpr bool kExpectedTagged[12] = {true,  false, true,  false, false, false,
                                      false, false, false, false, false, false};
constexpr std::uint32_t kExpectedQn[12] = {0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 1, 3};

TEST(DdpRdmap, OpcodeTableMatchesRfc5040Figure4AndRfc7306Figure2) {
  for (std::uint8_t op = 0; op < 12; ++op) {
    const OpcodeInfo* info = FindOpcode(op);
    ASSERT_NE(info, nullptr) << int(op);
    EXPECT_EQ(static_cast<std::uint8_t>(info->opcode), op);
    EXPECT_EQ(info->tagged, kExpectedTagged[op]) << info->name;
    if (!info->tagged) {
      EXPECT_EQ(info->queue_number, kExpectedQn[op]) << info->name;
    }
    EXPECT_EQ(info->header_length, kExpectedHeaderLength[op]) << info->name;
    EXPECT_EQ(info->spec, op < 8 ? OpcodeSpec::kRfc5040 : OpcodeSpec::kRfc7306);
  }
  for (int op = 12; op < 256; ++op) {
    EXPECT_EQ(FindOpcode(static_cast<std::uint8_t>(op)), nullptr) << op;
  }
  // Figure 5 / RFC 7306 Figure 3: which messages carry ULP payload.
  EXPECT_EQ(FindOpcode(Opcode::kRdmaWrite)->after_header, AfterHeader::kUlpPayload);
  EXPECT_EQ(FindOpcode(Opcode::kRdmaReadRequest)->after_header, AfterHeader::kNothing);
  EXPECT_EQ(FindOpcode(Opcode::kRdmaReadResponse)->after_header, AfterHeader::kUlpPayload);
  EXPECT_EQ(FindOpcode(Opcode::kSendWithSeAndInvalidate)->after_header, AfterHeader::kUlpPayload);
  EXPECT_EQ(FindOpcode(Opcode::kTerminate)->after_header, AfterHeader::kTerminateHeaderCopies);
  EXPECT_EQ(FindOpcode(Opcode::kImmediateData)->after_header, AfterHeader::kNothing);
  EXPECT_EQ(FindOpcode(Opcode::kAtomicResponse)->after_header, AfterHeader::kNothing);
  // Only the two Invalidate variants use RsvdULP[8:39] (RFC 5040 4.1).
  for (const OpcodeInfo& info : kOpcodeTable) {
    const bool inv = info.opcode == Opcode::kSendWithInvalidate ||
                     info.opcode == Opcode::kSendWithSeAndInvalidate;
    EXPECT_EQ(info.has_invalidate_stag, inv) << info.name;
    EXPECT_EQ(info.single_segment, info.after_header != AfterHeader::kUlpPayload) << info.name;
  }
  EXPECT_EQ(OpcodeName(0x1), "RDMA Read Request");
  EXPECT_EQ(OpcodeName(0xB), "Atomic Response");
  EXPECT_EQ(OpcodeName(0xC), "unassigned opcode");
}

TEST(DdpRdmap, ControlOctetsSiwSends) {
  EXPECT_EQ(MakeDdpControl(false, true), 0x41);
  EXPECT_EQ(MakeDdpControl(true, true), 0xC1);
  EXPECT_EQ(MakeDdpControl(false, false), 0x01);
  EXPECT_EQ(MakeDdpControl(true, false), 0x81);
  EXPECT_EQ(MakeRdmapControl(Opcode::kSend), 0x43);
  EXPECT_EQ(MakeRdmapControl(Opcode::kRdmaReadRequest), 0x41);
  EXPECT_EQ(MakeRdmapControl(Opcode::kRdmaWrite), 0x40);
  EXPECT_EQ(MakeRdmapControl(Opcode::kRdmaReadResponse), 0x42);
  EXPECT_EQ(MakeRdmapControl(Opcode::kTerminate), 0x47);
  EXPECT_EQ(MakeRdmapControl(Opcode::kAtomicResponse), 0x4B);
}

TEST(DdpRdmap, DecodesEveryVector) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(v.bytes);
    ASSERT_EQ(r.status, HeaderStatus::kOk) << HeaderStatusName(r.status);
    EXPECT_EQ(r.header, v.expected);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_FALSE(r.reserved_bits_set);
    EXPECT_EQ(UlpduHeaderLength(v.bytes[0], v.bytes[1]), v.bytes.size());
    EXPECT_EQ(TerminateCauseForHeader(r), std::nullopt);
  }
}

TEST(DdpRdmap, EncodesEveryVector) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(EncodedLength(v.expected), v.bytes.size());
    Bytes out(v.bytes.size() + 3, 0xEE);
    const EncodeResult r = EncodeDdpRdmapHeader(v.expected, out);
    ASSERT_EQ(r.status, EncodeStatus::kOk) << EncodeStatusName(r.status);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_EQ(Bytes(out.begin(), out.begin() + r.length), v.bytes);
    EXPECT_EQ(out[r.length], 0xEE);  // nothing written past the header
  }
}

TEST(DdpRdmap, MakeHeaderGivesTheVectorsFields) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    DdpRdmapHeader h = MakeHeader(v.expected.opcode, v.expected.last);
    EXPECT_EQ(h.tagged, v.expected.tagged);
    EXPECT_EQ(h.qn, v.expected.qn);
    EXPECT_EQ(h.body.index(), v.expected.body.index());
    h.stag = v.expected.stag;
    h.to = v.expected.to;
    h.invalidate_stag = v.expected.invalidate_stag;
    h.msn = v.expected.msn;
    h.mo = v.expected.mo;
    h.body = v.expected.body;
    EXPECT_EQ(h, v.expected);
  }
}

// Every prefix of a valid header is truncated, and names exactly the octets
// the next check needs: 1, then the DDP header, then the whole header.
TEST(DdpRdmap, EveryPrefixIsTruncated) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    const std::size_t ddp = v.expected.tagged ? 14 : 18;
    for (std::size_t n = 0; n < v.bytes.size(); ++n) {
      const HeaderDecodeResult r = DecodeDdpRdmapHeader(ByteSpan(v.bytes).first(n));
      ASSERT_EQ(r.status, HeaderStatus::kTruncated) << "prefix " << n;
      const std::size_t needed = n == 0 ? 1 : n < ddp ? ddp : v.bytes.size();
      EXPECT_EQ(r.length, needed) << "prefix " << n;
      EXPECT_EQ(TerminateCauseForHeader(r), TerminateCause::RdmapOperationUnspecified());
    }
  }
}

TEST(DdpRdmap, ExtraOctetsAfterTheHeaderAreNotLookedAt) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    const Bytes longer = Concat({v.bytes, Bytes(100, 0xA5)});
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(longer);
    ASSERT_EQ(r.status, HeaderStatus::kOk);
    EXPECT_EQ(r.length, v.bytes.size());
    EXPECT_EQ(r.header, v.expected);
  }
}

// A valid untagged Send header with the given control octets and QN.
Bytes UntaggedHeader(std::uint8_t ddp_control, std::uint8_t rdmap_control, std::uint32_t qn,
                     std::uint32_t mo = 0, std::size_t total = 18) {
  Bytes b(total, 0);
  b[0] = ddp_control;
  b[1] = rdmap_control;
  StoreBe32(&b[6], qn);
  StoreBe32(&b[10], 1);  // MSN
  StoreBe32(&b[14], mo);
  return b;
}

TEST(DdpRdmap, InvalidDdpVersion) {
  for (std::uint8_t dv : {0, 2, 3}) {
    for (bool tagged : {false, true}) {
      SCOPED_TRACE(testing::Message() << "DV " << int(dv) << " tagged " << tagged);
      Bytes b(18, 0);
      b[0] = static_cast<std::uint8_t>((tagged ? 0xC0 : 0x40) | dv);  // T, L=1, DV
      b[1] = 0x43;
      const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
      EXPECT_EQ(r.status, HeaderStatus::kInvalidDdpVersion);
      EXPECT_EQ(r.header.ddp_version, dv);
      EXPECT_EQ(r.header.tagged, tagged);
      // One octet is enough to reject it: the layout after it is unknown.
      EXPECT_EQ(DecodeDdpRdmapHeader(ByteSpan(b).first(1)).status, HeaderStatus::kInvalidDdpVersion);
      EXPECT_EQ(UlpduHeaderLength(b[0], b[1]), tagged ? 14u : 18u);
      // RFC 5041 7.2: 0x1/0x1/0x04 tagged, 0x1/0x2/0x06 untagged.
      EXPECT_EQ(TerminateCauseForHeader(r),
                tagged ? (TerminateCause{1, 1, 0x04}) : (TerminateCause{1, 2, 0x06}));
    }
  }
}

TEST(DdpRdmap, InvalidRdmapVersion) {
  for (std::uint8_t rv : {0, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "RV " << int(rv));
    const std::uint8_t rdmap = static_cast<std::uint8_t>((rv << 6) | 0x03);  // Send
    const Bytes untagged = UntaggedHeader(0x41, rdmap, 0);
    HeaderDecodeResult r = DecodeDdpRdmapHeader(untagged);
    EXPECT_EQ(r.status, HeaderStatus::kInvalidRdmapVersion);
    EXPECT_EQ(r.header.rdmap_version, rv);
    EXPECT_EQ(UlpduHeaderLength(untagged[0], untagged[1]), 18u);
    EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{0, 2, 0x05}));

    Bytes tagged(14, 0);
    tagged[0] = 0xC1;
    tagged[1] = static_cast<std::uint8_t>(rv << 6);  // Write
    r = DecodeDdpRdmapHeader(tagged);
    EXPECT_EQ(r.status, HeaderStatus::kInvalidRdmapVersion);
    EXPECT_EQ(UlpduHeaderLength(tagged[0], tagged[1]), 14u);
  }
}

TEST(DdpRdmap, UnassignedOpcodes) {
  for (std::uint8_t op = 0xC; op <= 0xF; ++op) {
    SCOPED_TRACE(testing::Message() << "opcode " << int(op));
    const Bytes untagged = UntaggedHeader(0x41, static_cast<std::uint8_t>(0x40 | op), 0);
    HeaderDecodeResult r = DecodeDdpRdmapHeader(untagged);
    EXPECT_EQ(r.status, HeaderStatus::kUnknownOpcode);
    EXPECT_EQ(static_cast<int>(r.header.opcode), op);
    EXPECT_EQ(UlpduHeaderLength(untagged[0], untagged[1]), 18u);
    EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{0, 2, 0x06}));

    Bytes tagged(14, 0);
    tagged[0] = 0xC1;
    tagged[1] = static_cast<std::uint8_t>(0x40 | op);
    r = DecodeDdpRdmapHeader(tagged);
    EXPECT_EQ(r.status, HeaderStatus::kUnknownOpcode);
    EXPECT_EQ(UlpduHeaderLength(tagged[0], tagged[1]), 14u);
  }
}

TEST(DdpRdmap, TaggedFlagContradictingTheOpcode) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    SCOPED_TRACE(info.name);
    // The other buffer model's header, long enough for either.
    Bytes b(80, 0);
    b[0] = info.tagged ? 0x41 : 0xC1;
    b[1] = MakeRdmapControl(info.opcode);  // QN (if untagged) is 0, a queue that exists
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
    EXPECT_EQ(r.status, HeaderStatus::kTaggedFlagMismatch);
    EXPECT_EQ(UlpduHeaderLength(b[0], b[1]), info.tagged ? 18u : 14u);
    EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{0, 2, 0x06}));
  }
}

TEST(DdpRdmap, QueueNumberNotTheOpcodes) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (info.tagged) continue;
    for (std::uint32_t qn = 0; qn <= 3; ++qn) {
      if (qn == info.queue_number) continue;
      SCOPED_TRACE(testing::Message() << info.name << " on QN " << qn);
      const Bytes b = UntaggedHeader(0x41, MakeRdmapControl(info.opcode), qn, 0, 80);
      const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
      EXPECT_EQ(r.status, HeaderStatus::kWrongQueueNumber);
      EXPECT_EQ(r.header.qn, qn);
      EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{1, 2, 0x01}));
    }
  }
}

TEST(DdpRdmap, ReadRequestOnTheSendQueueIsRejected) {
  // siw serves this; RFC 5040 5.2.1 requires QN 1.
  Vector v = AllVectors()[2];
  ASSERT_EQ(v.name, "RdmaReadRequest");
  v.bytes[9] = 0x00;  // QN 1 -> 0
  const HeaderDecodeResult r = DecodeDdpRdmapHeader(v.bytes);
  EXPECT_EQ(r.status, HeaderStatus::kWrongQueueNumber);
  EXPECT_EQ(HeaderStatusName(r.status), "queue number is not the opcode's queue");
}

TEST(DdpRdmap, QueueNumberNamingNoQueue) {
  for (std::uint32_t qn : {4u, 5u, 0x100u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(qn);
    const Bytes b = UntaggedHeader(0x41, 0x43, qn);
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
    EXPECT_EQ(r.status, HeaderStatus::kInvalidQueueNumber);
    EXPECT_EQ(r.header.qn, qn);
    EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{1, 2, 0x01}));
  }
}

TEST(DdpRdmap, DdpChecksComeBeforeRdmapChecks) {
  // Bad DV and bad RV: the DDP version is reported.
  Bytes b = UntaggedHeader(0x42, 0x03, 0);
  EXPECT_EQ(DecodeDdpRdmapHeader(b).status, HeaderStatus::kInvalidDdpVersion);
  // Unknown QN and bad RV: the QN is reported.
  b = UntaggedHeader(0x41, 0x83, 9);
  EXPECT_EQ(DecodeDdpRdmapHeader(b).status, HeaderStatus::kInvalidQueueNumber);
  // Bad RV and unassigned opcode: the version is reported.
  b = UntaggedHeader(0x41, 0x0F, 0);
  EXPECT_EQ(DecodeDdpRdmapHeader(b).status, HeaderStatus::kInvalidRdmapVersion);
}

TEST(DdpRdmap, SingleSegmentMessagesNeedMoZeroAndLast) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (info.tagged) continue;
    SCOPED_TRACE(info.name);
    const std::uint8_t rdmap = MakeRdmapControl(info.opcode);
    // MO 28 on a later segment.
    Bytes b = UntaggedHeader(0x41, rdmap, info.queue_number, 28, info.header_length);
    HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
    if (info.single_segment) {
      EXPECT_EQ(r.status, HeaderStatus::kNonZeroMessageOffset);
      EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{1, 2, 0x04}));
    } else {
      EXPECT_EQ(r.status, HeaderStatus::kOk);
    }
    // L clear: the message would continue past its header.
    b = UntaggedHeader(0x01, rdmap, info.queue_number, 0, info.header_length);
    r = DecodeDdpRdmapHeader(b);
    if (info.single_segment) {
      EXPECT_EQ(r.status, HeaderStatus::kNotLastSegment);
      EXPECT_EQ(TerminateCauseForHeader(r), (TerminateCause{1, 2, 0x05}));
    } else {
      EXPECT_EQ(r.status, HeaderStatus::kOk);
    }
  }
}

// RFC 5040 4.1 / RFC 5041 4.1: reserved fields are ignored on receive.
TEST(DdpRdmap, ReservedBitsAreReportedNotRejected) {
  const std::vector<Vector> all = AllVectors();
  Vector send = all[4];
  ASSERT_EQ(send.name, "SendLast");
  struct Case {
    const char* what;
    std::size_t octet;
    std::uint8_t value;
  };
  for (const Case& c : {Case{"DDP Rsvd", 0, 0x41 | 0x3C}, Case{"RDMAP Rsv", 1, 0x43 | 0x30},
                        Case{"RsvdULP[8:39]", 5, 0x01}}) {
    SCOPED_TRACE(c.what);
    Bytes b = send.bytes;
    b[c.octet] = c.value;
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
    EXPECT_EQ(r.status, HeaderStatus::kOk);
    EXPECT_TRUE(r.reserved_bits_set);
    // The raw value survives a round trip.
    Bytes out(b.size());
    ASSERT_EQ(EncodeDdpRdmapHeader(r.header, out).status, EncodeStatus::kOk);
    EXPECT_EQ(out, b);
  }
  Bytes b = send.bytes;
  b[0] = 0x41 | 0x3C;
  EXPECT_EQ(DecodeDdpRdmapHeader(b).header.ddp_reserved, 0xF);
  b[1] = 0x43 | 0x20;
  EXPECT_EQ(DecodeDdpRdmapHeader(b).header.rdmap_reserved, 0x2);

  // The Invalidate STag of Send with Invalidate is not reserved.
  EXPECT_FALSE(DecodeDdpRdmapHeader(all[5].bytes).reserved_bits_set);

  Vector atomic = all[11];
  ASSERT_EQ(atomic.name, "AtomicRequestFetchAdd");
  atomic.bytes[18] = 0x80;  // top reserved bit of the AOpCode word
  const HeaderDecodeResult r = DecodeDdpRdmapHeader(atomic.bytes);
  EXPECT_EQ(r.status, HeaderStatus::kOk);
  EXPECT_TRUE(r.reserved_bits_set);
  EXPECT_EQ(std::get<AtomicRequestBody>(r.header.body).reserved, 0x08000000u);
  EXPECT_EQ(std::get<AtomicRequestBody>(r.header.body).atomic_opcode, 0);
}

TEST(DdpRdmap, UnknownAtomicOpcodeIsDecodedForTheEngineToReject) {
  Vector v = AllVectors()[11];
  v.bytes[21] = 0x01;  // AOpCode 0001: reserved (RFC 7306 10.1)
  const HeaderDecodeResult r = DecodeDdpRdmapHeader(v.bytes);
  ASSERT_EQ(r.status, HeaderStatus::kOk);
  EXPECT_EQ(std::get<AtomicRequestBody>(r.header.body).atomic_opcode, 1);
}

// The FPDU parser sizes headers with UlpduHeaderLength; the decoder must
// agree on every pair of control octets, and a buffer of exactly that many
// octets must never be reported truncated.
TEST(DdpRdmap, HeaderLengthAgreesWithDecodeForAllControlOctets) {
  for (int c0 = 0; c0 < 256; ++c0) {
    for (int c1 = 0; c1 < 256; ++c1) {
      const auto ddp = static_cast<std::uint8_t>(c0);
      const auto rdmap = static_cast<std::uint8_t>(c1);
      const bool tagged = (ddp & 0x80) != 0;
      const int op = rdmap & 0x0F;
      const bool usable = (ddp & 0x03) == 1 && (rdmap >> 6) == 1 && op < 12 &&
                          kExpectedTagged[op] == tagged;
      const std::size_t expected = usable ? kExpectedHeaderLength[op] : tagged ? 14 : 18;
      const std::size_t len = UlpduHeaderLength(ddp, rdmap);
      ASSERT_EQ(len, expected) << c0 << "," << c1;

      Bytes b(len, 0);
      b[0] = ddp;
      b[1] = rdmap;
      if (!tagged && op < 12) StoreBe32(&b[6], kExpectedQn[op]);
      const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
      ASSERT_NE(r.status, HeaderStatus::kTruncated) << c0 << "," << c1;
      if (r.status == HeaderStatus::kOk) {
        ASSERT_EQ(r.length, len) << c0 << "," << c1;
      }
      ASSERT_EQ(r.status == HeaderStatus::kOk || r.status == HeaderStatus::kNotLastSegment,
                usable)
          << c0 << "," << c1 << " " << HeaderStatusName(r.status);
    }
  }
}

TEST(DdpRdmap, EncodeIntoEveryShortBufferWritesNothing) {
  for (const Vector& v : AllVectors()) {
    SCOPED_TRACE(v.name);
    for (std::size_t n = 0; n < v.bytes.size(); ++n) {
      Bytes out(n, 0x5A);
      const EncodeResult r = EncodeDdpRdmapHeader(v.expected, out);
      ASSERT_EQ(r.status, EncodeStatus::kBufferTooSmall);
      EXPECT_EQ(r.length, v.bytes.size());
      EXPECT_EQ(out, Bytes(n, 0x5A));
    }
  }
}

TEST(DdpRdmap, EncodeRejectsFieldsWiderThanTheWire) {
  Bytes out(80, 0);
  auto check = [&](DdpRdmapHeader h) {
    EXPECT_EQ(EncodeDdpRdmapHeader(h, out).status, EncodeStatus::kFieldOutOfRange);
  };
  DdpRdmapHeader h = MakeHeader(Opcode::kSend, true);
  h.ddp_reserved = 0x10;
  check(h);
  h = MakeHeader(Opcode::kSend, true);
  h.ddp_version = 4;
  check(h);
  h = MakeHeader(Opcode::kSend, true);
  h.rdmap_version = 4;
  check(h);
  h = MakeHeader(Opcode::kSend, true);
  h.rdmap_reserved = 4;
  check(h);
  h = MakeHeader(Opcode::kSend, true);
  h.opcode = static_cast<Opcode>(0x10);
  check(h);
  h = MakeHeader(Opcode::kAtomicRequest, true);
  std::get<AtomicRequestBody>(h.body).atomic_opcode = 0x10;
  check(h);
  h = MakeHeader(Opcode::kAtomicRequest, true);
  std::get<AtomicRequestBody>(h.body).reserved = 0x10000000;
  check(h);
  EXPECT_EQ(out, Bytes(80, 0));
  // The widest values that fit are accepted.
  h = MakeHeader(Opcode::kAtomicRequest, true);
  h.ddp_reserved = 0xF;
  h.ddp_version = 3;
  h.rdmap_version = 3;
  h.rdmap_reserved = 3;
  std::get<AtomicRequestBody>(h.body).reserved = 0x0FFFFFFF;
  std::get<AtomicRequestBody>(h.body).atomic_opcode = 0xF;
  EXPECT_EQ(EncodeDdpRdmapHeader(h, out).status, EncodeStatus::kOk);
  EXPECT_EQ(out[0], 0x7F);  // T=0 L=1 Rsvd=1111 DV=11
  EXPECT_EQ(out[1], 0xFA);  // RV=11 Rsv=11 OpCode=1010
  EXPECT_EQ(out[18], 0xFF);
  EXPECT_EQ(out[21], 0xFF);
}

TEST(DdpRdmap, ReadRequestBodyCodec) {
  const ReadRequestBody body{0x01020304, 0x1112131415161718, 0x21222324, 0x31323334,
                             0x4142434445464748};
  Bytes out(28);
  ASSERT_TRUE(EncodeReadRequestBody(body, out));
  EXPECT_EQ(out, (Bytes{0x01, 0x02, 0x03, 0x04,                           // Data Sink STag
                        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,   // Data Sink TO
                        0x21, 0x22, 0x23, 0x24,                           // RDMARDSZ
                        0x31, 0x32, 0x33, 0x34,                           // Data Source STag
                        0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48}));  // Data Source TO
  ReadRequestBody back;
  ASSERT_TRUE(DecodeReadRequestBody(out, back));
  EXPECT_EQ(back, body);
  Bytes short_out(27, 0);
  EXPECT_FALSE(EncodeReadRequestBody(body, short_out));
  EXPECT_EQ(short_out, Bytes(27, 0));
  EXPECT_FALSE(DecodeReadRequestBody(ByteSpan(out).first(27), back));
}

TEST(DdpRdmap, RandomHeadersRoundTrip) {
  std::mt19937_64 rng(0x5157);
  for (int i = 0; i < 20000; ++i) {
    const auto op = static_cast<Opcode>(rng() % 12);
    DdpRdmapHeader h = MakeHeader(op, true);
    h.ddp_reserved = rng() % 16;
    h.rdmap_reserved = rng() % 4;
    if (h.tagged) {
      h.last = rng() % 2;
      h.stag = static_cast<std::uint32_t>(rng());
      h.to = rng();
    } else {
      h.invalidate_stag = static_cast<std::uint32_t>(rng());
      h.msn = static_cast<std::uint32_t>(rng());
      if (!FindOpcode(op)->single_segment) {
        h.last = rng() % 2;
        h.mo = static_cast<std::uint32_t>(rng());
      }
    }
    if (auto* rr = std::get_if<ReadRequestBody>(&h.body)) {
      *rr = {static_cast<std::uint32_t>(rng()), rng(), static_cast<std::uint32_t>(rng()),
             static_cast<std::uint32_t>(rng()), rng()};
    } else if (auto* imm = std::get_if<ImmediateDataBody>(&h.body)) {
      for (auto& o : imm->data) o = static_cast<std::uint8_t>(rng());
    } else if (auto* areq = std::get_if<AtomicRequestBody>(&h.body)) {
      *areq = {static_cast<std::uint32_t>(rng() & 0x0FFFFFFF),
               static_cast<std::uint8_t>(rng() % 16),
               static_cast<std::uint32_t>(rng()),
               static_cast<std::uint32_t>(rng()),
               rng(), rng(), rng(), rng(), rng()};
    } else if (auto* aresp = std::get_if<AtomicResponseBody>(&h.body)) {
      *aresp = {static_cast<std::uint32_t>(rng()), rng()};
    } else if (auto* term = std::get_if<TerminateControlBody>(&h.body)) {
      for (auto& o : term->octets) o = static_cast<std::uint8_t>(rng());
    }
    Bytes out(EncodedLength(h));
    ASSERT_EQ(EncodeDdpRdmapHeader(h, out).status, EncodeStatus::kOk);
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(out);
    ASSERT_EQ(r.status, HeaderStatus::kOk) << HeaderStatusName(r.status);
    ASSERT_EQ(r.header, h);
    ASSERT_EQ(r.length, out.size());
  }
}

// Arbitrary octets never crash the decoder and never claim more than they hold.
TEST(DdpRdmap, RandomOctetsDecodeSafely) {
  std::mt19937 rng(7);
  for (int i = 0; i < 50000; ++i) {
    Bytes b(rng() % 80);
    for (auto& o : b) o = static_cast<std::uint8_t>(rng());
    const HeaderDecodeResult r = DecodeDdpRdmapHeader(b);
    if (r.status == HeaderStatus::kOk) {
      ASSERT_LE(r.length, b.size());
      ASSERT_EQ(r.length, UlpduHeaderLength(b[0], b[1]));
    } else if (r.status == HeaderStatus::kTruncated) {
      ASSERT_GT(r.length, b.size());
    }
  }
}

TEST(DdpRdmap, StatusNames) {
  EXPECT_EQ(HeaderStatusName(HeaderStatus::kInvalidDdpVersion), "invalid DDP version");
  EXPECT_EQ(HeaderStatusName(HeaderStatus::kUnknownOpcode), "unassigned RDMAP opcode");
  EXPECT_EQ(EncodeStatusName(EncodeStatus::kBufferTooSmall), "output buffer too small");
}

}  // namespace
}  // namespace siwx::rdmap
