// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Out-of-band QP connect: RC QPs that applications connect themselves, by
// exchanging QPN, PSN and GID over their own socket and moving the QP
// through INIT/RTR/RTS with ibv_modify_qp (ibv_rc_pingpong, perftest without
// -R). The design, the GID layout and the settings are in
// docs/out-of-band-connect.md; in short:
//
//  - The GID of a siwx port names a TCP endpoint of this process: octets
//    0..7 zero (the subnet prefix), 8..9 the port of the process's listener
//    for the device, 10..11 0xffff, 12..15 the interface's IPv4 address.
//  - ibv_modify_qp to RTR with a GRH naming such a GID and IBV_QP_DEST_QPN
//    "arms" the QP. Of the two ends, the one with the smaller (GID, QPN)
//    connects to the other's listener at once and runs a standard MPA v2
//    exchange (RFC 6581, peer-to-peer with an RTR) whose private data names
//    the target QP; the other end's listener binds the stream to that QP.
//    Both ends then move to RTS through the ordinary stream bind.
//  - Send WRs posted after the application asked for RTS but before the
//    stream is up wait in the send queue (engine::Qp::QueueSendsBeforeStream).
//  - Failure (peer unreachable, refused, no stream within the time limit)
//    moves the QP to ERR: its WRs flush and IBV_EVENT_QP_FATAL is raised,
//    with one error line saying what to check.
//
// QPs the connection manager binds never take this path: the CM's
// rdma_init_qp_attr never passes IBV_QP_AV, and a CM bind drops anything
// the listener parked for the QP.
#pragma once

#include <cstdint>
#include <optional>

#include "providers/siwx/provider.h"

namespace siwx::provider::oob {

// A TCP endpoint, both fields in network order (identity.h).
using Endpoint = OobEndpoint;

GidBytes EncodeGid(const Endpoint& endpoint);
// The endpoint a siwx GID names; nullopt for any other GID.
std::optional<Endpoint> DecodeGid(const GidBytes& gid);

// The GID of port 1 of `device` in this process: the endpoint of its
// listener, started on first use. nullopt when the interface has no IPv4
// address or no listener could be opened (logged once; the caller then
// reports the interface-id GID and out-of-band connect is unavailable).
std::optional<GidBytes> LocalGid(Device* device);

// ibv_modify_qp checks, before the transition: 0 or the errno. A move to
// RTR with IBV_QP_AV must carry a GRH naming a siwx GID, and needs
// IBV_QP_DEST_QPN (RoCE devices refuse an AV without GRH as well).
int CheckModify(Qp* qp, const ibv_qp_attr& attr, int attr_mask);
// After a successful transition to RTR (armed when the attributes name a
// peer) or the application's request for RTS.
void OnRtr(Qp* qp, const ibv_qp_attr& attr, int attr_mask);
void OnRtsRequested(Qp* qp);

// The CM bound a stream to the QP: it is not out of band.
void NoteCmBound(Context* context, std::uint32_t qp_num);
// ibv_destroy_qp and a modify to RESET: disarms the QP and drops a parked
// stream.
void Release(QpShared& shared);

}  // namespace siwx::provider::oob
