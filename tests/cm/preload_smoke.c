/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* A C program built against stock librdmacm (-lrdmacm), run with
 * LD_PRELOAD=librdmacm-siwx.so: checks that the preloaded definitions bind
 * the application's versioned references (RDMACM_1.0 / RDMACM_1.2) and that
 * a loopback connection with private data works through them. Without the
 * preload, stock librdmacm fails at rdma_create_event_channel on a host
 * without RDMA kernel support, and on any host the siwx_cm_* probe fails.
 *
 * Exit status 0 on success; otherwise the failing step is printed. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what)
{
	fprintf(stderr, "preload_smoke: %s failed (errno %d)\n", what, errno);
	return 1;
}

/* Next event of the expected type, within two seconds; acked. */
static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
		  struct rdma_cm_id **id, char *pd, size_t pd_size)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, 2000) != 1)
		return fail(rdma_event_str(type));
	if (rdma_get_cm_event(ch, &ev))
		return fail("rdma_get_cm_event");
	if (ev->event != type) {
		fprintf(stderr, "preload_smoke: got %s (status %d), wanted %s\n",
			rdma_event_str(ev->event), ev->status, rdma_event_str(type));
		rdma_ack_cm_event(ev);
		return 1;
	}
	if (id)
		*id = ev->id;
	if (pd) {
		size_t n = ev->param.conn.private_data_len;

		if (n >= pd_size)
			n = pd_size - 1;
		if (n)
			memcpy(pd, ev->param.conn.private_data, n);
		pd[n] = '\0';
	}
	return rdma_ack_cm_event(ev) ? fail("rdma_ack_cm_event") : 0;
}

int main(void)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id, *client, *server;
	struct rdma_conn_param param;
	struct sockaddr_in addr;
	char pd[64];
	void *probe;

	/* Only librdmacm-siwx.so has this symbol. */
	probe = dlsym(RTLD_DEFAULT, "siwx_cm_connection_info");
	if (!probe) {
		fprintf(stderr, "preload_smoke: librdmacm-siwx.so is not preloaded\n");
		return 1;
	}
	ch = rdma_create_event_channel();
	if (!ch)
		return fail("rdma_create_event_channel");
	if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		return fail("rdma_create_id");
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&addr))
		return fail("rdma_bind_addr");
	if (rdma_listen(listen_id, 4))
		return fail("rdma_listen");
	addr.sin_port = rdma_get_src_port(listen_id);

	if (rdma_create_id(ch, &client, NULL, RDMA_PS_TCP))
		return fail("rdma_create_id (client)");
	if (rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL, 0))
		return fail("rdma_resolve_addr");
	if (rdma_resolve_route(client, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL, 0))
		return fail("rdma_resolve_route");
	memset(&param, 0, sizeof(param));
	param.private_data = "ping";
	param.private_data_len = 4;
	param.responder_resources = 1;
	param.initiator_depth = 1;
	if (rdma_connect(client, &param))
		return fail("rdma_connect");
	if (expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &server, pd, sizeof(pd)))
		return 1;
	if (strcmp(pd, "ping") != 0)
		return fail("CONNECT_REQUEST private data");
	param.private_data = "pong";
	if (rdma_accept(server, &param))
		return fail("rdma_accept");
	/* Two ESTABLISHED events, one per side; the client's carries "pong". */
	for (int i = 0; i < 2; ++i) {
		struct rdma_cm_id *who;

		if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, &who, pd, sizeof(pd)))
			return 1;
		if (who == client && strcmp(pd, "pong") != 0)
			return fail("ESTABLISHED private data");
	}
	if (rdma_disconnect(client))
		return fail("rdma_disconnect");
	if (expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0) ||
	    expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, NULL, 0))
		return 1;
	if (rdma_destroy_id(server) || rdma_destroy_id(client) || rdma_destroy_id(listen_id))
		return fail("rdma_destroy_id");
	rdma_destroy_event_channel(ch);
	printf("preload_smoke: ok\n");
	return 0;
}
