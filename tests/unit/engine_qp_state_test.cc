// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// QP state machine: the full modify and event tables, post dispositions, the
// ibv/iWARP state mapping, and the compare-and-swap wrapper under races.
#include "common/engine/qp_state.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace siwx::engine {
namespace {

using S = QpState;
constexpr S kR = S::kReset, kI = S::kInit, kRtr = S::kRtr, kRts = S::kRts, kC = S::kClosing,
            kT = S::kTerminate, kE = S::kError;
constexpr S kAll[] = {kR, kI, kRtr, kRts, kC, kT, kE};

constexpr std::uint32_t kFlush = kQpActionFlushQueues;
constexpr std::uint32_t kDiscard = kQpActionDiscardQueues;
constexpr std::uint32_t kClose = kQpActionCloseLlp;
constexpr std::uint32_t kAbort = kQpActionAbortLlp;
constexpr std::uint32_t kNone = kQpActionNone;

struct Expect {
  bool ok;
  std::uint32_t actions;
};
constexpr Expect kNo{false, kNone};
constexpr Expect Yes(std::uint32_t actions) { return {true, actions}; }

TEST(QpStateValues, MirrorIbvQpState) {
  EXPECT_EQ(static_cast<int>(kR), 0);  // IBV_QPS_RESET
  EXPECT_EQ(static_cast<int>(kI), 1);  // IBV_QPS_INIT
  EXPECT_EQ(static_cast<int>(kRtr), 2);
  EXPECT_EQ(static_cast<int>(kRts), 3);
  EXPECT_EQ(static_cast<int>(kC), 4);  // IBV_QPS_SQD
  EXPECT_EQ(static_cast<int>(kT), 5);  // IBV_QPS_SQE
  EXPECT_EQ(static_cast<int>(kE), 6);  // IBV_QPS_ERR
}

TEST(QpState, IwarpViewAndNames) {
  const IwarpQpState want[] = {IwarpQpState::kIdle,    IwarpQpState::kIdle,
                               IwarpQpState::kRtr,     IwarpQpState::kRts,
                               IwarpQpState::kClosing, IwarpQpState::kTerminate,
                               IwarpQpState::kError};
  for (int i = 0; i < kQpStateCount; ++i) EXPECT_EQ(IwarpStateOf(kAll[i]), want[i]) << i;
  EXPECT_EQ(QpStateName(kRts), "RTS");
  EXPECT_EQ(QpStateName(kC), "SQD/CLOSING");
  EXPECT_EQ(QpStateName(static_cast<S>(9)), "unknown");
  EXPECT_EQ(QpEventName(QpEvent::kLlpClosed), "LLP closed");
}

// Every (from, to) pair of ibv_modify_qp, row = from, column = to.
TEST(ModifyTransition, FullTable) {
  // clang-format off
  const Expect table[7][7] = {
    //        RESET             INIT       RTR        RTS        SQD          SQE  ERR
    /*RESET*/{Yes(kNone),       Yes(kNone), kNo,       kNo,       kNo,         kNo, Yes(kFlush)},
    /*INIT */{Yes(kDiscard),    Yes(kNone), Yes(kNone), kNo,      kNo,         kNo, Yes(kFlush)},
    /*RTR  */{Yes(kDiscard),    kNo,        kNo,       kNo,       kNo,         kNo, Yes(kFlush)},
    /*RTS  */{Yes(kDiscard | kAbort), kNo,  kNo,       Yes(kNone), Yes(kClose), kNo, Yes(kFlush | kAbort)},
    /*SQD  */{Yes(kDiscard | kAbort), kNo,  kNo,       kNo,       Yes(kNone),  kNo, Yes(kFlush | kAbort)},
    /*SQE  */{Yes(kDiscard | kAbort), kNo,  kNo,       kNo,       kNo,         kNo, Yes(kFlush | kAbort)},
    /*ERR  */{Yes(kDiscard),    kNo,        kNo,       kNo,       kNo,         kNo, Yes(kNone)},
  };
  // clang-format on
  for (int f = 0; f < 7; ++f) {
    for (int t = 0; t < 7; ++t) {
      const TransitionResult r = ModifyTransition(kAll[f], kAll[t]);
      const Expect& e = table[f][t];
      SCOPED_TRACE(std::string(QpStateName(kAll[f])) + " -> " + std::string(QpStateName(kAll[t])));
      EXPECT_EQ(r.from, kAll[f]);
      if (e.ok) {
        EXPECT_EQ(r.status, QpStatus::kOk);
        EXPECT_EQ(r.to, kAll[t]);
        EXPECT_EQ(r.actions, e.actions);
      } else {
        EXPECT_EQ(r.status, QpStatus::kIllegalTransition);
        EXPECT_EQ(r.to, kAll[f]);
        EXPECT_EQ(r.actions, kNone);
      }
    }
  }
}

TEST(ModifyTransition, OutOfRangeStatesAreIllegal) {
  const TransitionResult a = ModifyTransition(static_cast<S>(7), kE);
  EXPECT_EQ(a.status, QpStatus::kIllegalTransition);
  const TransitionResult b = ModifyTransition(kRts, static_cast<S>(200));
  EXPECT_EQ(b.status, QpStatus::kIllegalTransition);
  EXPECT_EQ(b.to, kRts);
}

struct EventExpect {
  S to;  // == from when ignored
  bool ok;
  std::uint32_t actions;
};

// Every (state, event) pair.
TEST(EventTransition, FullTable) {
  constexpr EventExpect kIgn{kR, false, kNone};  // `to` replaced by from below
  const QpEvent events[] = {QpEvent::kConnectionEstablished, QpEvent::kPeerClosing,
                            QpEvent::kTerminateSent,         QpEvent::kTerminateReceived,
                            QpEvent::kLlpClosed,             QpEvent::kLocalError};
  // clang-format off
  const EventExpect table[7][6] = {
    //        established        peer closing        term sent          term received      LLP closed          local error
    /*RESET*/{kIgn,              kIgn,               kIgn,              kIgn,              kIgn,               kIgn},
    /*INIT */{{kRts, true, kNone}, kIgn,             kIgn,              kIgn,              {kE, true, kFlush}, {kE, true, kFlush}},
    /*RTR  */{{kRts, true, kNone}, kIgn,             kIgn,              kIgn,              {kE, true, kFlush}, {kE, true, kFlush}},
    /*RTS  */{kIgn, {kC, true, kClose}, {kT, true, kClose}, {kT, true, kClose}, {kE, true, kFlush}, {kE, true, kFlush | kAbort}},
    /*SQD  */{kIgn,              kIgn,      {kT, true, kClose}, {kT, true, kClose}, {kE, true, kFlush}, {kE, true, kFlush | kAbort}},
    /*SQE  */{kIgn,              kIgn,               kIgn,              kIgn,              {kE, true, kFlush}, {kE, true, kFlush | kAbort}},
    /*ERR  */{kIgn,              kIgn,               kIgn,              kIgn,              kIgn,               kIgn},
  };
  // clang-format on
  for (int f = 0; f < 7; ++f) {
    for (int ev = 0; ev < kQpEventCount; ++ev) {
      const TransitionResult r = EventTransition(kAll[f], events[ev]);
      const EventExpect& e = table[f][ev];
      SCOPED_TRACE(std::string(QpStateName(kAll[f])) + " + " + std::string(QpEventName(events[ev])));
      EXPECT_EQ(r.from, kAll[f]);
      if (e.ok) {
        EXPECT_EQ(r.status, QpStatus::kOk);
        EXPECT_EQ(r.to, e.to);
        EXPECT_EQ(r.actions, e.actions);
      } else {
        EXPECT_EQ(r.status, QpStatus::kIgnored);
        EXPECT_EQ(r.to, kAll[f]);
        EXPECT_EQ(r.actions, kNone);
      }
    }
  }
}

TEST(Disposition, PostsPerState) {
  using D = PostDisposition;
  const D send[] = {D::kReject, D::kReject, D::kReject, D::kAccept, D::kFlush, D::kFlush, D::kFlush};
  const D recv[] = {D::kReject, D::kAccept, D::kAccept, D::kAccept, D::kAccept, D::kAccept, D::kFlush};
  const bool inbound[] = {false, false, false, true, true, false, false};
  const bool sq[] = {false, false, false, true, false, false, false};
  for (int i = 0; i < kQpStateCount; ++i) {
    SCOPED_TRACE(QpStateName(kAll[i]));
    EXPECT_EQ(SendPostDisposition(kAll[i]), send[i]);
    EXPECT_EQ(ReceivePostDisposition(kAll[i]), recv[i]);
    EXPECT_EQ(ProcessesInbound(kAll[i]), inbound[i]);
    EXPECT_EQ(ProcessesSendQueue(kAll[i]), sq[i]);
  }
  EXPECT_EQ(SendPostDisposition(static_cast<S>(42)), D::kReject);
  EXPECT_EQ(ReceivePostDisposition(static_cast<S>(42)), D::kReject);
}

TEST(QpStateMachine, LifecycleOfAConnectedQp) {
  QpStateMachine qp;
  EXPECT_EQ(qp.state(), kR);
  EXPECT_EQ(qp.Modify(kI).status, QpStatus::kOk);
  EXPECT_EQ(qp.Modify(kRtr).status, QpStatus::kOk);
  // The application cannot move to RTS itself...
  const TransitionResult early = qp.Modify(kRts);
  EXPECT_EQ(early.status, QpStatus::kIllegalTransition);
  EXPECT_EQ(qp.state(), kRtr);
  // ...the CM does, once MPA is done.
  EXPECT_EQ(qp.Handle(QpEvent::kConnectionEstablished).to, kRts);
  EXPECT_EQ(qp.Modify(kRts).status, QpStatus::kOk);  // librdmacm's RTS modify: a no-op
  const TransitionResult close = qp.Modify(kC);         // rdma_disconnect
  EXPECT_EQ(close.actions, kClose);
  EXPECT_EQ(qp.state(), kC);
  const TransitionResult closed = qp.Handle(QpEvent::kLlpClosed);
  EXPECT_EQ(closed.from, kC);
  EXPECT_EQ(closed.to, kE);
  EXPECT_EQ(closed.actions, kFlush);
  EXPECT_EQ(qp.Handle(QpEvent::kLlpClosed).status, QpStatus::kIgnored);
  EXPECT_EQ(qp.Modify(kR).actions, kDiscard);
  EXPECT_EQ(qp.state(), kR);
}

TEST(QpStateMachine, TerminatePath) {
  QpStateMachine qp;
  qp.Modify(kI);
  qp.Handle(QpEvent::kConnectionEstablished);
  const TransitionResult t = qp.Handle(QpEvent::kTerminateReceived);
  EXPECT_EQ(t.to, kT);
  EXPECT_EQ(t.actions, kClose);
  EXPECT_EQ(qp.Modify(kRts).status, QpStatus::kIllegalTransition);  // no SQE -> RTS on iWARP
  EXPECT_EQ(qp.Handle(QpEvent::kLlpClosed).to, kE);
}

TEST(QpStateMachine, CurrentStateMustMatchWhenGiven) {
  QpStateMachine qp;
  const TransitionResult r = qp.Modify(kI, kRts);
  EXPECT_EQ(r.status, QpStatus::kStateMismatch);
  EXPECT_EQ(r.from, kR);
  EXPECT_EQ(qp.state(), kR);
  EXPECT_EQ(qp.Modify(kI, kR).status, QpStatus::kOk);
  EXPECT_EQ(qp.state(), kI);
}

// Application threads force ERR while the progress thread reports the LLP
// closing: exactly one call performs RTS -> ERR (and its flush); the rest see
// ERR already.
TEST(QpStateMachine, RacingModifyAndEventsTransitionOnce) {
  for (int round = 0; round < 200; ++round) {
    QpStateMachine qp;
    qp.Modify(kI);
    qp.Handle(QpEvent::kConnectionEstablished);
    std::atomic<int> flushes{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        while (!go.load()) std::this_thread::yield();
        const TransitionResult r =
            (i % 2 == 0) ? qp.Modify(kE) : qp.Handle(QpEvent::kLlpClosed);
        if (r.status == QpStatus::kOk && (r.actions & kFlush) != 0) {
          EXPECT_EQ(r.from, kRts);
          flushes.fetch_add(1);
        } else if (r.status == QpStatus::kOk) {
          EXPECT_EQ(r.from, kE);  // ERR -> ERR no-op
        } else {
          EXPECT_EQ(r.status, QpStatus::kIgnored);  // LLP closed while already ERR
        }
      });
    }
    go.store(true);
    for (auto& t : threads) t.join();
    ASSERT_EQ(flushes.load(), 1) << "round " << round;
    EXPECT_EQ(qp.state(), kE);
  }
}

}  // namespace
}  // namespace siwx::engine
