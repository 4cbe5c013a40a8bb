// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The checks the receive side makes on an inbound DDP segment's header
// before it places anything, as pure functions: the decoded header and the
// bit of receive state a rule needs go in (expected MSN, octets placed so
// far, the Read the response is for, the outcome of the STag lookup), and
// out comes a verdict: accept, or the Terminate cause (RFC 5040 4.8 layer,
// error type and code; RFC 5041 7.2 for the DDP ones) with the status the
// local WR it hits completes with. No I/O, no locks, no QP: the unit tests
// (tests/unit/engine_rx_checks_test.cc) check every rule on its own.
//
// Each function checks one group of rules in the order the receive side
// applies them (rx.cc); the first rule that fails decides. What needs the
// QP (taking a receive WR, looking up an STag, reading the IRD count) the
// caller does between the calls, and hands in the result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/engine/access.h"
#include "common/engine/completion.h"
#include "common/engine/stream_params.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/terminate.h"

namespace siwx::engine {

// What a header check decided.
struct RxVerdict {
  std::optional<rdmap::TerminateCause> cause;  // nullopt: accepted
  // The Terminate carries the segment's DDP/RDMAP header copies (RFC 5040
  // 4.8); false for errors that are not the peer's header's fault.
  bool copy_header = true;
  std::optional<WcStatus> recv_status;  // for the receive WR of the message in progress
  std::optional<WcStatus> read_status;  // for our Read WR whose response this is

  bool accepted() const { return !cause.has_value(); }
  static RxVerdict Accept() { return {}; }
  static RxVerdict Reject(const rdmap::TerminateCause& cause) {
    RxVerdict v;
    v.cause = cause;
    return v;
  }
};

// The Terminate cause for a tagged segment (RDMA Write, Read Response) whose
// target failed the access check: the DDP column of access.h, except that
// DDP has no access-rights code, so that one is RDMAP's (RFC 5040 4.8).
rdmap::TerminateCause TaggedPlacementCause(AccessStatus status);
// The Terminate cause for an RDMA Read Request whose Data Source failed the
// access check: RDMAP Remote Protection (RFC 5040 4.8, the RDMAP column).
rdmap::TerminateCause ReadSourceCause(AccessStatus status);

// ---- Every segment ----

// The header as decoded: a header the codec refused (version, QN, opcode
// against T flag, truncation) gets its cause (TerminateCauseForHeader), and
// an opcode outside RFC 5040 (RFC 7306 was never negotiated) is an
// Unexpected OpCode (RFC 5040 4.8, 0/2/06).
RxVerdict CheckDecodedHeader(const rdmap::HeaderDecodeResult& decoded, bool truncated);

// The RTR types a stream accepts as the first message: rtr_accept_mask, or
// the one rtr_message when that is 0.
unsigned AcceptedRtrMask(const StreamParams& params);
// The first message of a stream that awaits an RTR (RFC 6581 7.1): a
// zero-length Send (QN 0, MSN 1, MO 0), Write, or Read Request (QN 1, MSN 1,
// size 0) of a type in `accepted_mask`, with L set. Anything else is an
// MPA "No matching RTR option" (RFC 6581 7.1, 2/0/07), without copies.
RxVerdict CheckRtr(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                   unsigned accepted_mask);

// ---- Untagged QN 0: Sends (RFC 5041 5.3, 7.1) ----

struct SendQueueState {
  bool message_active = false;   // a Send is partly placed
  std::uint32_t expected_msn = 1;
  std::uint64_t placed = 0;      // octets of the active Send placed so far (its next MO)
};
// MSN and MO of a Send segment: the MSN is the next one (messages arrive in
// order), the MO 0 on a new message and the octets placed so far on a
// continuing one.
RxVerdict CheckSendPosition(const rdmap::DdpRdmapHeader& h, const SendQueueState& state);
// The receive buffer for it: `buffer_length` is the total length of the
// receive WR the message goes to, nullopt when none is posted.
RxVerdict CheckSendBuffer(std::optional<std::uint64_t> buffer_length,
                          const rdmap::DdpRdmapHeader& h, std::size_t payload_length);

// ---- Tagged: RDMA Write and Read Response (RFC 5041 7.1, RFC 5040 5.2) ----

// The STag lookup of a tagged target (STag, stream's PD, rights, TO wrap,
// bounds), made only for a segment with payload.
RxVerdict CheckWriteTarget(AccessStatus lookup);

// The Read a Read Response segment is for: the oldest outstanding one
// (responses come in request order), and how much of it has arrived.
struct ExpectedResponse {
  std::uint32_t sink_stag = 0;
  std::uint64_t sink_to = 0;
  std::uint64_t size = 0;       // RDMARDSZ
  std::uint64_t received = 0;   // octets placed so far
};
// A Read Response must answer an outstanding Read (`expected` nullopt: none
// is), be placed at its Data Sink STag and at the next TO, stay within
// RDMARDSZ, and not end (L) before all of it arrived.
RxVerdict CheckReadResponse(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                            const std::optional<ExpectedResponse>& expected);
// The STag lookup of the Data Sink: our own Read fails with LocProtErr.
RxVerdict CheckReadResponseTarget(AccessStatus lookup);

// ---- Untagged QN 1: RDMA Read Requests (RFC 5040 5.2, RFC 5041 7.1) ----

// Body, length and MSN: the request is exactly its header, with the next MSN.
RxVerdict CheckReadRequest(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                           std::uint32_t expected_msn);
// QN 1 holds IRD buffers: a request while IRD are outstanding finds none.
RxVerdict CheckReadRequestBuffer(std::uint32_t outstanding, std::uint32_t ird);
// The STag lookup of the Data Source (made only when RDMARDSZ > 0).
RxVerdict CheckReadSource(AccessStatus lookup);

}  // namespace siwx::engine
