// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// libFuzzer target for the MPA startup negotiator.
//
// The first octets choose the role and the configuration; the rest is a
// script: the peer's byte stream fed in fuzz-chosen chunks at fuzz-chosen
// times, interleaved with timer ticks, partial writes, connection closes and
// the first-FPDU notice. The negotiator must never crash, and must keep its
// promises: no event after a terminal one, at most one establishment,
// established parameters consistent with what was configured and offered
// (RFC 6581 9.1 IRD/ORD bounds, 9.2 A echo and RTR types, 10 no fallback
// from an enhanced Request), a Terminate asked for only with the RFC 6581
// codes 6 and 7, Feed() never consuming more than it was given or anything
// once the startup frames are over, and everything it sends decoding as the
// startup frames its role sends.
//
// Input layout (big-endian U16s): b0 b1 | IRD ORD accept-IRD accept-ORD |
// startup timeout U8 | first-FPDU timeout U8 unless b1 & 0x20 | U16 n +
// Initiator private data | U16 n + Accept/Reject private data | then ops:
// op U8, time step U8, and for op % 8 in 0..2 a U8 length (% 48) + octets,
// for 3 a U16 length (% 700) + octets, for 5 a U8 output count.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/mpa/mpa_negotiator.h"
#include "common/wire/mpa_startup.h"

namespace {

using namespace siwx;
using namespace siwx::mpa;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

class Script {
 public:
  Script(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  bool Empty() const { return n_ == 0; }
  std::uint8_t U8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t U16() { return static_cast<std::uint16_t>((U8() << 8) | U8()); }
  ByteSpan Take(std::size_t k) {
    if (k > n_) k = n_;
    ByteSpan s(p_, k);
    p_ += k;
    n_ -= k;
    return s;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

bool RtrAllowed(RtrType t, const RtrTypeSet& s) {
  switch (t) {
    case RtrType::kSend: return s.send;
    case RtrType::kWrite: return s.write;
    case RtrType::kRead: return s.read;
    case RtrType::kNone: return false;
  }
  return false;
}

bool SubsetOf(const RtrTypeSet& a, const RtrTypeSet& b) {
  return (!a.send || b.send) && (!a.write || b.write) && (!a.read || b.read);
}

struct Harness {
  NegotiatorConfig cfg;
  std::vector<std::uint8_t> start_pd;
  std::vector<std::uint8_t> accept_pd;
  std::uint16_t accept_ird = 0;
  std::uint16_t accept_ord = 0;
  bool reject = false;

  MpaTime now{0};
  std::vector<std::uint8_t> wire;  // every octet the negotiator handed out
  bool terminal = false;
  bool established = false;
  bool request_seen = false;
  bool accepted = false;

  void TakeOutput(MpaNegotiator& n, std::size_t k) {
    const ByteSpan out = n.PendingOutput();
    if (k > out.size()) k = out.size();
    wire.insert(wire.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k));
    n.ConsumeOutput(k);
  }

  void CheckInitiatorParams(const MpaNegotiator& n) {
    const NegotiatedParams& p = n.params();
    Check(n.state() == NegotiatorState::kFullOperation);
    Check(p.dialect <= cfg.dialect);
    Check(p.dialect != MpaDialect::kV1Rtr || cfg.dialect == MpaDialect::kV1Rtr);
    // RFC 6581 10: an enhanced Request takes only an enhanced Reply.
    if (cfg.dialect == MpaDialect::kV2) Check(p.dialect == MpaDialect::kV2);
    Check(p.peer_ird_ord.has_value() == (p.dialect == MpaDialect::kV2));
    if (p.dialect == MpaDialect::kV2) Check(p.revision == kMpaRevision2);
    if (p.dialect == MpaDialect::kV1Rtr) Check(p.revision == kMpaRevision1);
    if (cfg.crc == CrcPolicy::kRequire) Check(p.crc);
    if (cfg.crc == CrcPolicy::kRefuse) Check(!p.crc);
    Check(p.markers_rx == cfg.markers_wanted);
    Check(!p.markers_tx || cfg.markers_can_send);
    if (p.dialect == MpaDialect::kV2) {
      Check(p.ird_ord_exchanged && p.ird <= cfg.ird && p.ord <= cfg.ord);
    } else {
      Check(!p.ird_ord_exchanged && p.ird == cfg.ird && p.ord == cfg.ord);
    }
    Check(p.peer_to_peer == (p.rtr != RtrType::kNone));
    if (p.peer_to_peer) {
      Check(cfg.peer_to_peer && p.dialect == MpaDialect::kV2 && RtrAllowed(p.rtr, cfg.rtr_types));
      Check(RtrAllowed(p.rtr, p.rtr_types));  // one the Responder advertised
      Check(p.rtr != RtrType::kRead || p.ord >= 1);
      Check(p.first_send == FirstSendRule::kRtrFpduFirst);
    } else {
      // Asked for peer-to-peer and did not get it: that is a failure (9.2).
      Check(!cfg.peer_to_peer || p.dialect != MpaDialect::kV2);
      Check(!p.rtr_types.Any());
      Check(p.first_send == FirstSendRule::kMayNow);
    }
    Check(p.local_private_data == start_pd);
    Check(p.peer_private_data.size() <= kMaxPrivateDataLength);
    Check(!p.large_fpdus || cfg.large_fpdus);  // L answers our own L only
  }

  void CheckResponderParams(const MpaNegotiator& n) {
    const NegotiatedParams& p = n.params();
    const StartupOffer& o = n.offer();
    Check(p.dialect == o.answer_dialect && p.dialect <= cfg.dialect && p.dialect <= o.dialect);
    Check(p.crc == (o.crc || cfg.crc == CrcPolicy::kRequire));
    if (cfg.crc == CrcPolicy::kRefuse) Check(!p.crc);
    Check(p.markers_tx == o.markers && (!p.markers_tx || cfg.markers_can_send));
    Check(p.markers_rx == cfg.markers_wanted);
    Check(p.rtr == RtrType::kNone);  // the Initiator chooses (RFC 6581 1.1)
    if (p.dialect == MpaDialect::kV2) {
      Check(o.ird_ord.has_value() && p.ird_ord_exchanged && p.peer_ird_ord == o.ird_ord);
      const IrdOrdWord& w = *o.ird_ord;
      // RFC 6581 9.1: 0x3FFF keeps the local value; otherwise IRD at most
      // the Initiator ORD (or 1 for a Read RTR), ORD at most its IRD.
      if (w.ord == kIrdOrdNotNegotiated) {
        Check(p.ird == accept_ird);
      } else {
        Check(p.ird <= accept_ird);
        Check(p.ird <= w.ord || (p.ird == 1 && p.rtr_types.read));
      }
      if (w.ird == kIrdOrdNotNegotiated) {
        Check(p.ord == accept_ord);
      } else {
        Check(p.ord == (accept_ord < w.ird ? accept_ord : w.ird));
      }
      // 9.2: A echoed; with A, at least one type this end supports, the
      // offered ones where any fit.
      Check(p.peer_to_peer == w.peer_to_peer && p.peer_to_peer == o.peer_to_peer);
      Check(p.rtr_types.Any() == p.peer_to_peer);
      Check(SubsetOf(p.rtr_types, cfg.rtr_types));
      const RtrTypeSet offered{w.send_rtr, w.write_rtr, w.read_rtr};
      const RtrTypeSet common{offered.send && cfg.rtr_types.send,
                              offered.write && cfg.rtr_types.write,
                              offered.read && cfg.rtr_types.read};
      if (p.peer_to_peer && common.Any()) Check(SubsetOf(p.rtr_types, offered));
      if (p.rtr_types.read) Check(p.ird >= 1);
    } else {
      Check(!p.ird_ord_exchanged && p.ird == accept_ird && p.ord == accept_ord);
      Check(!p.peer_to_peer && !p.rtr_types.Any());
      // RFC 6581 10: only a v2 Responder answers an enhanced Request.
      Check(o.dialect != MpaDialect::kV2);
    }
    if (p.dialect == MpaDialect::kV1Rtr) {
      Check(p.first_send == FirstSendRule::kMayNow && n.state() == NegotiatorState::kFullOperation);
    } else {
      Check(p.first_send == FirstSendRule::kAfterFirstFpdu);
    }
    Check(p.local_private_data == accept_pd);
    Check(p.peer_private_data == o.private_data);
    Check(p.large_fpdus == (o.large_fpdus && cfg.large_fpdus));
  }

  void HandleEvents(MpaNegotiator& n) {
    while (auto e = n.NextEvent()) {
      Check(!terminal);
      switch (e->type) {
        case NegotiatorEventType::kRequestReceived: {
          Check(cfg.role == MpaRole::kResponder && !request_seen && !established);
          Check(e->error == MpaError::kNone);
          request_seen = true;
          Check(n.state() == NegotiatorState::kAwaitingConsumer);
          Check(n.offer().private_data.size() <= kMaxPrivateDataLength);
          const std::size_t before = n.PendingOutput().size();
          if (reject) {
            const NegotiatorStatus st = n.Reject(accept_pd, accept_ird, accept_ord);
            if (st != NegotiatorStatus::kOk) {
              Check(st == NegotiatorStatus::kPrivateDataTooLong ||
                    st == NegotiatorStatus::kInvalidArgument);
              Check(n.PendingOutput().size() == before);
              Check(n.Reject({}) == NegotiatorStatus::kOk);
            }
            Check(n.state() == NegotiatorState::kRejected);
            terminal = true;
            break;
          }
          NegotiatorStatus st = n.Accept(now, accept_pd, accept_ird, accept_ord);
          if (st != NegotiatorStatus::kOk) {
            Check(st == NegotiatorStatus::kPrivateDataTooLong ||
                  st == NegotiatorStatus::kInvalidArgument);
            Check(n.PendingOutput().size() == before);
            Check(n.state() == NegotiatorState::kAwaitingConsumer);
            accept_pd.clear();
            accept_ird = 1;
            accept_ord = 1;
            st = n.Accept(now, accept_pd, accept_ird, accept_ord);
          }
          Check(st == NegotiatorStatus::kOk);
          Check(n.PendingOutput().size() > before);
          accepted = true;
          break;
        }
        case NegotiatorEventType::kEstablished:
          Check(!established && e->error == MpaError::kNone);
          established = true;
          if (cfg.role == MpaRole::kInitiator) {
            CheckInitiatorParams(n);
          } else {
            Check(accepted);
            CheckResponderParams(n);
          }
          break;
        case NegotiatorEventType::kRejected:
          Check(!established && e->error == MpaError::kNone);
          Check(n.state() == NegotiatorState::kRejected);
          Check(e->by_peer == (cfg.role == MpaRole::kInitiator));
          Check(n.params().peer_private_data.size() <= kMaxPrivateDataLength);
          terminal = true;
          break;
        case NegotiatorEventType::kFailed: {
          // RFC 6581 8: codes 6 and 7 go out in a Terminate, and only the
          // Initiator, holding an accepting Reply, raises them.
          const bool rfc6581_code =
              e->error == MpaError::kInsufficientIrd || e->error == MpaError::kNoMatchingRtr;
          Check(rfc6581_code || e->error == MpaError::kInvalidStartupFrame ||
                e->error == MpaError::kConnectionLost);
          Check(e->send_terminate == rfc6581_code);
          if (rfc6581_code) {
            Check(cfg.role == MpaRole::kInitiator && cfg.dialect == MpaDialect::kV2);
            Check(n.params().peer_ird_ord.has_value());
          }
          Check(!e->reason.empty() && e->failure != StartupFailure::kNone);
          // After establishment only the first-FPDU wait can still fail.
          Check(!established || e->failure == StartupFailure::kFirstFpduTimeout);
          Check(n.state() == NegotiatorState::kFailed && !n.Deadline().has_value());
          terminal = true;
          break;
        }
      }
    }
  }

  // Everything sent must decode as the frames this role sends, in order.
  void CheckWire(const MpaNegotiator& n) {
    ByteSpan rest(wire);
    std::size_t frames = 0;
    while (!rest.empty()) {
      const StartupDecodeResult r = DecodeStartupFrame(rest);
      Check(r.status == StartupDecodeStatus::kComplete);
      const StartupHeader& h = r.frame.header;
      Check(h.reserved == 0);
      if (cfg.role == MpaRole::kInitiator) {
        Check(h.kind == (frames == 0 ? StartupFrameKind::kRequest : StartupFrameKind::kRtr));
        if (frames == 0) {
          Check(h.markers == cfg.markers_wanted && !h.reject);
          Check(h.crc == (cfg.crc == CrcPolicy::kRequire));
          Check(h.revision == (cfg.dialect == MpaDialect::kV2 ? kMpaRevision2 : kMpaRevision1));
          Check(h.x_bit == (cfg.dialect != MpaDialect::kV1));
          Check(h.large_fpdus == cfg.large_fpdus);
          Check(r.frame.ulp_private_data.size() == start_pd.size());
          if (r.frame.ird_ord) {
            const IrdOrdWord& w = *r.frame.ird_ord;
            Check(w.peer_to_peer == cfg.peer_to_peer);
            Check(w.peer_to_peer || !(w.send_rtr || w.write_rtr || w.read_rtr));  // 9.2
          }
        } else {
          Check(cfg.dialect == MpaDialect::kV1Rtr && frames == 1 && !h.large_fpdus);
        }
      } else {
        Check(h.kind == StartupFrameKind::kReply && frames == 0);
        if (!h.reject) Check(h.markers == cfg.markers_wanted);
        Check(h.large_fpdus == (!h.reject && n.offer().large_fpdus && cfg.large_fpdus));
        // RFC 6581 10: enhanced in, enhanced out; unenhanced in, unenhanced out.
        const bool enhanced_offer = n.offer().dialect == MpaDialect::kV2;
        Check(IsEnhanced(h) == enhanced_offer);
        if (enhanced_offer) {
          const IrdOrdWord& w = *r.frame.ird_ord;
          Check(w.peer_to_peer == n.offer().ird_ord->peer_to_peer);  // 9.2: A echoed
          Check(w.peer_to_peer || !(w.send_rtr || w.write_rtr || w.read_rtr));
          if (w.peer_to_peer) Check(w.send_rtr || w.write_rtr || w.read_rtr);
        }
      }
      rest = rest.subspan(r.consumed);
      ++frames;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Script in(data, size);
  Harness h;
  const std::uint8_t b0 = in.U8();
  const std::uint8_t b1 = in.U8();
  h.cfg.role = (b0 & 1) ? MpaRole::kResponder : MpaRole::kInitiator;
  h.cfg.dialect = static_cast<MpaDialect>(1 + ((b0 >> 1) & 3) % 3);
  h.cfg.crc = static_cast<CrcPolicy>(((b0 >> 3) & 3) % 3);
  h.cfg.markers_wanted = (b0 & 0x20) != 0;
  h.cfg.markers_can_send = (b0 & 0x40) != 0;
  h.cfg.peer_to_peer = (b0 & 0x80) != 0;
  h.cfg.rtr_types = {(b1 & 1) != 0, (b1 & 2) != 0, (b1 & 4) != 0};
  h.reject = (b1 & 8) != 0;
  h.cfg.large_fpdus = (b1 & 0x40) != 0;
  // Mostly valid IRD/ORD, sometimes out of range to exercise refusals.
  const std::uint16_t mask = (b1 & 0x10) ? 0xFFFF : 0x00FF;
  h.cfg.ird = in.U16() & mask;
  h.cfg.ord = in.U16() & mask;
  h.accept_ird = in.U16() & mask;
  h.accept_ord = in.U16() & mask;
  h.cfg.startup_timeout = MpaTime(1 + in.U8() * 16);
  h.cfg.first_fpdu_timeout = (b1 & 0x20) ? MpaTime(0) : MpaTime(1 + in.U8() * 16);
  const ByteSpan start_pd = in.Take(in.U16() % 600);
  const ByteSpan accept_pd = in.Take(in.U16() % 600);
  h.start_pd.assign(start_pd.begin(), start_pd.end());
  h.accept_pd.assign(accept_pd.begin(), accept_pd.end());

  MpaNegotiator n(h.cfg);
  if (h.cfg.role == MpaRole::kResponder) h.start_pd.clear();
  NegotiatorStatus st = n.Start(h.now, h.start_pd);
  if (st == NegotiatorStatus::kPrivateDataTooLong) {
    Check(n.PendingOutput().empty() && n.state() == NegotiatorState::kIdle);
    h.start_pd.clear();
    st = n.Start(h.now, h.start_pd);
  }
  if (st != NegotiatorStatus::kOk) {
    Check(st == NegotiatorStatus::kInvalidConfig);
    Check(n.PendingOutput().empty() && n.state() == NegotiatorState::kIdle);
    Check(!n.NextEvent().has_value());
    return 0;
  }
  Check(n.Deadline().has_value());

  while (!in.Empty()) {
    const std::uint8_t op = in.U8();
    h.now += MpaTime(in.U8());
    switch (op % 8) {
      case 0:
      case 1:
      case 2:
      case 3: {  // the peer's octets
        const ByteSpan chunk = in.Take(op % 4 == 3 ? in.U16() % 700 : in.U8() % 48);
        const NegotiatorState before = n.state();
        const std::size_t used = n.Feed(h.now, chunk);
        Check(used <= chunk.size());
        const bool expecting = before == NegotiatorState::kAwaitingReply ||
                               before == NegotiatorState::kAwaitingRequest ||
                               before == NegotiatorState::kAwaitingRtr;
        if (!expecting) Check(used == 0);
        // A frame never takes more than 20 + 512 octets.
        Check(used <= kStartupHeaderSize + kMaxPrivateDataLength);
        break;
      }
      case 4: n.OnTime(h.now); break;
      case 5: h.TakeOutput(n, in.U8()); break;
      case 6:
        if ((op & 0x38) == 0) n.OnConnectionClosed();
        break;
      case 7: {
        const NegotiatorState before = n.state();
        n.NoteFirstFpduReceived();
        if (before == NegotiatorState::kAwaitingFirstFpdu) {
          Check(n.state() == NegotiatorState::kFullOperation && !n.Deadline().has_value());
        } else {
          Check(n.state() == before);
        }
        break;
      }
    }
    h.HandleEvents(n);
    if (n.state() == NegotiatorState::kFailed || n.state() == NegotiatorState::kRejected) {
      Check(h.terminal);
    }
  }
  // Drain time: every wait must end, at the latest at its deadline.
  if (auto d = n.Deadline()) {
    n.OnTime(*d);
    h.HandleEvents(n);
    Check(!n.Deadline().has_value());
  }
  h.TakeOutput(n, n.PendingOutput().size());
  h.CheckWire(n);
  return 0;
}
