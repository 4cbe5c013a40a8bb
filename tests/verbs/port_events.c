/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Port state follows the link, with IBV_EVENT_PORT_ERR / IBV_EVENT_PORT_ACTIVE
 * on every open context, and the device list follows interface addresses.
 *
 * Runs inside a private network namespace prepared by check_port_events.sh:
 * a veth pair v0 (with an address) / v1 (its peer), and v2 without an
 * address. Taking v1 down drops v0's carrier. The program changes links with
 * ip(8), which the namespace lets it do. */
#define _GNU_SOURCE
#include "verbs_test.h"

#include <poll.h>

static void run(const char *command)
{
	int rc = system(command);
	if (rc != 0) {
		fprintf(stderr, "'%s' failed (%d)\n", command, rc);
		exit(1);
	}
}

/* Waits up to 10 s for one async event and checks it is a port event. */
static void expect_port_event(struct ibv_context *ctx, enum ibv_event_type type)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	CHECK_EQ(poll(&pfd, 1, 10000), 1);
	struct ibv_async_event event;
	CHECK_EQ(ibv_get_async_event(ctx, &event), 0);
	if (event.event_type != type) {
		fprintf(stderr, "want %s, got %s\n", ibv_event_type_str(type),
			ibv_event_type_str(event.event_type));
		exit(1);
	}
	CHECK_EQ(event.element.port_num, 1);
	ibv_ack_async_event(&event);
}

static void expect_no_event(struct ibv_context *ctx)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	CHECK_EQ(poll(&pfd, 1, 200), 0);
}

static enum ibv_port_state port_state(struct ibv_context *ctx)
{
	struct ibv_port_attr attr;
	CHECK_EQ(ibv_query_port(ctx, 1, &attr), 0);
	CHECK_EQ(attr.phys_state, attr.state == IBV_PORT_ACTIVE ? 5 : 3);
	return attr.state;
}

static int listed(const char *ifname)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list != NULL);
	int found = find_siwx_device(list, ifname) != NULL;
	ibv_free_device_list(list);
	return found;
}

int main(void)
{
	/* This process is already set up; ip(8) needs neither the shim nor a
	 * sanitizer runtime. */
	unsetenv("LD_PRELOAD");
	CHECK(listed("lo"));
	CHECK(listed("v0"));
	CHECK(!listed("v1")); /* no address */
	CHECK(!listed("v2")); /* no address */

	struct ibv_context *ctx = open_siwx("v0");
	struct ibv_context *second = open_siwx("v0");
	struct ibv_context *lo = open_siwx("lo");
	CHECK_EQ(port_state(ctx), IBV_PORT_ACTIVE);

	/* Carrier off: both contexts of siwx_v0 hear it, siwx_lo does not. */
	run("ip link set v1 down");
	expect_port_event(ctx, IBV_EVENT_PORT_ERR);
	expect_port_event(second, IBV_EVENT_PORT_ERR);
	CHECK_EQ(port_state(ctx), IBV_PORT_DOWN);
	CHECK_EQ(port_state(second), IBV_PORT_DOWN);
	expect_no_event(lo);
	CHECK_EQ(port_state(lo), IBV_PORT_ACTIVE);

	/* Carrier back. */
	run("ip link set v1 up");
	expect_port_event(ctx, IBV_EVENT_PORT_ACTIVE);
	expect_port_event(second, IBV_EVENT_PORT_ACTIVE);
	CHECK_EQ(port_state(ctx), IBV_PORT_ACTIVE);
	expect_no_event(ctx);

	/* A closed context gets nothing and breaks nothing. */
	CHECK_EQ(ibv_close_device(second), 0);
	run("ip link set v0 down");
	expect_port_event(ctx, IBV_EVENT_PORT_ERR);
	run("ip link set v0 up");
	expect_port_event(ctx, IBV_EVENT_PORT_ACTIVE);

	/* An interface that gains an address gets a device, with its MTU. */
	run("ip link set v2 mtu 2000 up && ip addr add 203.0.113.1/24 dev v2");
	CHECK(listed("v2"));
	struct ibv_context *v2 = open_siwx("v2");
	struct ibv_port_attr attr;
	CHECK_EQ(ibv_query_port(v2, 1, &attr), 0);
	CHECK_EQ(attr.active_mtu, IBV_MTU_1024); /* 2000 rounds down to 1024 */
	CHECK_EQ(ibv_close_device(v2), 0);

	/* An interface that goes away leaves the list; open contexts of its
	 * device see the port go down. */
	v2 = open_siwx("v2");
	run("ip link del v2");
	expect_port_event(v2, IBV_EVENT_PORT_ERR);
	CHECK_EQ(port_state(v2), IBV_PORT_DOWN);
	CHECK(!listed("v2"));
	CHECK_EQ(ibv_close_device(v2), 0);

	CHECK_EQ(ibv_close_device(lo), 0);
	CHECK_EQ(ibv_close_device(ctx), 0);
	printf("port_events: ok\n");
	return 0;
}
