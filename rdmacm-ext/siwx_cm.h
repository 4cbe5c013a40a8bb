// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* siwx_cm.h: what librdmacm-siwx.so adds to the rdma_cm API.
 *
 * librdmacm-siwx.so replaces librdmacm for siwx (LD_PRELOAD, see
 * rdmacm-ext/README.md). These extra functions let tools and tests see and
 * steer the MPA startup of each connection (RFC 5044 7.1, the Rtr/S-bit
 * proposal, RFC 6581). Version node SIWX_CM_1.0.
 *
 * Return convention: 0, or -1 with errno set (as the rdma_* functions). */
#ifndef SIWX_CM_H_
#define SIWX_CM_H_

#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <stdint.h>

#include "providers/siwx/siwxdv.h"

#ifdef __cplusplus
extern "C" {
#endif

enum siwx_cm_policy {
	SIWX_CM_POLICY_ALLOW = 0,   /* off unless the peer asks */
	SIWX_CM_POLICY_REQUIRE = 1, /* ask for it */
	SIWX_CM_POLICY_REFUSE = 2,  /* refuse a peer that asks */
};

/* MPA options of one id; defaults come from the environment (SIWX_MPA_*,
 * SIWX_CM_CONNECT_TIMEOUT_MS). Ids created by a listener inherit its
 * options. */
struct siwx_cm_mpa_options {
	uint32_t size;            /* sizeof(struct siwx_cm_mpa_options) */
	uint32_t dialect;         /* enum siwx_mpa_dialect: offered (active) / highest accepted */
	uint32_t crc;             /* enum siwx_cm_policy */
	uint32_t markers;         /* enum siwx_cm_policy */
	uint32_t peer_to_peer;    /* active side: request the RFC 6581 peer-to-peer model */
	uint32_t rtr_mask;        /* SIWX_RTR_MASK_*: offered (active) / accepted (passive) */
	uint32_t connect_timeout_ms;
	uint32_t mpa_timeout_ms;
	/* 1 (not standard): offer (active) / accept (passive) FPDUs above
	 * MULPDU with Linux siw's L bit (0x0800 of the startup frame, an RFC
	 * 5044 reserved bit); 0 (the default, SIWX_MPA_LARGE_FPDUS unset):
	 * never. */
	uint32_t large_fpdus;
};

/* EINVAL: unknown id, bad size, a value out of range (an empty rtr_mask,
 * peer_to_peer without v2, a timeout outside 1..600000, large_fpdus other
 * than 0 or 1). Applies to
 * connections the id starts afterwards. */
int siwx_cm_get_mpa_options(struct rdma_cm_id *id, struct siwx_cm_mpa_options *options);
int siwx_cm_set_mpa_options(struct rdma_cm_id *id, const struct siwx_cm_mpa_options *options);

enum siwx_cm_role {
	SIWX_CM_ROLE_NONE = 0,
	SIWX_CM_ROLE_INITIATOR = 1, /* sent the MPA Request (rdma_connect) */
	SIWX_CM_ROLE_RESPONDER = 2, /* received it (an id from CONNECT_REQUEST) */
};

/* Why connection setup failed (siwx_cm_conn_info.failure_code). The MPA
 * startup failures follow RFC 5044 7.1.2 and RFC 6581 8-10. */
enum siwx_cm_failure {
	SIWX_CM_FAILURE_NONE = 0,
	SIWX_CM_FAILURE_TCP_CONNECT = 1,      /* the TCP connect failed or timed out */
	SIWX_CM_FAILURE_REJECTED = 2,         /* the peer sent a Reply with R = 1 */
	SIWX_CM_FAILURE_BAD_KEY = 3,          /* not an MPA frame (rule 5) */
	SIWX_CM_FAILURE_BAD_REVISION = 4,     /* Rev 0, 3 or more */
	SIWX_CM_FAILURE_PRIVATE_DATA_TOO_LONG = 5, /* PD_Length over 512 (rule 9) */
	SIWX_CM_FAILURE_MISSING_IRD_ORD = 6,  /* Rev 2 + S without the IRD/ORD word */
	SIWX_CM_FAILURE_INITIATOR_INITIATOR = 7, /* a Request where a Reply belongs (rule 8) */
	SIWX_CM_FAILURE_UNEXPECTED_FRAME = 8, /* a valid frame of the wrong kind */
	SIWX_CM_FAILURE_REVISION_MISMATCH = 9, /* Reply revision above the Request's */
	SIWX_CM_FAILURE_ENHANCED_MISMATCH = 10, /* unenhanced Reply to an enhanced Request */
	SIWX_CM_FAILURE_RTR_CRC_MISMATCH = 11, /* Rtr frame C differs from the Reply's */
	SIWX_CM_FAILURE_CRC_REFUSED = 12,     /* the peer set C; local policy refuses CRC */
	SIWX_CM_FAILURE_MARKERS_REFUSED = 13, /* the peer set M; local policy refuses markers */
	SIWX_CM_FAILURE_INSUFFICIENT_IRD = 14, /* RFC 6581 9.1 (Terminate code 6) */
	SIWX_CM_FAILURE_NO_MATCHING_RTR = 15, /* RFC 6581 9.2 (Terminate code 7) */
	SIWX_CM_FAILURE_TIMEOUT = 16,         /* a startup frame did not come in time (rule 10) */
	SIWX_CM_FAILURE_CONNECTION_CLOSED = 17, /* FIN or RST during startup */
	SIWX_CM_FAILURE_ENHANCED_UNSUPPORTED = 18, /* enhanced Request to a Responder below v2 */
	SIWX_CM_FAILURE_HANDOVER = 19,        /* the QP refused the stream */
};

/* What MPA negotiated for the connection of an id, and how startup ended. */
struct siwx_cm_conn_info {
	uint32_t size;            /* sizeof(struct siwx_cm_conn_info) */
	uint32_t role;            /* enum siwx_cm_role */
	uint32_t dialect;         /* enum siwx_mpa_dialect; 0 until MPA completes */
	uint32_t mpa_revision;    /* Rev of the Reply */
	uint32_t crc;
	uint32_t tx_markers;
	uint32_t rx_markers;
	uint32_t ird;             /* negotiated inbound RDMA Read depth */
	uint32_t ord;             /* negotiated outbound RDMA Read depth */
	uint32_t ird_ord_exchanged; /* RFC 6581 IRD/ORD word exchanged */
	uint32_t peer_ird_ord_valid;
	uint32_t peer_ird;        /* the peer's word as received (RFC 6581 9.1) */
	uint32_t peer_ord;
	uint32_t peer_to_peer;    /* RFC 6581 peer-to-peer model agreed */
	uint32_t rtr_role;        /* enum siwx_rtr_role */
	uint32_t rtr_message;     /* enum siwx_rtr_message, with SIWX_RTR_ROLE_SEND */
	uint32_t rtr_mask;        /* RTR types of the Reply (SIWX_RTR_MASK_*) */
	uint32_t stream_bound;    /* 1: the socket went to the QP; 0: the CM holds it */
	uint32_t peer_private_data_len; /* full length; events carry at most 255 octets */
	uint32_t mpa_error;       /* RFC 5044 8 / RFC 6581 8 code of a failed startup, else 0 */
	int32_t status;           /* status of the last connection event, 0 or -errno */
	uint32_t failure_code;    /* enum siwx_cm_failure */
	char failure[160];        /* why, in words (for logs; the wording may change) */
	/* Both startup frames carried L: FPDUs above MULPDU both ways. */
	uint32_t large_fpdus;
};

/* ENOTCONN: the id never started a connection. */
int siwx_cm_connection_info(struct rdma_cm_id *id, struct siwx_cm_conn_info *info);

/* Copies up to `len` octets of the peer's private data (all of it, up to
 * 512 octets, also beyond what the event could carry) and returns its full
 * length, or -1 with errno (EINVAL, ENOTCONN). */
int siwx_cm_peer_private_data(struct rdma_cm_id *id, void *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* SIWX_CM_H_ */
