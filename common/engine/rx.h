// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The receive side of a QP: reads the FPDU stream with the parser's pull
// interface (FpduParser, RFC 5044), validates every DDP segment and RDMAP
// message (RFC 5041 7, RFC 5040 7) and places payload directly into its
// target: registered memory for tagged segments (RDMA Write, Read Response),
// the posted receive WR's SGEs for untagged Sends.
//
// Placement. Small payloads and all framing go through a staging buffer:
// one recvmsg reads a large chunk of the stream into it (64 KiB), the parser
// walks every FPDU in it, and each payload piece is copied into its target,
// so MTU-sized FPDUs (what every non-siwx peer sends) cost a fraction of a
// system call each. A payload demand of at least kDirectPlacementMin octets
// (12 KiB, where the copy starts to cost more than the call it saves), the
// rest of any payload that large, and the payload of the FPDU after such a
// large one, are instead received straight into their target with one
// recvmsg each, whose iovec
// is the target range(s) of exactly the demanded octets plus a small
// staging tail for the next FPDU's trailer and header
// (docs/performance-notes.md 2). Nothing is ever read into a target beyond
// what the parser demanded: the staging buffer takes everything else.
//
// Validation comes before placement: a segment is checked whole when its
// header arrives (STag, PD, rights, bounds, MSN, MO, lengths); one that fails
// is not placed at all, its payload is read and CRC-checked by the parser
// and dropped, and the Terminate is raised when the FPDU ends, so a CRC
// error in the same FPDU takes precedence (RFC 5044 8). Each placement into
// registered memory re-checks the range it writes (against the region
// already held for this read, pin_, else in the table), and RegionRefs are
// held only for the octets of one read (memory.h).
//
// Registered memory whose protection the application changed (mprotect
// read-only, munmap) after registering it breaks the registration, which
// checked the mappings (providers/siwx/memory_map.h). recvmsg straight into
// such a target fails with EFAULT and ends the stream as a local protection
// error (PlacementFaulted). Payload that came in the staging buffer (every
// piece below kDirectPlacementMin) is copied with memcpy, which faults
// (SIGSEGV) like a store by the application itself: a kernel provider's
// pinned pages take the NIC's writes whatever the protection, a userspace
// copy cannot, and a copy that reports the fault instead (a check per copy,
// or process_vm_writev: 5x the memcpy time, performance-notes.md 2) would
// cost more than the system calls the staging buffer saves.
//
// Payload is placed before the FPDU's CRC has been checked (direct
// placement); only a completed FPDU with a good CRC completes anything.
// After an error nothing more is processed: what arrives is read and
// dropped until the peer closes.
//
// Threading: every method runs with the QP's rx_mutex_ held, by the
// progress thread (socket readable, commands) or by an application thread
// that polls one of the QP's CQs empty (Qp::DriveFromPoll, which only tries
// the lock); no lock of its own. It reaches the QP only through QpForRx
// (qp_sides.h), whose calls take queue_mutex_ briefly for the SQ, ORQ and
// IRQ; when it kicks the transmit side (Read Responses owed, the RTR, an
// ORD slot opened) and the gate is free, the transmit side runs on this
// same thread (qp.h).
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "common/engine/access.h"
#include "common/engine/completion.h"
#include "common/engine/memory.h"
#include "common/engine/qp_sides.h"
#include "common/engine/rx_checks.h"
#include "common/engine/stream_params.h"
#include "common/engine/work_request.h"
#include "common/transport/tcp_stream.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/fpdu_parser.h"
#include "common/wire/terminate.h"

namespace siwx::engine {

class QpRx {
 public:
  // One recvmsg into the staging buffer fetches up to this much of the
  // stream; every FPDU in it is parsed and its payload copied out.
  static constexpr std::size_t kStagingSize = 64 * 1024;
  // A payload demand at least this large is received straight into its
  // target; a smaller one goes through the staging buffer with the FPDUs
  // around it. Both measured (docs/performance-notes.md 2).
  static constexpr std::size_t kDirectPlacementMin = 12 * 1024;
  // The longest small FPDU a direct read's tail fetches with it: bounds
  // the copy when the next FPDU is a large one after all.
  static constexpr std::size_t kSmallFollowerMax = 2048;

  explicit QpRx(QpForRx& qp);
  ~QpRx();
  QpRx(const QpRx&) = delete;
  QpRx& operator=(const QpRx&) = delete;

  // Prepares a fresh stream (at attach).
  void Start(const StreamParams& params);
  // Forgets the stream; the receive WR in progress is dropped silently.
  void Stop();
  // The socket is readable or hung up: processes what arrived, within a
  // budget (the poller is level-triggered and reports the rest).
  void OnReadable(transport::TcpStream& stream);
  // OnReadable with the thread's staging buffer bound.
  void OnReadableTurn(transport::TcpStream& stream);
  // Completes the receive WR of the message in progress (if any) with
  // `status`; the stream is over.
  void AbandonMessage(WcStatus status);

  bool eof() const { return eof_; }

 private:
  enum class Segment : std::uint8_t {
    kNone,
    kDiscard,        // rejected or absorbed: payload is read and dropped
    kSend,           // untagged QN 0, placed into the receive WR
    kWrite,          // tagged RDMA Write
    kReadResponse,   // tagged Read Response for the ORQ head
    kReadRequest,    // untagged QN 1
    kTerminate,      // untagged QN 2: payload is the Terminate header copies
    kRtr,            // the peer's zero-length RTR message
  };

  // An error found at a segment's header, raised when its FPDU ends.
  struct PendingError {
    PendingError() = default;
    PendingError(const rdmap::TerminateCause& c, bool copy = true,
                 std::optional<WcStatus> recv = std::nullopt,
                 std::optional<WcStatus> read = std::nullopt)
        : cause(c), copy_header(copy), recv_status(recv), read_status(read) {}

    rdmap::TerminateCause cause;
    bool copy_header = true;  // RFC 5040 4.8 header copies of the segment
    std::optional<WcStatus> recv_status;  // for the receive WR in progress
    std::optional<WcStatus> read_status;  // for the Read WR at the ORQ head
    bool local_access_event = false;  // QP access error event, not EventForCause
  };

  enum class ReadOutcome : std::uint8_t { kProgress, kWouldBlock, kStop };

  // Consumes buffered octets; false when processing must stop.
  bool ConsumeStaged();
  ReadOutcome ReadPayloadDirect(transport::TcpStream& stream, const mpa::RxDemand& demand);
  ReadOutcome ReadIntoStaging(transport::TcpStream& stream);
  ReadOutcome OnReadResult(const transport::IoResult& result);
  void Drain(transport::TcpStream& stream);
  // Kicks the transmit side for the Read Requests accepted since the last
  // kick.
  void SendOwedResponses();

  bool HandleEvent(mpa::RxEvent event);
  void OnHeader(const mpa::FpduHeaderInfo& info);
  void OnFpduComplete();
  void OnMpaError(mpa::MpaError error);
  void OnPeerClosed();
  void OnLlpFailure(int error);

  void HeaderSend(const rdmap::DdpRdmapHeader& h);
  void HeaderTagged(const rdmap::DdpRdmapHeader& h);
  void HeaderReadRequest(const rdmap::DdpRdmapHeader& h);
  void HeaderTerminate(const rdmap::DdpRdmapHeader& h);
  bool CheckRtr(const rdmap::DdpRdmapHeader& h);
  void Reject(const PendingError& error);
  // Rejects the segment when a header check refused it; true if accepted.
  bool Accepts(const RxVerdict& verdict);
  void CompleteSend();
  void CompleteReadResponse();
  void CompleteReadRequest();
  void CompleteTerminate();
  void Raise(const PendingError& error);

  // Host ranges of payload octets [offset, offset + length) of the current
  // segment, their regions held by pin_ or in refs_. Returns the number of
  // iovecs, or nullopt if a region check failed (`failure` says which).
  std::optional<std::size_t> MapTarget(std::uint64_t offset, std::size_t length,
                                       AccessStatus& failure);
  void ReleaseRefs();
  // True if pin_ is the region of `stag` and passes the check
  // MemoryTable::Check makes for this access (then no table lookup is
  // needed); false sends the caller to the full check.
  bool PinCovers(std::uint32_t stag, AccessKind kind, std::uint64_t to,
                 std::uint64_t length) const;
  void ReleasePin() { pin_.Release(); }
  // The target of the current segment failed its re-check at placement.
  void PlacementFailed(AccessStatus failure);
  // recvmsg could not write the target (EFAULT): a local protection error.
  void PlacementFaulted();
  std::size_t TailGuess() const;
  std::size_t Staged() const { return staged_end_ - staged_begin_; }
  // The current FPDU's payload is placed directly (kDirectPlacementMin).
  bool LargeFpdu() const { return payload_length_ >= kDirectPlacementMin; }

  QpForRx& qp_;
  bool started_ = false;
  bool stopped_ = false;  // an error was raised, or the stream is over: drop input
  bool eof_ = false;
  bool socket_drained_ = false;  // the last read returned less than it asked for
  StreamParams params_;
  std::optional<mpa::FpduParser> parser_;
  // The staging buffer of the current receive turn: the receiving thread's
  // own (StagingLease in rx.cc), bound for the turn only. A turn consumes
  // (or, after an error, drops) all it read, so an idle QP holds none.
  MutableByteSpan staging_;
  std::size_t staged_begin_ = 0;
  std::size_t staged_end_ = 0;

  // Current FPDU.
  Segment segment_ = Segment::kNone;
  rdmap::DdpRdmapHeader header_;
  std::array<std::uint8_t, mpa::FpduParser::kMaxUlpduHeaderSize> header_raw_{};
  std::size_t header_raw_length_ = 0;
  std::uint16_t ulpdu_length_ = 0;
  std::size_t payload_length_ = 0;
  std::optional<PendingError> pending_;
  std::uint32_t tagged_stag_ = 0;   // tagged target of the current segment
  std::uint64_t tagged_to_ = 0;

  // Untagged QN 0 message in progress (RFC 5041 5.3).
  bool send_active_ = false;
  std::uint32_t send_msn_ = 1;        // expected MSN
  std::uint64_t send_received_ = 0;   // octets placed so far (next MO)
  std::optional<ReceiveWorkRequest> recv_wr_;
  // Read Requests (QN 1).
  std::uint32_t read_msn_ = 1;
  bool responses_owed_ = false;  // accepted since the last kick of the transmit side
  // Read Response in progress (for the ORQ head).
  bool response_active_ = false;
  OrqEntry response_;
  std::uint64_t response_received_ = 0;
  // Terminate header after the 4-octet control field.
  std::array<std::uint8_t, rdmap::kMaxTerminateHeaderSize> terminate_buf_{};
  std::size_t terminate_length_ = 0;

  bool awaiting_rtr_ = false;
  std::uint64_t last_boundary_ = 0;  // parser stream position after the last FPDU
  bool last_fpdu_large_ = false;     // its payload was at least kDirectPlacementMin
  // The whole small FPDU (framing included) that last followed a large one:
  // the last segment of a large message, 48 payload octets of each 64 KiB
  // Write on loopback. A direct read's staging tail takes one that long
  // along (TailGuess), saving the recvmsg it would cost alone; 0 when
  // messages end with a large FPDU. At most kSmallFollowerMax.
  std::size_t small_follower_octets_ = 0;

  // The region of the last target checked (tagged, or a receive WR's SGE),
  // kept while the octets of one read are processed: the FPDUs of a Write or
  // a Send that came in one read are checked against it without a lookup in
  // the memory table (two lookups per FPDU were a quarter of the receive
  // side's CPU time at standard framing, docs/performance-notes.md 2.2 and
  // 3.10). Released before the next system call and before anything that
  // may complete a WR (completion callbacks may deregister memory, which
  // waits for every RegionRef).
  RegionRef pin_;
  std::array<RegionRef, kMaxSge> refs_;
  std::size_t ref_count_ = 0;
  std::array<iovec, kMaxSge + 1> iov_{};
};

}  // namespace siwx::engine
