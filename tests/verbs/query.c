/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Device, port, GID and P_Key queries through the stock libibverbs API, and
 * the documented error returns for bad arguments. */
#define _GNU_SOURCE
#include "verbs_test.h"

#include <endian.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <net/if.h>
#include <unistd.h>

static void check_device_attr(const struct ibv_device_attr *a, __be64 guid)
{
	CHECK(strcmp(a->fw_ver, "siwx 0.1") == 0);
	CHECK_EQ_U64(a->node_guid, guid);
	CHECK_EQ_U64(a->max_mr_size, UINT64_MAX);
	CHECK_EQ_U64(a->page_size_cap, (uint64_t)sysconf(_SC_PAGESIZE));
	CHECK_EQ(a->vendor_id, 0x737778);
	CHECK_EQ(a->vendor_part_id, 1);
	CHECK_EQ(a->hw_ver, 0);
	CHECK_EQ(a->max_qp, 65536);
	CHECK_EQ(a->max_qp_wr, 1048576);
	/* No MEM_MGT_EXTENSIONS: no fast-register MRs or memory windows. */
	CHECK_EQ(a->device_cap_flags, IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT);
	CHECK_EQ(a->max_sge, 16);
	CHECK_EQ(a->max_sge_rd, 1);
	CHECK_EQ(a->max_cq, 65536);
	CHECK_EQ(a->max_cqe, 1048576);
	CHECK_EQ(a->max_mr, 1048576);
	CHECK_EQ(a->max_pd, 65536);
	CHECK_EQ(a->max_qp_rd_atom, 128);
	CHECK_EQ(a->max_qp_init_rd_atom, 128);
	CHECK_EQ(a->max_res_rd_atom, 65536 * 128);
	CHECK_EQ(a->atomic_cap, IBV_ATOMIC_NONE);
	CHECK_EQ(a->max_mw, 0);
	CHECK_EQ(a->max_ah, 0);
	CHECK_EQ(a->max_srq, 65536);
	CHECK_EQ(a->max_srq_wr, 1048576);
	CHECK_EQ(a->max_srq_sge, 16);
	CHECK_EQ(a->max_pkeys, 1);
	CHECK_EQ(a->phys_port_cnt, 1);
}

/* GID 0 of an interface with an IPv4 address names this process's
 * out-of-band listener (docs/out-of-band-connect.md): subnet prefix zero,
 * octets 8..9 the listener's TCP port (not zero), 10..11 ff ff, 12..15 the
 * address; the port is only known from the GID itself, so *port_octets
 * says where it is. Otherwise: subnet prefix zero, interface id = EUI-64 of
 * the MAC (universal/local bit inverted, ff:fe inserted), or the node GUID
 * without a MAC. */
static void expected_gid(const char *ifname, __be64 node_guid, union ibv_gid *gid,
			 int *port_octets)
{
	uint8_t mac[6];
	struct ifaddrs *list = NULL;

	memset(gid, 0, sizeof(*gid));
	*port_octets = 0;
	CHECK_EQ(getifaddrs(&list), 0);
	for (struct ifaddrs *a = list; a != NULL; a = a->ifa_next) {
		if (a->ifa_addr == NULL || a->ifa_addr->sa_family != AF_INET ||
		    strcmp(a->ifa_name, ifname) != 0)
			continue;
		struct sockaddr_in in;
		memcpy(&in, a->ifa_addr, sizeof(in));
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &in.sin_addr.s_addr, 4);
		*port_octets = 1;
		break;
	}
	freeifaddrs(list);
	if (*port_octets)
		return;
	CHECK_EQ(interface_mac(ifname, mac), 0);
	if (memcmp(mac, "\0\0\0\0\0\0", 6) == 0) {
		memcpy(&gid->raw[8], &node_guid, 8);
		return;
	}
	const uint8_t eui64[8] = {mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]};
	memcpy(&gid->raw[8], eui64, 8);
}

static void check_port_and_gids(const char *ifname, void *arg)
{
	(void)arg;
	struct ibv_context *ctx = open_siwx(ifname);
	__be64 guid = ibv_get_device_guid(ctx->device);
	union ibv_gid want;
	int port_octets;

	expected_gid(ifname, guid, &want, &port_octets);

	struct ibv_port_attr port;
	memset(&port, 0xAB, sizeof(port));
	CHECK_EQ(ibv_query_port(ctx, 1, &port), 0);
	CHECK_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK_EQ(port.gid_tbl_len, 1);
	CHECK_EQ(port.pkey_tbl_len, 1);
	CHECK_EQ(port.max_msg_sz, 0xffffffffu);
	CHECK_EQ(port.port_cap_flags, IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP);
	CHECK_EQ(port.lid, 0);
	CHECK_EQ(port.sm_lid, 0);
	CHECK_EQ(port.lmc, 0);
	CHECK(port.active_mtu >= IBV_MTU_256 && port.active_mtu <= IBV_MTU_4096);
	CHECK_EQ(port.max_mtu, port.active_mtu);
	if (port.state == IBV_PORT_ACTIVE)
		CHECK_EQ(port.phys_state, 5); /* LinkUp */
	else
		CHECK_EQ(port.state, IBV_PORT_DOWN);

	union ibv_gid gid;
	memset(&gid, 0xAB, sizeof(gid));
	CHECK_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
	if (port_octets) {
		CHECK(gid.raw[8] != 0 || gid.raw[9] != 0);
		want.raw[8] = gid.raw[8];
		want.raw[9] = gid.raw[9];
	}
	CHECK(memcmp(&gid, &want, sizeof(gid)) == 0);
	/* One listener per device and process: a second context sees the same. */
	struct ibv_context *other = open_siwx(ifname);
	union ibv_gid again;
	CHECK_EQ(ibv_query_gid(other, 1, 0, &again), 0);
	CHECK(memcmp(&again, &gid, sizeof(gid)) == 0);
	CHECK_EQ(ibv_close_device(other), 0);

	struct ibv_gid_entry entry;
	memset(&entry, 0xAB, sizeof(entry));
	CHECK_EQ(ibv_query_gid_ex(ctx, 1, 0, &entry, 0), 0);
	CHECK(memcmp(&entry.gid, &want, sizeof(want)) == 0);
	CHECK_EQ(entry.gid_index, 0);
	CHECK_EQ(entry.port_num, 1);
	CHECK_EQ(entry.gid_type, IBV_GID_TYPE_IB);
	CHECK_EQ(entry.ndev_ifindex, if_nametoindex(ifname));

	struct ibv_gid_entry table[4];
	memset(table, 0xAB, sizeof(table));
	CHECK_EQ(ibv_query_gid_table(ctx, table, 4, 0), 1);
	CHECK(memcmp(&table[0], &entry, sizeof(entry)) == 0);
	CHECK_EQ(ibv_query_gid_table(ctx, table, 1, 0), 1);

	CHECK_EQ(ibv_close_device(ctx), 0);
}

int main(void)
{
	struct ibv_context *ctx = open_siwx("lo");
	__be64 guid = ibv_get_device_guid(ctx->device);

	/* ibv_query_device: the limits, exactly. */
	struct ibv_device_attr attr;
	memset(&attr, 0xAB, sizeof(attr));
	CHECK_EQ(ibv_query_device(ctx, &attr), 0);
	check_device_attr(&attr, guid);
	/* Loopback has no MAC: the system image GUID is the node GUID. */
	CHECK_EQ_U64(attr.sys_image_guid, guid);
	const uint8_t lo_guid[8] = {'s', 'i', 'w', 'x', '_', 'l', 0, 0};
	CHECK(memcmp(&guid, lo_guid, 8) == 0);

	/* ibv_query_device_ex: same limits plus the extended part. */
	struct ibv_device_attr_ex attr_ex;
	memset(&attr_ex, 0xAB, sizeof(attr_ex));
	CHECK_EQ(ibv_query_device_ex(ctx, NULL, &attr_ex), 0);
	check_device_attr(&attr_ex.orig_attr, guid);
	CHECK_EQ(attr_ex.comp_mask, 0);
	CHECK_EQ_U64(attr_ex.device_cap_flags_ex, attr.device_cap_flags);
	CHECK_EQ(attr_ex.phys_port_cnt_ex, 1);
	CHECK_EQ(attr_ex.odp_caps.general_caps, 0);
	CHECK_EQ(attr_ex.max_dm_size, 0);
	struct ibv_query_device_ex_input input = {.comp_mask = 0};
	CHECK_EQ(ibv_query_device_ex(ctx, &input, &attr_ex), 0);
	input.comp_mask = 1; /* no input option is defined */
	CHECK_EQ(ibv_query_device_ex(ctx, &input, &attr_ex), EINVAL);

	/* The provider honours the caller's struct size: exactly
	 * ibv_device_attr (what ibv_query_device passes) leaves the rest alone,
	 * less is EINVAL, more is zero-filled. */
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	CHECK(vctx != NULL && vctx->query_device_ex != NULL);
	unsigned char buffer[sizeof(struct ibv_device_attr_ex) + 64];
	memset(buffer, 0xAB, sizeof(buffer));
	CHECK_EQ(vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)buffer,
				       sizeof(struct ibv_device_attr)), 0);
	check_device_attr((struct ibv_device_attr *)buffer, guid);
	for (size_t i = sizeof(struct ibv_device_attr); i < sizeof(buffer); i++)
		CHECK_EQ(buffer[i], 0xAB);
	CHECK_EQ(vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)buffer,
				       sizeof(struct ibv_device_attr) - 1), EINVAL);
	memset(buffer, 0xAB, sizeof(buffer));
	CHECK_EQ(vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)buffer,
				       sizeof(buffer)), 0);
	for (size_t i = sizeof(struct ibv_device_attr_ex); i < sizeof(buffer); i++)
		CHECK_EQ(buffer[i], 0);

	/* Loopback is always up: port ACTIVE, largest IB MTU for a 64 KiB MTU. */
	struct ibv_port_attr port;
	CHECK_EQ(ibv_query_port(ctx, 1, &port), 0);
	CHECK_EQ(port.state, IBV_PORT_ACTIVE);
	CHECK_EQ(port.phys_state, 5);

	/* One port: 0 and 2 do not exist. */
	CHECK_EQ(ibv_query_port(ctx, 0, &port), EINVAL);
	CHECK_EQ(ibv_query_port(ctx, 2, &port), EINVAL);

	/* GID errors: index outside the one-entry table, bad port, flags. */
	union ibv_gid gid;
	errno = 0;
	CHECK_EQ(ibv_query_gid(ctx, 1, 1, &gid), -1);
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK_EQ(ibv_query_gid(ctx, 1, -1, &gid), -1);
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK_EQ(ibv_query_gid(ctx, 2, 0, &gid), -1);
	CHECK_EQ(errno, EINVAL);
	struct ibv_gid_entry entry;
	CHECK_EQ(ibv_query_gid_ex(ctx, 1, 1, &entry, 0), EINVAL);
	CHECK_EQ(ibv_query_gid_ex(ctx, 0, 0, &entry, 0), EINVAL);
	CHECK_EQ(ibv_query_gid_ex(ctx, 1, 0, &entry, 1), EINVAL);
	struct ibv_gid_entry table[2];
	CHECK_EQ(ibv_query_gid_table(ctx, table, 2, 1), -EINVAL);
	/* One valid entry does not fit into zero slots. */
	CHECK_EQ(ibv_query_gid_table(ctx, table, 0, 0), -EINVAL);

	/* P_Key table: one entry, the default partition 0xFFFF. */
	__be16 pkey = 0;
	CHECK_EQ(ibv_query_pkey(ctx, 1, 0, &pkey), 0);
	CHECK_EQ(pkey, htobe16(0xFFFF));
	errno = 0;
	CHECK_EQ(ibv_query_pkey(ctx, 1, 1, &pkey), -1);
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK_EQ(ibv_query_pkey(ctx, 2, 0, &pkey), -1);
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK_EQ(ibv_query_pkey(ctx, 1, -1, &pkey), -1);
	CHECK_EQ(errno, EINVAL);
	CHECK_EQ(ibv_get_pkey_index(ctx, 1, htobe16(0xFFFF)), 0);
	CHECK_EQ(ibv_get_pkey_index(ctx, 1, htobe16(0x7FFF)), -1);

	/* Not offered: the dummies of libibverbs answer. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	CHECK_NULL_ERRNO(ibv_alloc_mw(pd, IBV_MW_TYPE_1), EOPNOTSUPP);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);

	CHECK_EQ(ibv_close_device(ctx), 0);

	/* Port, GID table and GID of every device. */
	CHECK(for_each_addressed_interface(check_port_and_gids, NULL) >= 1);
	printf("query: ok\n");
	return 0;
}
