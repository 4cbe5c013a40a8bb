/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
#define _GNU_SOURCE
#include "verbs_test.h"

#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>

struct ibv_device *find_siwx_device(struct ibv_device **list, const char *ifname)
{
	char name[IBV_SYSFS_NAME_MAX];

	snprintf(name, sizeof(name), "siwx_%s", ifname);
	for (int i = 0; list[i] != NULL; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			return list[i];
	return NULL;
}

struct ibv_context *open_siwx(const char *ifname)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);

	CHECK(list != NULL);
	struct ibv_device *device = find_siwx_device(list, ifname);
	if (device == NULL) {
		fprintf(stderr, "no device siwx_%s: run this test under siwx-run\n", ifname);
		exit(1);
	}
	struct ibv_context *context = ibv_open_device(device);
	CHECK(context != NULL);
	ibv_free_device_list(list);
	return context;
}

int interface_mac(const char *ifname, uint8_t mac[6])
{
	struct ifaddrs *addrs;
	int found = -1;

	memset(mac, 0, 6);
	if (getifaddrs(&addrs) != 0)
		return -1;
	for (struct ifaddrs *a = addrs; a != NULL; a = a->ifa_next) {
		if (a->ifa_addr == NULL || a->ifa_addr->sa_family != AF_PACKET ||
		    strcmp(a->ifa_name, ifname) != 0)
			continue;
		struct sockaddr_ll ll;
		memcpy(&ll, a->ifa_addr, sizeof(ll));
		/* Only Ethernet-style addresses become a device's MAC. */
		if (ll.sll_hatype == 1 /* ARPHRD_ETHER */ && ll.sll_halen == 6)
			memcpy(mac, ll.sll_addr, 6);
		found = 0;
	}
	freeifaddrs(addrs);
	return found;
}

int for_each_addressed_interface(void (*fn)(const char *ifname, void *arg), void *arg)
{
	struct ifaddrs *addrs;
	char seen[64][IF_NAMESIZE];
	int count = 0;

	CHECK(getifaddrs(&addrs) == 0);
	for (struct ifaddrs *a = addrs; a != NULL; a = a->ifa_next) {
		if (a->ifa_addr == NULL ||
		    (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6))
			continue;
		if (strlen(a->ifa_name) >= IF_NAMESIZE)
			continue;
		int dup = 0;
		for (int i = 0; i < count; i++)
			if (strcmp(seen[i], a->ifa_name) == 0)
				dup = 1;
		if (dup || count == 64)
			continue;
		snprintf(seen[count], IF_NAMESIZE, "%s", a->ifa_name);
		count++;
	}
	freeifaddrs(addrs);
	for (int i = 0; i < count; i++)
		fn(seen[i], arg);
	return count;
}
