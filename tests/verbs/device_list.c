/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* Device discovery through the stock libibverbs API: one siwx_<ifname> per
 * interface with an address, RNIC/iWARP, GUIDs from the MAC, reference
 * counting across ibv_get_device_list / ibv_free_device_list / open / close. */
#include "verbs_test.h"

#include <endian.h>

struct list_check {
	struct ibv_device **list;
	int checked;
};

static void check_device_of(const char *ifname, void *arg)
{
	struct list_check *check = arg;
	struct ibv_device *device = find_siwx_device(check->list, ifname);
	char want_name[64];

	if (device == NULL) {
		fprintf(stderr, "interface %s has an address but no device siwx_%s\n", ifname,
			ifname);
		exit(1);
	}
	snprintf(want_name, sizeof(want_name), "siwx_%s", ifname);
	CHECK(strcmp(ibv_get_device_name(device), want_name) == 0);
	CHECK(strcmp(device->name, want_name) == 0);
	CHECK_EQ(device->node_type, IBV_NODE_RNIC);
	CHECK_EQ(device->transport_type, IBV_TRANSPORT_IWARP);
	CHECK(strcmp(ibv_node_type_str(device->node_type), "iWARP NIC") == 0);
	/* No kernel device, so no kernel index. */
	CHECK_EQ(ibv_get_device_index(device), -1);

	/* Node GUID: MAC in octets 0..5, or the first six name characters. */
	uint8_t mac[6];
	uint8_t want_guid[8] = {0};
	CHECK_EQ(interface_mac(ifname, mac), 0);
	if (memcmp(mac, "\0\0\0\0\0\0", 6) != 0)
		memcpy(want_guid, mac, 6);
	else
		memcpy(want_guid, want_name, strlen(want_name) < 6 ? strlen(want_name) : 6);
	__be64 guid = ibv_get_device_guid(device);
	CHECK(memcmp(&guid, want_guid, 8) == 0);

	/* The device opens and answers. */
	struct ibv_context *context = ibv_open_device(device);
	CHECK(context != NULL);
	CHECK(context->device == device);
	struct ibv_device_attr attr;
	CHECK_EQ(ibv_query_device(context, &attr), 0);
	CHECK_EQ_U64(attr.node_guid, guid);
	CHECK_EQ(attr.phys_port_cnt, 1);
	CHECK_EQ(ibv_close_device(context), 0);
	check->checked++;
}

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);

	CHECK(list != NULL);
	CHECK(num >= 1);
	CHECK(list[num] == NULL);
	for (int i = 0; i < num; i++)
		CHECK(list[i] != NULL);
	/* Without the argument the list is the same. */
	struct ibv_device **again = ibv_get_device_list(NULL);
	CHECK(again != NULL);
	for (int i = 0; i < num; i++)
		CHECK(again[i] == list[i]);
	CHECK(again[num] == NULL);
	ibv_free_device_list(again);

	/* siwx_lo exists on every host. */
	CHECK(find_siwx_device(list, "lo") != NULL);

	struct list_check check = {list, 0};
	int interfaces = for_each_addressed_interface(check_device_of, &check);
	CHECK(interfaces >= 1);
	CHECK_EQ(check.checked, interfaces);

	/* Every siwx device in the list belongs to an interface with an address. */
	int siwx_devices = 0;
	for (int i = 0; i < num; i++)
		if (strncmp(ibv_get_device_name(list[i]), "siwx_", 5) == 0)
			siwx_devices++;
	CHECK_EQ(siwx_devices, interfaces);

	/* An opened device stays usable after the list is freed. */
	struct ibv_context *context = ibv_open_device(find_siwx_device(list, "lo"));
	CHECK(context != NULL);
	ibv_free_device_list(list);
	struct ibv_port_attr port;
	CHECK_EQ(ibv_query_port(context, 1, &port), 0);
	CHECK_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
	/* Two contexts of one device at once. */
	struct ibv_context *second = open_siwx("lo");
	CHECK(second != context);
	CHECK(second->device == context->device);
	CHECK_EQ(ibv_close_device(second), 0);
	CHECK_EQ(ibv_close_device(context), 0);

	/* Open and close many times: references and descriptors do not leak. */
	for (int i = 0; i < 200; i++) {
		struct ibv_context *c = open_siwx("lo");
		CHECK(c->async_fd >= 0);
		CHECK_EQ(ibv_close_device(c), 0);
	}
	printf("device_list: %d siwx devices checked\n", interfaces);
	return 0;
}
