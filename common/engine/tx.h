// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The transmit side of a QP: turns send WRs, Read Responses, the RTR message
// and the Terminate into DDP segments (RFC 5041 4), frames them into FPDUs
// (RFC 5044 4) and writes them with sendmsg straight from registered memory.
//
// Segmentation: every message is cut into DDP segments whose ULPDU (header
// plus payload) is at most the stream's max ULPDU; tagged segments carry
// STag and a TO advancing by the octets already sent, untagged ones QN, MSN
// and an MO counting octets (RFC 5041 4.2, 4.3); the final segment has L set.
// Sends use QN 0, Read Requests QN 1, the Terminate QN 2, each queue's MSN
// starting at 1 (RFC 5040 4.1, 5.1-5.4).
//
// Batching: up to `slot_count` FPDUs are framed ahead; one sendmsg writes
// all of them (bounded by IOV_MAX iovecs; transport::SendList copies the
// short slices between two payloads into one). After a partial write the
// rest of each FPDU is sent exactly as framed. With CRC on, the CRC is
// computed at framing time, so it must cover exactly the octets sendmsg
// later reads:
//  - Send and Write payload is sent straight from the WR's buffers: verbs
//    forbids changing a posted WR's buffers until it completes, so what the
//    CRC covered is what goes out (an application that breaks that rule
//    gets a CRC error at the peer, its own undefined behaviour).
//  - Read Response payload comes from memory no WR of ours owns: the
//    application may change the source of an RDMA Read at any time (the
//    reader then sees some mix of old and new octets, which verbs allows).
//    So with CRC on it is copied into a staging buffer, where the whole
//    FPDU is laid out (one iovec), and the CRC computed over the copy;
//    without CRC nothing checks it and it is sent in place. (ISA-L has no
//    fused copy + CRC32c: the framer copies 8 KiB, then runs the CRC over
//    those 8 KiB while they are in L1.) A QP frames at most
//    kStagedOctetsUnsent of such copies ahead of sendmsg, and a slot gives
//    its staging buffer back to the thread's pool as soon as sendmsg has
//    taken the FPDU, so the next copy goes into a buffer the kernel has
//    just read, still in L2, and sendmsg reads the copy from L2 too,
//    instead of both walking a ring of a whole batch (2 MiB).
// Payload pieces still in registered memory are re-checked against the
// STag table before every sendmsg that reads them and their RegionRefs are
// dropped before the gate holder returns, so a Deregister never waits for
// the network; a piece that fails the re-check ends the stream (never
// sending octets from memory that is no longer registered). The first
// region checked in a turn is held as pin_ and the pieces that follow in
// it are checked against it without a table lookup (one lookup per turn
// instead of one per FPDU); pin_ goes with every slot's RegionRefs
// (ReleaseRefs), and before anything that may complete a WR, since a
// completion callback may deregister memory.
//
// Threading: every method runs with the QP's transmit gate held (see qp.h),
// on whichever thread took it: an application thread in PostSend (inline
// transmit), a receive turn that kicked it (the progress thread, or an
// application thread in Qp::DriveFromPoll), or the progress thread when the
// socket became writable, a turn ran out of budget, or for attach, finalize
// and detach. So the state below needs no lock. It reaches the QP only
// through QpForTx (qp_sides.h), whose calls take queue_mutex_ briefly for
// the SQ, ORQ, IRQ and mailbox. Not validated here: inbound anything (QpRx).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/engine/access.h"
#include "common/engine/completion.h"
#include "common/engine/memory.h"
#include "common/engine/qp_sides.h"
#include "common/engine/stream_params.h"
#include "common/engine/work_request.h"
#include "common/transport/send_list.h"
#include "common/wire/ddp_rdmap.h"
#include "common/wire/fpdu.h"
#include "common/wire/terminate.h"

namespace siwx::engine {

// True if `region` (may be null) is the region of `stag` and passes the
// checks MemoryTable::Check makes for this access: a region already held
// (RegionRef) can be re-checked without a lookup in the table. Only the
// positive answer is used; a false one goes to MemoryTable::Check, which
// says what is wrong.
inline bool RegionCovers(const MemoryRegion* region, std::uint32_t stag, PdId pd,
                         AccessKind kind, std::uint64_t to, std::uint64_t length) {
  return region != nullptr && region->stag() == stag && region->pd() == pd && region->valid() &&
         HasAll(region->access(), RequiredFlags(kind)) && length > 0 && length - 1 <= ~to &&
         to >= region->base_to() && length <= region->length() &&
         to - region->base_to() <= region->length() - length;
}

class QpTx {
 public:
  explicit QpTx(QpForTx& qp);
  ~QpTx();
  QpTx(const QpTx&) = delete;
  QpTx& operator=(const QpTx&) = delete;

  // Prepares a fresh stream: framer, slots, MSNs, RTR state.
  void Start(const StreamParams& params, std::size_t max_ulpdu);
  // Drops every framed FPDU and all state; the transmit side is dead until
  // the next Start.
  void Stop();
  // Sends what can be sent now, within a budget; arms EPOLLOUT when the
  // socket is full; winds down when told to. Returns true if work remains
  // that only another turn (not writability) will do.
  bool Pump();
  // Destroy of a QP whose stream ends in order: writes the rest of an FPDU
  // that is partly on the wire, without waiting (a few non-blocking tries),
  // so a graceful close never cuts one. True if no FPDU is partly written
  // (any later ones are dropped with their WRs); false if one still is
  // (the caller must reset the stream). Call before Stop.
  bool FinishStartedFpdu();

  bool started() const { return started_; }
  // Our FIN went out after everything owed (set until the next Start).
  bool fin_sent() const { return fin_sent_; }

 private:
  struct Source {        // a payload piece in registered memory
    std::uint32_t stag = 0;
    std::uint64_t to = 0;
    std::uint32_t length = 0;
  };

  enum class Role : std::uint8_t {
    kSqSegment,         // a segment of a Send or Write WR
    kReadRequest,       // a Read WR's request
    kResponseSegment,   // a segment of a Read Response
    kRtr,               // the zero-length RTR message
    kTerminate,         // the Terminate: nothing may follow it
  };

  // A buffer for a Read Response FPDU framed over a copy of its payload.
  // Not zero-filled: the framer writes every octet it sends.
  struct StagingBuffer {
    std::unique_ptr<std::uint8_t[]> octets;
    std::size_t capacity = 0;
  };

  // One framed FPDU in flight. The frame's slices point into `header` and at
  // registered memory, a WR's inline data or `staging`.
  struct Slot {
    mpa::FpduFrame frame;
    std::array<std::uint8_t, 80> header{};  // ULPDU header; a whole Terminate ULPDU fits
    // A Read Response's FPDU, copied when CRC is on (see above): taken
    // from the thread's staging pool when framed, given back when sendmsg
    // has taken the whole FPDU or the FPDU is dropped (ReturnStaging).
    StagingBuffer staging;
    std::size_t staged_octets = 0;          // of staging, counted in staged_unsent_
    std::size_t sent = 0;                   // wire octets already written
    Role role = Role::kSqSegment;
    bool last = false;                      // final segment of its message
    std::uint64_t seq = 0;                  // SQ entry (kSqSegment, kReadRequest)
    AccessKind source_kind = AccessKind::kLocalRead;
    std::uint8_t source_count = 0;
    std::array<Source, kMaxSge> sources{};
    // A piece's own RegionRef, or none while pin_ holds its region.
    std::array<RegionRef, kMaxSge> refs;
    bool refs_held = false;

    // Releases the regions of the sources and forgets them: the frame no
    // longer reads registered memory.
    void DropSources() {
      for (std::size_t i = 0; i < source_count; ++i) refs[i].Release();
      source_count = 0;
      refs_held = false;
    }
  };

  enum class MessageKind : std::uint8_t { kNone, kSq, kResponse };

  // The message being segmented.
  struct Message {
    MessageKind kind = MessageKind::kNone;
    const SendRecord* wr = nullptr;       // kSq: stable while the entry is not retired
    std::uint64_t seq = 0;
    std::uint32_t msn = 0;                // kSq Sends
    IrqEntry response;                    // kResponse
    std::uint64_t offset = 0;
    std::uint64_t total = 0;
  };

  enum class Mode : std::uint8_t {
    kOpen,
    kDraining,     // start what was posted before the close, then FIN
    kStopping,     // no new messages; FIN when what is framed is out
    kTerminating,  // Terminate framed after what is in flight; then FIN
    kDone,         // FIN sent or gave up; nothing more
  };

  void CheckMailbox();
  void Fill();
  bool StartNextMessage();
  bool StartSqMessage();
  bool StartResponse();
  bool FrameSegment();
  void FrameRtr();
  void FrameReadRequest(const SendRecord& wr, std::uint64_t seq);
  void FrameTerminate();
  Slot& NewSlot();
  // At an idle point (nothing in flight): rewinds the ring so the next FPDU
  // reuses slot 0, and hands the other slots to this thread's cache, so an
  // idle QP keeps one slot however much it streamed. Costs one comparison
  // when the QP holds no more than that one.
  void ReleaseIdleSlots();
  // The process's idle slots (any QP's), for NewSlot to reuse.
  struct SlotPool;
  static SlotPool& IdleSlots();
  // This thread's free staging buffers (any QP's), most recently freed
  // last: the next copy goes into the one most likely still cached.
  static std::vector<StagingBuffer>& StagingPool();
  // Octets of the buffers in this thread's StagingPool.
  static std::size_t& PooledStagingOctets();
  // Frames the slot's FPDU; with `copy_to`, the whole FPDU is laid out
  // there over a copy of the payload (FpduFramer::FrameCopy).
  bool FrameInto(Slot& slot, std::size_t header_length, std::span<const ByteSpan> payload,
                 std::uint8_t* copy_to = nullptr);
  // Fills slot sources + refs for [offset, offset + length) of the current
  // message and the payload pieces; false if a region check failed.
  bool GatherPayload(Slot& slot, std::uint64_t offset, std::size_t length,
                     std::array<ByteSpan, kMaxSge>& pieces, std::size_t& piece_count,
                     AccessStatus& failure);
  // A staging buffer for a Read Response FPDU of `octets`, held by `slot`
  // until ReturnStaging.
  std::uint8_t* StagingFor(Slot& slot, std::size_t octets);
  // Gives the slot's staging buffer (if any) back to the thread's pool.
  void ReturnStaging(Slot& slot);
  // True while the QP has as many staged octets framed and not yet taken
  // by sendmsg as it may (kStagedOctetsUnsent): the next Read Response
  // segment waits for a sendmsg.
  bool StagingFull() const;
  bool AcquireRefs(Slot& slot, AccessStatus& failure);
  // Appends the octets of `slot` not yet written to `list`; false if the
  // list ran out of room before the slot's end.
  static bool AppendUnsent(const Slot& slot, transport::SendList& list);
  void ReleaseRefs();
  // Ends the stream with an RST after a transmit failure: QP fatal, no
  // Terminate (the stream can no longer carry one), transmit stops.
  void AbortStream(const rdmap::TerminateCause& cause);
  bool Write(std::size_t& budget);
  // Retires `octets` written octets from the in-flight slots; true if an SQ
  // entry became done (the caller retires the SQ).
  bool Advance(std::size_t octets);
  void FailSq(std::uint64_t seq, WcStatus status);
  void FailResponse(AccessStatus status);
  void FinishWinding();
  void ResetFramerAtSentPosition();

  QpForTx& qp_;
  bool started_ = false;
  bool fin_sent_ = false;
  Mode mode_ = Mode::kOpen;
  std::optional<rdmap::TerminateHeader> terminate_;
  bool terminate_framed_ = false;

  StreamParams params_;
  std::size_t max_ulpdu_ = 0;
  std::optional<mpa::FpduFramer> framer_;
  std::uint32_t tx_grid_start_ = 0;   // grid offset at Start
  std::uint64_t wire_written_ = 0;    // octets written since Start

  // Allocated on first use (NewSlot): a Slot is about 6 KiB (FpduFrame),
  // and an idle QP that only ever sent its RTR needs one, not slot_count_;
  // given back when the QP goes idle (ReleaseIdleSlots).
  std::unique_ptr<std::unique_ptr<Slot>[]> slots_;
  std::size_t slot_count_ = 0;
  std::size_t allocated_slots_ = 0;  // non-null entries of slots_
  std::size_t first_ = 0;   // oldest in-flight slot
  std::size_t in_flight_ = 0;
  // Staged octets (Slot::staged_octets) of slots still holding a buffer.
  std::size_t staged_unsent_ = 0;
  // The first region checked since the last ReleaseRefs (see the top).
  // Assigned only when empty, released only by ReleaseRefs, which also
  // marks every slot unchecked: a slot whose refs_held is true and which
  // has no RegionRef of its own is covered by it.
  RegionRef pin_;

  Message cur_;
  std::uint64_t tx_seq_ = 0;          // next SQ entry to start
  std::uint32_t send_msn_ = 1;        // next QN 0 MSN, RFC 5041 5.1
  std::uint32_t read_msn_ = 1;        // next QN 1 MSN
  bool rtr_sent_ = false;
  bool response_turn_ = true;         // alternate IRQ and SQ at message boundaries
};

}  // namespace siwx::engine
