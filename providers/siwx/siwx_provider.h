// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* The small API libsiwx-rdmav34.so exports for the kernel shim (the
 * "kernel" side of a kernel-less device: device discovery, completion
 * channels, GID/P_Key/GUID queries). Applications never call it; they use
 * libibverbs, which reaches the provider through its ops.
 *
 * Symbols carry the version node SIWX_PROVIDER_1.0 (libsiwx.map); everything
 * else in the provider is local. All functions are safe to call with objects
 * of other providers: the is_* tests say whether an object is ours, and the
 * other calls fail with EINVAL for foreign objects.
 *
 * Return conventions follow the kernel's: 0 or a positive errno value, or a
 * pointer / NULL with errno set. */
#ifndef SIWX_PROVIDER_H_
#define SIWX_PROVIDER_H_

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIWX_IFNAME_SIZE 16 /* IFNAMSIZ */

/* The network interface a device is attached to. */
struct siwx_port_desc {
	char ifname[SIWX_IFNAME_SIZE]; /* NUL-terminated */
	uint32_t ifindex;
	uint8_t mac[6];   /* all zero when the link has no hardware address */
	uint32_t mtu;     /* octets */
	int link_up;      /* operationally up: the port is ACTIVE, else DOWN */
};

/* Creates the device siwx_<ifname> (node type RNIC, transport iWARP, one
 * port) with one reference that the caller keeps for good; siwx devices are
 * never freed. NULL with errno EINVAL (empty or too long name) or ENOMEM. */
struct ibv_device *siwx_create_device(const struct siwx_port_desc *port);

/* Replaces the port's interface data. When link_up changes, every open
 * context of the device gets IBV_EVENT_PORT_ACTIVE or IBV_EVENT_PORT_ERR.
 * 0, or EINVAL for a device that is not a siwx device. */
int siwx_update_device(struct ibv_device *device, const struct siwx_port_desc *port);

/* Takes one more reference, as libibverbs does for every entry of the array
 * ibv_get_device_list() returns (ibv_free_device_list() drops it). */
void siwx_device_hold(struct ibv_device *device);

int siwx_is_siwx_device(const struct ibv_device *device);
int siwx_is_siwx_context(const struct ibv_context *context);

/* ibv_create_comp_channel() for a siwx context: NULL with errno EINVAL
 * (not a siwx context), ENOMEM, or EMFILE/ENFILE (no descriptors left). */
struct ibv_comp_channel *siwx_create_comp_channel(struct ibv_context *context);
/* ibv_destroy_comp_channel(): 0, EBUSY while CQs use it, EINVAL if it is not
 * a siwx channel. */
int siwx_destroy_comp_channel(struct ibv_comp_channel *channel);

/* One GID table entry, all fields of struct ibv_gid_entry: 0, EINVAL (bad
 * port or index), or ENODATA (an empty entry; siwx entries are never empty
 * today, see identity.h). */
int siwx_query_gid_entry(struct ibv_context *context, uint32_t port_num, uint32_t index,
			 struct ibv_gid_entry *entry);
/* GID table length of the port (0 for a bad port). */
int siwx_gid_table_len(struct ibv_context *context, uint32_t port_num);
/* P_Key table entry (network order): 0 or EINVAL. */
int siwx_query_pkey(struct ibv_context *context, uint32_t port_num, int index, __be16 *pkey);
/* Node GUID in network order (0 for a foreign device). */
__be64 siwx_device_guid(struct ibv_device *device);

#ifdef __cplusplus
}
#endif

#endif /* SIWX_PROVIDER_H_ */
