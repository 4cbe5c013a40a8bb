// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* siwxdv.h: the handover of an established iWARP stream from the userspace
 * connection manager (rdmacm-ext, librdmacm-siwx.so) to a siwx QP.
 *
 * The CM owns the TCP connection through the MPA startup phase (RFC 5044
 * 7.1, RFC 6581). Once both MPA frames have been exchanged it gives the
 * connected socket and the negotiated parameters to the QP of the rdma_cm_id
 * with siwx_qp_bind_stream(); from then on the provider and its engine own
 * the socket. This is the userspace equivalent of the kernel iw_cm handing a
 * connected socket to a siw QP and moving it to RTS.
 *
 * Implemented by the provider (libsiwx-rdmav34.so); the CM reaches the
 * functions with dlsym(), so either side builds and runs without the other.
 * When the provider does not export them, the CM keeps the socket itself and
 * still reports ESTABLISHED ("CM-only mode", used by the CM tests).
 *
 * Conventions follow siwx_provider.h: 0 or a positive errno value; pointers
 * or NULL with errno set. No function blocks on the network.
 *
 * Calling context: the CM calls these from an application thread or from its
 * own thread, never while holding a lock the provider could need. The
 * provider may call the notify callback from any of its threads, including
 * from inside siwx_qp_bind_stream() and siwx_qp_disconnect_stream(); the
 * callback only queues work and returns, and it ignores cookies it no longer
 * knows, so calling it late is harmless. */
#ifndef SIWXDV_H_
#define SIWXDV_H_

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The MPA startup dialect a connection negotiated (informational). */
enum siwx_mpa_dialect {
	SIWX_MPA_DIALECT_V1 = 1,     /* RFC 5044 */
	SIWX_MPA_DIALECT_V1_RTR = 2, /* RFC 5044 + the Rtr/S-bit proposal */
	SIWX_MPA_DIALECT_V2 = 3,     /* RFC 6581 */
};

/* RFC 6581 peer-to-peer RTR: who sends the zero-length RTR message. */
enum siwx_rtr_role {
	SIWX_RTR_ROLE_NONE = 0,  /* no RTR message */
	SIWX_RTR_ROLE_SEND = 1,  /* Initiator: send `rtr_message` first, nothing before it */
	SIWX_RTR_ROLE_AWAIT = 2, /* Responder: absorb one RTR of `rtr_accept_mask` first */
};

/* Which zero-length message carries the RTR (RFC 6581 9.2 B, C, D); values
 * equal siwx::engine::RtrMessage. */
enum siwx_rtr_message {
	SIWX_RTR_MESSAGE_SEND = 0,
	SIWX_RTR_MESSAGE_WRITE = 1,
	SIWX_RTR_MESSAGE_READ = 2,
};
#define SIWX_RTR_MASK_SEND (1u << SIWX_RTR_MESSAGE_SEND)
#define SIWX_RTR_MASK_WRITE (1u << SIWX_RTR_MESSAGE_WRITE)
#define SIWX_RTR_MASK_READ (1u << SIWX_RTR_MESSAGE_READ)

/* The outcome of MPA negotiation, mirroring siwx::engine::StreamParams
 * (common/engine/stream_params.h) in plain C. Directions are named from this
 * end. Marker grid offsets are 0: Full Operation starts right after the last
 * startup frame, and the CM never reads or writes past it. */
struct siwx_stream_params {
	uint32_t size;                  /* sizeof(struct siwx_stream_params) of the caller */
	uint8_t mpa_dialect;            /* enum siwx_mpa_dialect */
	uint8_t mpa_revision;           /* Rev of the Reply, 1 or 2 */
	uint8_t crc;                    /* RFC 5044 7.1.1 C: CRC32c both ways */
	uint8_t tx_markers;             /* we insert markers (the peer's M bit), RFC 5044 4.3 */
	uint8_t rx_markers;             /* the peer inserts markers (our M bit) */
	uint8_t rtr_role;               /* enum siwx_rtr_role */
	uint8_t rtr_message;            /* SIWX_RTR_ROLE_SEND: enum siwx_rtr_message */
	uint8_t rtr_accept_mask;        /* SIWX_RTR_ROLE_AWAIT: SIWX_RTR_MASK_* that may arrive */
	/* Responder without RTR: receive and validate one FPDU before sending
	 * any (RFC 5044 7.1.2 rule 4). */
	uint8_t wait_first_fpdu;
	/* Both startup frames carried Linux siw's L bit (0x0800, its
	 * MPA_RR_FLAG_GSO_EXP): send FPDUs above MULPDU, up to the 16-bit
	 * ULPDU_Length. 0: MULPDU from the TCP EMSS (RFC 5044 4.5). */
	uint8_t large_fpdus;
	uint8_t reserved[2];
	uint32_t tx_marker_grid_offset; /* 0 */
	uint32_t rx_marker_grid_offset; /* 0 */
	uint32_t ird;                   /* inbound RDMA Read Requests served at once */
	uint32_t ord;                   /* outbound RDMA Read Requests outstanding */
	uint32_t max_ulpdu;             /* 0: derive MULPDU from the TCP EMSS (RFC 5044 4.5) */
	/* wait_first_fpdu or SIWX_RTR_ROLE_AWAIT: give up after this long
	 * without the first FPDU (RFC 5044 7.1.2 rule 10); 0: no limit. */
	uint32_t first_fpdu_timeout_ms;
};

/* What the provider reports about a bound stream, once per stream. */
enum siwx_stream_event {
	SIWX_STREAM_EVENT_CLOSED = 1, /* orderly close: FIN both ways, or after a local disconnect */
	SIWX_STREAM_EVENT_ERROR = 2,  /* RST, socket error, Terminate sent or received, QP destroyed */
};

struct siwx_stream_notify {
	/* `event` is enum siwx_stream_event; `error` an errno value or 0. */
	void (*event)(uint64_t cookie, int event, int error);
	uint64_t cookie;
};

/* Binds the connected, MPA-negotiated TCP socket `fd` to `qp` and moves the
 * QP to RTS. The QP is in INIT, or already in RTR or RTS when the
 * application moved its own QP with rdma_init_qp_attr() before
 * rdma_accept()/rdma_establish() (rping -q). `params->size` tells which
 * fields the caller knows; unknown
 * trailing fields are taken as 0. On 0 the QP owns `fd` (it closes it);
 * otherwise the caller still owns it. Errors: EINVAL (not a siwx RC QP,
 * parameters out of range, QP in ERROR), EBUSY (a stream is already bound),
 * ENOMEM. `notify` may be NULL; it is copied. */
int siwx_qp_bind_stream(struct ibv_qp *qp, int fd, const struct siwx_stream_params *params,
			const struct siwx_stream_notify *notify);

/* siwx_qp_bind_stream() for the QP numbered `qp_num` on `context`. By
 * number, so that a caller racing the application's ibv_destroy_qp never
 * touches a freed QP: the provider finds the QP under the lock its destroy
 * takes, and a QP destroyed meanwhile is ENOENT (the caller keeps `fd`).
 * The connection manager uses only this form. */
int siwx_qp_bind_stream_num(struct ibv_context *context, uint32_t qp_num, int fd,
			    const struct siwx_stream_params *params,
			    const struct siwx_stream_notify *notify);

/* rdma_disconnect() for a bound QP: with abortive = 0, finish what is queued,
 * send FIN and move to CLOSING (the iWARP meaning of IBV_QPS_SQD); with
 * abortive = 1, reset the connection (RST) and move to ERROR. The notify
 * callback reports the end. 0, EINVAL (no stream bound). */
int siwx_qp_disconnect_stream(struct ibv_qp *qp, int abortive);
/* The same by number, as siwx_qp_bind_stream_num(): ENOENT when the QP is
 * gone (and with it the stream). */
int siwx_qp_disconnect_stream_num(struct ibv_context *context, uint32_t qp_num, int abortive);

/* How many successful completions of the QP numbered `qp_num` on `context`
 * its CQs still hold, not yet polled, in `*count`. By number, so that a
 * caller racing the application's ibv_destroy_qp never touches a freed QP. The CM holds a peer's disconnect back while there are
 * any: an application that polls its CQ empty before it reads the event
 * channel (libfabric's ofi_rxm) would otherwise see the peer's last message
 * arrive behind RDMA_CM_EVENT_DISCONNECTED and lose it when it destroys the
 * QP. 0, EINVAL (not a siwx context, count NULL), ENOENT (no such QP). */
int siwx_qp_unpolled_completions(struct ibv_context *context, uint32_t qp_num, uint32_t *count);
/* The siwx QP with this number on `context`, for rdma_accept() and
 * rdma_establish() with a QP the application created itself
 * (rdma_conn_param.qp_num). NULL with errno ENOENT or EINVAL. */
struct ibv_qp *siwx_qp_lookup(struct ibv_context *context, uint32_t qp_num);

/* SIWX_TRACE: records `length` octets the CM moved on the connected TCP
 * socket `fd` (direction 0: sent, 1: received) in the process's wire trace,
 * so the MPA startup frames appear in front of the QP's FPDUs. Does nothing
 * when SIWX_TRACE is unset. */
void siwx_trace_stream_io(int fd, int direction, const void *data, size_t length);

/* Function pointer types for dlsym() users. */
typedef int (*siwx_qp_bind_stream_fn)(struct ibv_qp *, int, const struct siwx_stream_params *,
				      const struct siwx_stream_notify *);
typedef int (*siwx_qp_disconnect_stream_fn)(struct ibv_qp *, int);
typedef int (*siwx_qp_bind_stream_num_fn)(struct ibv_context *, uint32_t, int,
					  const struct siwx_stream_params *,
					  const struct siwx_stream_notify *);
typedef int (*siwx_qp_disconnect_stream_num_fn)(struct ibv_context *, uint32_t, int);
typedef struct ibv_qp *(*siwx_qp_lookup_fn)(struct ibv_context *, uint32_t);
typedef int (*siwx_qp_unpolled_completions_fn)(struct ibv_context *, uint32_t, uint32_t *);
typedef void (*siwx_trace_stream_io_fn)(int, int, const void *, size_t);

#ifdef __cplusplus
}
#endif

#endif /* SIWXDV_H_ */
