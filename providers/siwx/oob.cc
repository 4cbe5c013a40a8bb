// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Out-of-band QP connect (oob.h, docs/out-of-band-connect.md).
//
// Threads. Per device and process one listener thread (started with the
// first GID query, lives as long as the process) accepts connections and
// checks the time limits of passive QPs; each accepted connection gets a
// short-lived handler thread (at most kMaxHandlers at once) and each
// connecting QP a dial thread. Those threads never hold a Context or Qp
// pointer across a wait: they find the context by its id under the
// device's mutex (FreeContext takes the context out of the device's list
// under that mutex before freeing it) and the QP by number and token under
// the context's qp_mutex, and bind by number (BindStream), as the CM does.
//
// Socket calls are common/transport's (tcp_rendezvous.h); MPA is
// common/mpa's negotiator, as in the CM.
#include "providers/siwx/oob.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mpa/mpa_negotiator.h"
#include "common/transport/tcp_rendezvous.h"
#include "common/util/log.h"
#include "common/util/service_thread.h"
#include "providers/siwx/mpa_stream_params.h"

namespace siwx::provider {

std::uint64_t NextObjectId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace oob {
namespace {

using Clock = std::chrono::steady_clock;

// Private data of the MPA Request and Reply: a magic, then for the Request
// the target QPN, the initiator's QPN and GID; for the Reply the initiator's
// QPN, the responder's QPN and GID. Numbers in network order.
constexpr char kMagic[8] = {'S', 'I', 'W', 'X', 'O', 'O', 'B', '1'};
constexpr std::size_t kPrivateDataSize = 8 + 4 + 4 + 16;
constexpr int kMaxHandlers = 32;
constexpr int kAcceptPollMs = 200;
// IRD/ORD offered both ways: the device maximum (DeviceLimits).
constexpr std::uint16_t kReadDepth = DeviceLimits::kMaxIrd;

struct PrivateData {
  std::uint32_t first_qpn = 0;
  std::uint32_t second_qpn = 0;
  GidBytes gid{};
};

std::vector<std::uint8_t> EncodePrivateData(const PrivateData& pd) {
  std::vector<std::uint8_t> out(kPrivateDataSize);
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  const std::uint32_t a = htonl(pd.first_qpn);
  const std::uint32_t b = htonl(pd.second_qpn);
  std::memcpy(out.data() + 8, &a, 4);
  std::memcpy(out.data() + 12, &b, 4);
  std::memcpy(out.data() + 16, pd.gid.data(), 16);
  return out;
}

std::optional<PrivateData> DecodePrivateData(const std::vector<std::uint8_t>& in) {
  if (in.size() < kPrivateDataSize || std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) {
    return std::nullopt;
  }
  PrivateData pd;
  std::uint32_t a, b;
  std::memcpy(&a, in.data() + 8, 4);
  std::memcpy(&b, in.data() + 12, 4);
  pd.first_qpn = ntohl(a);
  pd.second_qpn = ntohl(b);
  std::memcpy(pd.gid.data(), in.data() + 16, 16);
  return pd;
}

// SIWX_OOB_PORT and SIWX_OOB_TIMEOUT_MS (docs/settings.txt), read once,
// when the provider is loaded (before any of our threads exist).
std::uint16_t ReadPort() {
  return [] {
    const char* value = std::getenv("SIWX_OOB_PORT");
    if (value == nullptr || value[0] == '\0') return std::uint16_t{0};
    unsigned n = 0;
    const std::string_view v(value);
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || ptr != v.data() + v.size() || n > 65535) {
      SIWX_LOG(kError, "SIWX_OOB_PORT='%s' is not a TCP port (0..65535); using an ephemeral port",
               value);
      return std::uint16_t{0};
    }
    return static_cast<std::uint16_t>(n);
  }();
}

int ReadTimeoutMs() {
  return [] {
    constexpr int kDefault = 30000;
    const char* value = std::getenv("SIWX_OOB_TIMEOUT_MS");
    if (value == nullptr || value[0] == '\0') return kDefault;
    int n = 0;
    const std::string_view v(value);
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || ptr != v.data() + v.size() || n < 1 || n > 600000) {
      SIWX_LOG(kError, "SIWX_OOB_TIMEOUT_MS='%s' is not a number of milliseconds in 1..600000; "
               "using %d", value, kDefault);
      return kDefault;
    }
    return n;
  }();
}

const std::uint16_t g_configured_port = ReadPort();
const int g_timeout_ms = ReadTimeoutMs();

std::uint16_t ConfiguredPort() { return g_configured_port; }
int TimeoutMs() { return g_timeout_ms; }
// The wait for the first FPDU after a bind: a parked stream is bound late,
// its RTR already waiting in the socket.
std::uint32_t TimeoutMsForStream() { return static_cast<std::uint32_t>(g_timeout_ms); }

std::string EndpointText(const Endpoint& e) {
  char address[INET_ADDRSTRLEN] = "?";
  in_addr in{};
  in.s_addr = e.address;
  inet_ntop(AF_INET, &in, address, sizeof(address));
  return std::string(address) + ":" + std::to_string(ntohs(e.port));
}

bool Less(const GidBytes& a_gid, std::uint32_t a_qpn, const GidBytes& b_gid,
          std::uint32_t b_qpn) {
  const int c = std::memcmp(a_gid.data(), b_gid.data(), a_gid.size());
  return c < 0 || (c == 0 && a_qpn < b_qpn);
}

// ---- The process's listeners, one per device ----

struct Listener {
  Device* device = nullptr;
  pid_t pid = 0;  // the process it serves: a fork()ed child opens its own
  int fd = -1;
  Endpoint endpoint;
  bool failed = false;  // could not be opened; not retried (its GID is out)
};

// A passive QP's limit: no stream by `deadline` fails it.
struct PassiveWait {
  Device* device;
  std::uint64_t context_id;
  std::uint32_t qp_num;
  std::uint64_t token;
  Clock::time_point deadline;
};

std::mutex g_mutex;
std::vector<Listener*>* g_listeners = new std::vector<Listener*>();  // never freed
std::vector<PassiveWait>* g_waits = new std::vector<PassiveWait>();  // guarded by g_mutex
std::atomic<int> g_handlers{0};

// ---- Finding the context and QP again ----

// What WithQp hands over, found under the locks.
struct Found {
  Context* context = nullptr;  // valid while the device mutex is held
  Qp* qp = nullptr;            // valid only under context->state->qp_mutex
};

// Runs fn(found) with the device mutex held and the context's qp_mutex
// held too; false when the context or the QP (by number and token) is gone.
bool WithQp(Device* device, std::uint64_t context_id, std::uint32_t qp_num, std::uint64_t token,
            const std::function<void(Found&)>& under_qp_mutex,
            const std::function<void(Context*)>& after = nullptr) {
  std::lock_guard<std::mutex> device_lock(device->mutex);
  Context* context = nullptr;
  for (Context* c : device->contexts) {
    if (c->state != nullptr && c->state->id == context_id) context = c;
  }
  if (context == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(context->state->qp_mutex);
    const auto it = context->state->qps.find(qp_num);
    if (it == context->state->qps.end() || it->second->shared->token != token) return false;
    Found found{context, it->second};
    under_qp_mutex(found);
  }
  if (after) after(context);
  return true;
}

// Moves the QP to ERR (its WRs flush) and raises IBV_EVENT_QP_FATAL; the
// caller logged why. Device mutex held (context alive).
void FailQp(Context* context, std::uint32_t qp_num, const std::shared_ptr<engine::Qp>& engine_qp) {
  if (engine_qp == nullptr) return;
  if (engine_qp->state() == engine::QpState::kError) return;
  try {
    engine_qp->Modify(engine::QpState::kError);
  } catch (...) {
    SIWX_LOG(kError, "QP %u: out of memory while failing it", qp_num);
  }
  engine::AsyncEvent event;
  event.type = engine::AsyncEventType::kQpFatal;
  event.qp_num = qp_num;
  OnEngineEvent(context, event);
}

// Fails the QP if it is still waiting for its stream.
void FailIfUnbound(Device* device, std::uint64_t context_id, std::uint32_t qp_num,
                   std::uint64_t token, const std::string& why) {
  std::shared_ptr<engine::Qp> engine_qp;
  WithQp(
      device, context_id, qp_num, token,
      [&](Found& f) {
        // Still armed and waiting in RTR (a RESET since disarmed it).
        const engine::QpAttributes a = f.qp->shared->engine->Query();
        if (a.bound || a.state != engine::QpState::kRtr) return;
        std::lock_guard<std::mutex> lock(f.qp->shared->mutex);
        if (!f.qp->shared->oob_armed || f.qp->shared->oob_cm_bound) return;
        engine_qp = f.qp->shared->engine;
      },
      [&](Context* context) {
        if (engine_qp == nullptr) return;
        SIWX_LOG(kError, "QP %u: out-of-band connect failed: %s", qp_num, why.c_str());
        FailQp(context, qp_num, engine_qp);
      });
}

// ---- MPA ----

mpa::NegotiatorConfig MakeConfig(mpa::MpaRole role) {
  // The standard RFC 6581 startup between two siwx ends: v2, peer-to-peer
  // with a zero-length Write or Read as RTR, CRC if either end asks.
  mpa::NegotiatorConfig c;
  c.role = role;
  c.dialect = mpa::MpaDialect::kV2;
  c.crc = mpa::CrcPolicy::kAllow;
  c.ird = kReadDepth;
  c.ord = kReadDepth;
  c.peer_to_peer = role == mpa::MpaRole::kInitiator;
  c.rtr_types = {false, true, true};
  c.startup_timeout = std::chrono::milliseconds(TimeoutMs());
  c.first_fpdu_timeout = mpa::MpaTime::zero();
  return c;
}

mpa::MpaTime Now() {
  return std::chrono::duration_cast<mpa::MpaTime>(Clock::now().time_since_epoch());
}

// Decides on a Request (Responder): fills the Reply's private data and
// returns true to accept.
using RequestDecider = std::function<bool(const mpa::StartupOffer&, std::vector<std::uint8_t>*)>;

// Runs the startup phase on `fd` to its end within the time limit: 0 with
// the negotiated parameters, or an errno (ECONNREFUSED for a reject, EPROTO
// for a failed negotiation, ETIMEDOUT) with *why for the log. Reads only
// startup-frame octets; what follows stays in the socket for the engine.
int RunMpa(int fd, mpa::MpaNegotiator& n, std::vector<std::uint8_t> private_data,
           const RequestDecider& decide, mpa::NegotiatedParams* out, std::string* why) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(TimeoutMs());
  if (n.Start(Now(), private_data) != mpa::NegotiatorStatus::kOk) {
    *why = "the MPA negotiator refused its configuration";
    return EINVAL;
  }
  std::vector<std::uint8_t> buffer(1024);
  for (;;) {
    const ByteSpan pending = n.PendingOutput();
    if (!pending.empty()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (int error = transport::WriteAll(fd, pending, static_cast<int>(std::max<long>(left, 1)));
          error != 0) {
        *why = std::string("sending the MPA frame failed: ") + std::strerror(error);
        return error;
      }
      n.ConsumeOutput(pending.size());
    }
    while (std::optional<mpa::NegotiatorEvent> event = n.NextEvent()) {
      switch (event->type) {
        case mpa::NegotiatorEventType::kRequestReceived: {
          std::vector<std::uint8_t> reply;
          if (decide && decide(n.offer(), &reply)) {
            n.Accept(Now(), reply, kReadDepth, kReadDepth);
            break;
          }
          // The Reply with R = 1 is the last frame (RFC 5044 7.1.2 rule 3).
          n.Reject(reply);
          const ByteSpan last = n.PendingOutput();
          if (!last.empty()) transport::WriteAll(fd, last, 1000);
          *why = "refused here";
          return ECONNREFUSED;
        }
        case mpa::NegotiatorEventType::kEstablished: {
          const ByteSpan last = n.PendingOutput();
          if (!last.empty()) {
            if (int error = transport::WriteAll(fd, last, TimeoutMs()); error != 0) {
              *why = std::string("sending the MPA Reply failed: ") + std::strerror(error);
              return error;
            }
            n.ConsumeOutput(last.size());
          }
          *out = n.params();
          return 0;
        }
        case mpa::NegotiatorEventType::kRejected: {
          const ByteSpan last = n.PendingOutput();
          if (!last.empty()) transport::WriteAll(fd, last, 1000);
          *why = event->by_peer ? "the peer refused the connection (MPA reject)"
                                : "the connection was refused here: " + event->reason;
          *out = n.params();
          return ECONNREFUSED;
        }
        case mpa::NegotiatorEventType::kFailed:
          *why = "MPA negotiation failed: " + event->reason;
          return EPROTO;
      }
    }
    if (!n.PendingOutput().empty()) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      *why = "no MPA frame within " + std::to_string(TimeoutMs()) + " ms";
      return ETIMEDOUT;
    }
    const int wait = transport::WaitReadable(fd, static_cast<int>(left));
    if (wait == ETIMEDOUT) continue;
    if (wait != 0) {
      *why = std::string("waiting for the peer failed: ") + std::strerror(wait);
      return wait;
    }
    const transport::IoResult r = transport::PeekSome(fd, buffer);
    if (r.status == transport::IoStatus::kWouldBlock) continue;
    if (r.status != transport::IoStatus::kOk) {
      n.OnConnectionClosed();
      continue;  // the negotiator reports kFailed
    }
    const std::size_t used = n.Feed(Now(), ByteSpan(buffer.data(), r.bytes));
    if (used > 0) {
      if (int error = transport::DiscardPeeked(fd, used); error != 0) {
        *why = std::string("reading the MPA frame failed: ") + std::strerror(error);
        return error;
      }
    } else if (n.state() != mpa::NegotiatorState::kAwaitingReply &&
               n.state() != mpa::NegotiatorState::kAwaitingRequest) {
      continue;  // an event is due
    } else {
      *why = "the peer sent something that is not an MPA frame";
      return EPROTO;
    }
  }
}

// ---- Binding ----

// Binds `fd` to the QP if it is still armed for this peer, as a passive or
// dialing end; closes `fd` otherwise. Returns 0, or an errno with *why.
int BindArmed(Device* device, std::uint64_t context_id, std::uint32_t qp_num,
              std::uint64_t token, int fd, const siwx_stream_params& params, std::string* why) {
  bool ok = false;
  int rc = ENOENT;
  const bool found = WithQp(
      device, context_id, qp_num, token,
      [&](Found& f) {
        std::lock_guard<std::mutex> lock(f.qp->shared->mutex);
        ok = f.qp->shared->oob_armed && !f.qp->shared->oob_cm_bound;
      },
      [&](Context* context) {
        if (!ok) return;
        rc = BindStream(context, qp_num, fd, &params, nullptr);
      });
  if (!found) {
    *why = "the QP was destroyed meanwhile";
  } else if (!ok) {
    *why = "the QP is no longer waiting for an out-of-band connection";
  } else if (rc != 0) {
    *why = std::string("binding the stream failed: ") + std::strerror(rc);
  }
  if (rc != 0) transport::CloseFd(fd);
  return rc;
}

void Dial(Device* device, std::uint64_t context_id, std::uint32_t qp_num, std::uint64_t token,
          GidBytes local_gid, GidBytes remote_gid, std::uint32_t remote_qpn) {
  const Endpoint peer = *DecodeGid(remote_gid);
  const std::string where = EndpointText(peer);
  int fd = -1;
  if (int error = transport::ConnectTcp(peer.address, ntohs(peer.port), TimeoutMs(), &fd);
      error != 0) {
    FailIfUnbound(device, context_id, qp_num, token,
                  "cannot connect to the peer's siwx listener at " + where + " (peer QP " +
                      std::to_string(remote_qpn) + "): " + std::strerror(error) +
                      ". Check that the peer runs under siwx-run and is still alive, that its "
                      "GID was exchanged unchanged, and that no firewall blocks TCP port " +
                      std::to_string(ntohs(peer.port)));
    return;
  }
  mpa::MpaNegotiator negotiator(MakeConfig(mpa::MpaRole::kInitiator));
  mpa::NegotiatedParams params;
  std::string why;
  int rc = RunMpa(fd, negotiator, EncodePrivateData({remote_qpn, qp_num, local_gid}), nullptr,
                  &params, &why);
  if (rc == 0) {
    const std::optional<PrivateData> reply = DecodePrivateData(params.peer_private_data);
    if (!reply || reply->first_qpn != qp_num || reply->second_qpn != remote_qpn) {
      why = "the listener at " + where + " is not the siwx out-of-band listener of peer QP " +
            std::to_string(remote_qpn);
      rc = EPROTO;
    }
  }
  if (rc == 0) {
    rc = BindArmed(device, context_id, qp_num, token, fd,
                   MakeStreamParams(params, mpa::MpaRole::kInitiator, TimeoutMsForStream()), &why);
    if (rc == 0) {
      SIWX_LOG(kDebug, "QP %u: connected out of band to QP %u at %s", qp_num, remote_qpn,
               where.c_str());
      return;
    }
    fd = -1;  // closed by BindArmed
  }
  transport::CloseFd(fd);
  FailIfUnbound(device, context_id, qp_num, token,
                "connecting to peer QP " + std::to_string(remote_qpn) + " at " + where + ": " +
                    why + ". Check that the peer moved that QP to RTR with this QP's number "
                          "and GID");
}

// What the listener does with a Request for a QP.
enum class Disposition { kRefuse, kBind, kPark };

struct Target {
  Disposition what = Disposition::kRefuse;
  std::uint64_t context_id = 0;
  std::uint64_t token = 0;
  std::string why;  // kRefuse
};

// The QP numbered `qp_num` on this device that waits for the initiator
// (qpn, gid): armed for exactly that peer (bind), or not armed yet, in INIT
// or RTR with nothing parked (park). Device mutex held.
Target ChooseTarget(Device* device, std::uint32_t qp_num, std::uint32_t peer_qpn,
                    const GidBytes& peer_gid) {
  Target best;
  best.why = "no QP " + std::to_string(qp_num) + " here waits for a connection";
  std::lock_guard<std::mutex> device_lock(device->mutex);
  for (Context* context : device->contexts) {
    ContextState* state = context->state;
    if (state == nullptr) continue;
    std::lock_guard<std::mutex> lock(state->qp_mutex);
    const auto it = state->qps.find(qp_num);
    if (it == state->qps.end()) continue;
    QpShared& shared = *it->second->shared;
    const engine::QpState s = shared.engine->state();
    std::lock_guard<std::mutex> shared_lock(shared.mutex);
    if (shared.oob_cm_bound || (s != engine::QpState::kInit && s != engine::QpState::kRtr)) {
      continue;
    }
    if (shared.oob_armed) {
      if (shared.oob_dialer || shared.oob_remote_qpn != peer_qpn ||
          shared.oob_remote_gid != peer_gid) {
        best.why = "QP " + std::to_string(qp_num) + " waits for another peer";
        continue;
      }
      return {Disposition::kBind, state->id, shared.token, {}};
    }
    if (shared.oob_parked_fd < 0 && best.what == Disposition::kRefuse) {
      best = {Disposition::kPark, state->id, shared.token, {}};
    }
  }
  return best;
}

// Parks `fd` on the QP, or binds it if the QP was armed for this peer
// meanwhile; closes it when neither applies.
void ParkOrBind(Device* device, const Target& target, std::uint32_t qp_num,
                std::uint32_t peer_qpn, const GidBytes& peer_gid, int fd,
                const siwx_stream_params& params) {
  bool bind = false;
  bool parked = false;
  WithQp(device, target.context_id, qp_num, target.token, [&](Found& f) {
    QpShared& shared = *f.qp->shared;
    std::lock_guard<std::mutex> lock(shared.mutex);
    if (shared.oob_cm_bound) return;
    if (shared.oob_armed) {
      bind = !shared.oob_dialer && shared.oob_remote_qpn == peer_qpn &&
             shared.oob_remote_gid == peer_gid;
      return;
    }
    if (shared.oob_parked_fd >= 0) return;
    shared.oob_parked_fd = fd;
    shared.oob_parked_params = params;
    shared.oob_parked_peer_qpn = peer_qpn;
    shared.oob_parked_peer_gid = peer_gid;
    parked = true;
  });
  if (parked) {
    SIWX_LOG(kDebug, "QP %u: stream from peer QP %u parked until RTR", qp_num, peer_qpn);
    return;
  }
  if (bind) {
    std::string why;
    if (BindArmed(device, target.context_id, qp_num, target.token, fd, params, &why) != 0) {
      FailIfUnbound(device, target.context_id, qp_num, target.token, why);
    }
    return;
  }
  SIWX_LOG(kWarn, "QP %u: out-of-band stream from peer QP %u dropped: the QP is taken", qp_num,
           peer_qpn);
  transport::CloseFd(fd);
}

void Serve(Device* device, int fd) {
  mpa::MpaNegotiator negotiator(MakeConfig(mpa::MpaRole::kResponder));
  std::optional<PrivateData> request;
  Target target;
  GidBytes local_gid{};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (Listener* l : *g_listeners) {
      if (l->device == device && l->pid == ::getpid()) local_gid = EncodeGid(l->endpoint);
    }
  }
  const RequestDecider decide = [&](const mpa::StartupOffer& offer,
                                    std::vector<std::uint8_t>* reply) {
    request = DecodePrivateData(offer.private_data);
    if (!request) {
      target.why = "the MPA Request does not come from a siwx out-of-band connect";
      return false;
    }
    target = ChooseTarget(device, request->first_qpn, request->second_qpn, request->gid);
    *reply = EncodePrivateData({request->second_qpn, request->first_qpn, local_gid});
    return target.what != Disposition::kRefuse;
  };
  mpa::NegotiatedParams params;
  std::string why;
  const int rc = RunMpa(fd, negotiator, {}, decide, &params, &why);
  if (rc != 0) {
    SIWX_LOG(kWarn, "%s: out-of-band connection refused: %s", device->vdev.device.name,
             request && target.what == Disposition::kRefuse ? target.why.c_str() : why.c_str());
    transport::CloseFd(fd);
    return;
  }
  const siwx_stream_params stream =
      MakeStreamParams(params, mpa::MpaRole::kResponder, TimeoutMsForStream());
  if (target.what == Disposition::kBind) {
    if (BindArmed(device, target.context_id, request->first_qpn, target.token, fd, stream,
                  &why) != 0) {
      FailIfUnbound(device, target.context_id, request->first_qpn, target.token, why);
    }
    return;
  }
  ParkOrBind(device, target, request->first_qpn, request->second_qpn, request->gid, fd, stream);
}

// Fails passive QPs whose peer did not connect in time.
void CheckWaits() {
  std::vector<PassiveWait> due;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const Clock::time_point now = Clock::now();
    auto keep = std::partition(g_waits->begin(), g_waits->end(),
                               [&](const PassiveWait& w) { return w.deadline > now; });
    due.assign(keep, g_waits->end());
    g_waits->erase(keep, g_waits->end());
  }
  for (const PassiveWait& w : due) {
    FailIfUnbound(w.device, w.context_id, w.qp_num, w.token,
                  "no connection from the peer within " + std::to_string(TimeoutMs()) +
                      " ms (SIWX_OOB_TIMEOUT_MS): the peer did not move its QP to RTR, or "
                      "cannot reach this process's siwx listener (firewall?)");
  }
}

void ListenLoop(Device* device, int listen_fd) {
  for (;;) {
    int fd = -1;
    const int rc = transport::AcceptTcp(listen_fd, kAcceptPollMs, &fd);
    if (rc == 0) {
      if (g_handlers.fetch_add(1) >= kMaxHandlers) {
        g_handlers.fetch_sub(1);
        transport::CloseFd(fd);  // the dialer sees the close and fails clearly
      } else {
        try {
          util::StartServiceThread("siwx-oob-serve", [device, fd] {
            Serve(device, fd);
            g_handlers.fetch_sub(1);
          }).detach();
        } catch (...) {
          g_handlers.fetch_sub(1);
          transport::CloseFd(fd);
        }
      }
    } else if (rc != ETIMEDOUT) {
      // EMFILE and the like: back off instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptPollMs));
    }
    CheckWaits();
  }
}

}  // namespace

GidBytes EncodeGid(const Endpoint& endpoint) { return OobGid(endpoint); }

std::optional<Endpoint> DecodeGid(const GidBytes& gid) {
  Endpoint e;
  if (!OobEndpointOf(gid, &e)) return std::nullopt;
  return e;
}

std::optional<GidBytes> LocalGid(Device* device) {
  char ifname[SIWX_IFNAME_SIZE];
  {
    std::lock_guard<std::mutex> lock(device->mutex);
    std::memcpy(ifname, device->port.ifname, sizeof(ifname));
  }
  ifname[sizeof(ifname) - 1] = '\0';
  std::lock_guard<std::mutex> lock(g_mutex);
  const pid_t pid = ::getpid();
  for (Listener* l : *g_listeners) {
    if (l->device != device || l->pid != pid) continue;
    if (l->failed) return std::nullopt;
    return EncodeGid(l->endpoint);
  }
  auto* listener = new Listener();  // lives as long as the process
  listener->device = device;
  listener->pid = pid;
  g_listeners->push_back(listener);
  std::uint32_t address = 0;
  int rc = transport::Ipv4AddressOf(ifname, &address);
  if (rc != 0) {
    SIWX_LOG(kInfo, "%s: %s has no IPv4 address: out-of-band QP connect is not available on it",
             device->vdev.device.name, ifname);
    listener->failed = true;
    return std::nullopt;
  }
  std::uint16_t port = 0;
  rc = transport::ListenTcp(address, ConfiguredPort(), &listener->fd, &port);
  if (rc != 0) {
    SIWX_LOG(kError, "%s: cannot listen for out-of-band QP connects on port %u: %s; programs "
             "that connect QPs by GID (ibv_rc_pingpong, perftest without -R) will fail. "
             "Unset SIWX_OOB_PORT or choose a free port (one per process and device)",
             device->vdev.device.name, ConfiguredPort(), std::strerror(rc));
    listener->failed = true;
    return std::nullopt;
  }
  listener->endpoint = {address, htons(port)};
  try {
    util::StartServiceThread("siwx-oob-listen", ListenLoop, device, listener->fd).detach();
  } catch (...) {
    SIWX_LOG(kError, "%s: cannot start the out-of-band listener thread", device->vdev.device.name);
    transport::CloseFd(listener->fd);
    listener->fd = -1;
    listener->failed = true;
    return std::nullopt;
  }
  SIWX_LOG(kDebug, "%s: out-of-band listener at %s", device->vdev.device.name,
           EndpointText(listener->endpoint).c_str());
  return EncodeGid(listener->endpoint);
}

int CheckModify(Qp* qp, const ibv_qp_attr& attr, int attr_mask) {
  if ((attr_mask & IBV_QP_STATE) == 0 || attr.qp_state != IBV_QPS_RTR) return 0;
  if ((attr_mask & IBV_QP_AV) == 0) return 0;  // the CM's RTR: no address vector
  const std::uint32_t qp_num = qp->vqp.qp.qp_num;
  if (!attr.ah_attr.is_global) {
    SIWX_LOG(kError, "QP %u: ibv_modify_qp to RTR with an address vector without GRH: siwx "
             "finds the peer by its GID (the port is Ethernet, as RoCE); pass the GID index "
             "(ibv_rc_pingpong -g 0, perftest -x 0)", qp_num);
    return EINVAL;
  }
  GidBytes gid;
  std::memcpy(gid.data(), attr.ah_attr.grh.dgid.raw, gid.size());
  if (!DecodeGid(gid)) {
    SIWX_LOG(kError, "QP %u: ibv_modify_qp to RTR: the destination GID is not a siwx GID with "
             "an IPv4 address and port; exchange the GID that ibv_query_gid returns for the "
             "peer's siwx device", qp_num);
    return EINVAL;
  }
  if ((attr_mask & IBV_QP_DEST_QPN) == 0) {
    SIWX_LOG(kError, "QP %u: ibv_modify_qp to RTR with an address vector needs "
             "IBV_QP_DEST_QPN", qp_num);
    return EINVAL;
  }
  if (attr.ah_attr.grh.sgid_index >= DeviceLimits::kGidTableLength) return EINVAL;
  if (!LocalGid(qp->context->state->device)) {
    SIWX_LOG(kError, "QP %u: out-of-band connect is not available on %s (see the message "
             "above)", qp_num, qp->context->vctx.context.device->name);
    return EINVAL;
  }
  return 0;
}

void OnRtr(Qp* qp, const ibv_qp_attr& attr, int attr_mask) {
  if ((attr_mask & IBV_QP_STATE) == 0 || attr.qp_state != IBV_QPS_RTR ||
      (attr_mask & IBV_QP_AV) == 0) {
    return;
  }
  Context* context = qp->context;
  Device* device = context->state->device;
  const std::optional<GidBytes> local = LocalGid(device);
  if (!local) return;  // CheckModify refused it already
  QpShared& shared = *qp->shared;
  const std::uint32_t qp_num = qp->vqp.qp.qp_num;
  GidBytes remote;
  std::memcpy(remote.data(), attr.ah_attr.grh.dgid.raw, remote.size());
  int parked_fd = -1;
  siwx_stream_params parked_params{};
  bool dial = false;
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    if (shared.oob_cm_bound) return;
    shared.oob_armed = true;
    shared.oob_local_gid = *local;
    shared.oob_remote_gid = remote;
    shared.oob_remote_qpn = attr.dest_qp_num;
    shared.oob_dialer = Less(*local, qp_num, remote, attr.dest_qp_num);
    dial = shared.oob_dialer;
    if (shared.oob_parked_fd >= 0) {
      if (!dial && shared.oob_parked_peer_qpn == attr.dest_qp_num &&
          shared.oob_parked_peer_gid == remote) {
        parked_fd = shared.oob_parked_fd;
        parked_params = shared.oob_parked_params;
      } else {
        SIWX_LOG(kWarn, "QP %u: dropping a stream parked from peer QP %u: RTR names peer QP %u",
                 qp_num, shared.oob_parked_peer_qpn, attr.dest_qp_num);
        transport::CloseFd(shared.oob_parked_fd);
      }
      shared.oob_parked_fd = -1;
    }
  }
  const std::uint64_t context_id = context->state->id;
  const std::uint64_t token = shared.token;
  shared.engine->UseIbTeardown();
  if (parked_fd >= 0) {
    const int rc = BindStream(context, qp_num, parked_fd, &parked_params, nullptr);
    if (rc != 0) {
      transport::CloseFd(parked_fd);
      SIWX_LOG(kError, "QP %u: out-of-band connect failed: binding the stream: %s", qp_num,
               std::strerror(rc));
      FailQp(context, qp_num, shared.engine);
    }
    return;
  }
  if (dial) {
    const std::uint32_t remote_qpn = attr.dest_qp_num;
    const GidBytes local_gid = *local;
    try {
      util::StartServiceThread("siwx-oob-dial", Dial, device, context_id, qp_num, token, local_gid,
                               remote, remote_qpn)
          .detach();
    } catch (...) {
      SIWX_LOG(kError, "QP %u: out-of-band connect failed: no thread to connect with", qp_num);
      FailQp(context, qp_num, shared.engine);
    }
    return;
  }
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_waits->push_back({device, context_id, qp_num, token,
                        Clock::now() + std::chrono::milliseconds(TimeoutMs())});
  } catch (...) {
    // Without the limit the QP still connects; it only waits without bound.
  }
}

void OnRtsRequested(Qp* qp) {
  bool armed = false;
  {
    std::lock_guard<std::mutex> lock(qp->shared->mutex);
    armed = qp->shared->oob_armed && !qp->shared->oob_cm_bound;
  }
  if (armed) qp->shared->engine->QueueSendsBeforeStream();
}

void NoteCmBound(Context* context, std::uint32_t qp_num) {
  ContextState* state = context->state;
  std::lock_guard<std::mutex> lock(state->qp_mutex);
  const auto it = state->qps.find(qp_num);
  if (it == state->qps.end()) return;
  QpShared& shared = *it->second->shared;
  std::lock_guard<std::mutex> shared_lock(shared.mutex);
  shared.oob_cm_bound = true;
  if (shared.oob_parked_fd >= 0) {
    transport::CloseFd(shared.oob_parked_fd);
    shared.oob_parked_fd = -1;
  }
}

void Release(QpShared& shared) {
  std::lock_guard<std::mutex> lock(shared.mutex);
  shared.oob_armed = false;
  shared.oob_dialer = false;
  if (shared.oob_parked_fd >= 0) {
    transport::CloseFd(shared.oob_parked_fd);
    shared.oob_parked_fd = -1;
  }
}

}  // namespace oob
}  // namespace siwx::provider
