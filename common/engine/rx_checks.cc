// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/engine/rx_checks.h"

#include <variant>

namespace siwx::engine {
namespace {

using rdmap::TerminateCause;

RxVerdict RejectWithRead(const TerminateCause& cause, WcStatus read_status) {
  RxVerdict v = RxVerdict::Reject(cause);
  v.read_status = read_status;
  return v;
}

}  // namespace

rdmap::TerminateCause TaggedPlacementCause(AccessStatus status) {
  switch (status) {
    case AccessStatus::kInvalidStag:
    case AccessStatus::kInvalidated:
      return TerminateCause::DdpInvalidStag();
    case AccessStatus::kPdMismatch:
      return TerminateCause::DdpStagNotAssociated();
    case AccessStatus::kAccessViolation:
      // DDP has no access-rights code; RDMAP has (access.h).
      return TerminateCause::RdmapAccessRights();
    case AccessStatus::kToWrap:
      return TerminateCause::DdpToWrap();
    case AccessStatus::kBaseOrBounds:
    case AccessStatus::kOk:
      break;
  }
  return TerminateCause::DdpBaseOrBounds();
}

rdmap::TerminateCause ReadSourceCause(AccessStatus status) {
  switch (status) {
    case AccessStatus::kInvalidStag:
    case AccessStatus::kInvalidated:
      return TerminateCause::RdmapInvalidStag();
    case AccessStatus::kPdMismatch:
      return TerminateCause::RdmapStagNotAssociated();
    case AccessStatus::kAccessViolation:
      return TerminateCause::RdmapAccessRights();
    case AccessStatus::kToWrap:
      return TerminateCause::RdmapToWrap();
    case AccessStatus::kBaseOrBounds:
    case AccessStatus::kOk:
      break;
  }
  return TerminateCause::RdmapBaseOrBounds();
}

RxVerdict CheckDecodedHeader(const rdmap::HeaderDecodeResult& decoded, bool truncated) {
  if (truncated || decoded.status != rdmap::HeaderStatus::kOk) {
    const std::optional<TerminateCause> cause = rdmap::TerminateCauseForHeader(decoded);
    return RxVerdict::Reject(cause.value_or(TerminateCause::RdmapOperationUnspecified()));
  }
  const rdmap::OpcodeInfo* op = rdmap::FindOpcode(decoded.header.opcode);
  // RFC 7306 messages are recognised but not offered (no RFC 7306 support
  // was negotiated): Unexpected OpCode.
  if (op == nullptr || op->spec != rdmap::OpcodeSpec::kRfc5040) {
    return RxVerdict::Reject(TerminateCause::RdmapUnexpectedOpcode());
  }
  return RxVerdict::Accept();
}

unsigned AcceptedRtrMask(const StreamParams& params) {
  return params.rtr_accept_mask != 0 ? params.rtr_accept_mask
                                     : 1u << static_cast<unsigned>(params.rtr_message);
}

RxVerdict CheckRtr(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                   unsigned accepted_mask) {
  // RFC 6581 7.1: the first message must be a zero-length RTR of a type the
  // Reply advertised (9.2: the Initiator picks one of them).
  auto allowed = [&](RtrMessage m) {
    return (accepted_mask & (1u << static_cast<unsigned>(m))) != 0;
  };
  const auto* body = std::get_if<rdmap::ReadRequestBody>(&h.body);
  const bool match =
      (allowed(RtrMessage::kSend) && h.opcode == rdmap::Opcode::kSend && h.msn == 1 &&
       h.mo == 0 && h.last && payload_length == 0) ||
      (allowed(RtrMessage::kWrite) && h.opcode == rdmap::Opcode::kRdmaWrite && h.last &&
       payload_length == 0) ||
      (allowed(RtrMessage::kRead) && h.opcode == rdmap::Opcode::kRdmaReadRequest &&
       h.msn == 1 && body != nullptr && body->read_size == 0 && payload_length == 0);
  if (match) return RxVerdict::Accept();
  RxVerdict v = RxVerdict::Reject(TerminateCause::MpaNoMatchingRtr());
  v.copy_header = false;
  return v;
}

RxVerdict CheckSendPosition(const rdmap::DdpRdmapHeader& h, const SendQueueState& state) {
  // RFC 5041 5.3 / 7.1: the MSN names the untagged buffer (the receive WR)
  // and the MO the offset into it. Messages arrive in order over MPA, so the
  // MSN is the next one (or the current one, mid-message) and the MO the
  // octets placed so far.
  if (h.msn != state.expected_msn) return RxVerdict::Reject(TerminateCause::DdpInvalidMsnRange());
  const std::uint64_t expected_mo = state.message_active ? state.placed : 0;
  if (h.mo != expected_mo) return RxVerdict::Reject(TerminateCause::DdpInvalidMo());
  return RxVerdict::Accept();
}

RxVerdict CheckSendBuffer(std::optional<std::uint64_t> buffer_length,
                          const rdmap::DdpRdmapHeader& h, std::size_t payload_length) {
  if (!buffer_length) return RxVerdict::Reject(TerminateCause::DdpNoBuffer());
  if (std::uint64_t{h.mo} + payload_length > *buffer_length) {
    RxVerdict v = RxVerdict::Reject(TerminateCause::DdpMessageTooLong());
    v.recv_status = WcStatus::kLocLenErr;
    return v;
  }
  return RxVerdict::Accept();
}

RxVerdict CheckWriteTarget(AccessStatus lookup) {
  // RFC 5041 7.1 / RFC 5042 6: STag, PD (stream), rights, wrap, bounds.
  if (lookup == AccessStatus::kOk) return RxVerdict::Accept();
  return RxVerdict::Reject(TaggedPlacementCause(lookup));
}

RxVerdict CheckReadResponse(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                            const std::optional<ExpectedResponse>& expected) {
  // For the oldest outstanding Read Request (RFC 5040 5.2, responses come
  // in request order), into the sink it named.
  if (!expected) return RxVerdict::Reject(TerminateCause::RdmapUnexpectedOpcode());
  if (h.stag != expected->sink_stag) {
    return RejectWithRead(TerminateCause::DdpInvalidStag(), WcStatus::kBadRespErr);
  }
  const std::uint64_t end = expected->received + payload_length;
  if (h.to != expected->sink_to + expected->received || end > expected->size) {
    return RejectWithRead(TerminateCause::DdpBaseOrBounds(), WcStatus::kBadRespErr);
  }
  if (h.last && end != expected->size) {
    // The response ended before RDMARDSZ octets arrived.
    return RejectWithRead(TerminateCause::RdmapOperationUnspecified(), WcStatus::kBadRespErr);
  }
  return RxVerdict::Accept();
}

RxVerdict CheckReadResponseTarget(AccessStatus lookup) {
  if (lookup == AccessStatus::kOk) return RxVerdict::Accept();
  return RejectWithRead(TaggedPlacementCause(lookup), WcStatus::kLocProtErr);
}

RxVerdict CheckReadRequest(const rdmap::DdpRdmapHeader& h, std::size_t payload_length,
                           std::uint32_t expected_msn) {
  if (std::get_if<rdmap::ReadRequestBody>(&h.body) == nullptr) {
    return RxVerdict::Reject(TerminateCause::RdmapOperationUnspecified());
  }
  // The Read Request is exactly its header: more is too long for the QN 1
  // buffer it goes to.
  if (payload_length > 0) return RxVerdict::Reject(TerminateCause::DdpMessageTooLong());
  if (h.msn != expected_msn) return RxVerdict::Reject(TerminateCause::DdpInvalidMsnRange());
  return RxVerdict::Accept();
}

RxVerdict CheckReadRequestBuffer(std::uint32_t outstanding, std::uint32_t ird) {
  // QN 1 holds IRD buffers (RFC 5040 5.2.1: "One RDMA Read Request Message
  // MUST consume one Untagged Buffer"; 5.2.2: the Data Source provides
  // buffers for the negotiated number of Reads). A request counts until the
  // last octet of its response went to the kernel; one more finds no
  // buffer: DDP "Invalid MSN - no buffer available" (RFC 5041 7.2).
  if (outstanding >= ird) return RxVerdict::Reject(TerminateCause::DdpNoBuffer());
  return RxVerdict::Accept();
}

RxVerdict CheckReadSource(AccessStatus lookup) {
  if (lookup == AccessStatus::kOk) return RxVerdict::Accept();
  return RxVerdict::Reject(ReadSourceCause(lookup));
}

}  // namespace siwx::engine
