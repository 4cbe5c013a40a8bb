# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
"""pyverbs (rdma-core's Python binding, Debian python3-pyverbs) on a siwx
device under siwx-run: it finds siwx_lo, opens it and drives the objects
and QP states through libibverbs, with the errno values the C tests pin.
Exits 77 (CTest skip) when pyverbs is not importable."""
import errno
import sys

try:
    import pyverbs.device as d
    import pyverbs.enums as e
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsRDMAError
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR
except ImportError as err:
    print(f"pyverbs is not available ({err}): skipped")
    sys.exit(77)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


def expect_errno(fn, code, what):
    try:
        fn()
    except PyverbsRDMAError as err:
        check(err.error_code == code, f"{what}: errno {err.error_code}, want {code}")
        return
    check(False, f"{what}: no error, want errno {code}")


names = [dev.name for dev in d.get_device_list()]
check(b"siwx_lo" in names, f"siwx_lo in {names}")
with d.Context(name="siwx_lo") as ctx:
    attr = ctx.query_device()
    check(attr.vendor_id == 0x737778, f"vendor id {attr.vendor_id:#x}")
    check(attr.max_sge_rd == 1, f"max_sge_rd {attr.max_sge_rd}")
    port = ctx.query_port(1)
    check(port.state == e.IBV_PORT_ACTIVE, f"port state {port.state}")

    pd = PD(ctx)
    channel = CompChannel(ctx)
    cq = CQ(ctx, 16, None, channel, 0)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=2, max_recv_sge=2)

    # Datagram QPs do not exist on iWARP.
    expect_errno(lambda: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap)),
                 errno.EOPNOTSUPP, "UD QP")

    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    check(qp.qp_num != 0, "qp_num")
    check(qp.qp_state == e.IBV_QPS_RESET, f"state {qp.qp_state}")

    init = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    init.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    qp.modify(init, e.IBV_QP_STATE | e.IBV_QP_ACCESS_FLAGS | e.IBV_QP_PORT)
    attr, init_attr = qp.query(e.IBV_QP_STATE | e.IBV_QP_ACCESS_FLAGS)
    check(attr.qp_state == e.IBV_QPS_INIT, f"state after INIT {attr.qp_state}")
    check(attr.qp_access_flags == init.qp_access_flags, f"access {attr.qp_access_flags}")
    check(init_attr.cap.max_send_wr == 4, f"max_send_wr {init_attr.cap.max_send_wr}")

    # Sends wait for a stream; receives are taken.
    sge = SGE(mr.buf, 64, mr.lkey)
    expect_errno(lambda: qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                                             sg=[sge])),
                 errno.EINVAL, "post_send in INIT")
    qp.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[sge]))

    # An unknown state is refused, ERR flushes the receive.
    expect_errno(lambda: qp.modify(QPAttr(qp_state=e.IBV_QPS_UNKNOWN), e.IBV_QP_STATE),
                 errno.EINVAL, "modify to UNKNOWN")
    qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    n, wcs = 0, []
    for _ in range(20000):
        n, wcs = cq.poll(1)
        if n:
            break
    check(n == 1, "flush completion")
    check(wcs[0].wr_id == 7 and wcs[0].status == e.IBV_WC_WR_FLUSH_ERR,
          f"completion {wcs[0].wr_id} status {wcs[0].status}")

    qp.close()
    cq.close()
    channel.close()
    mr.close()
    pd.close()
print("pyverbs_smoke: ok")
