// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// Our own declarations of the libibverbs private provider ABI, PABI 34, as
// rdma-core v37.0 to v56.x implement it.
//
// rdma-core does not install libibverbs/driver.h, so an out-of-tree provider
// has to declare the private structs itself. These are written from the
// layout facts in docs/provider-abi.md (sizes measured against v44 on
// x86-64, and what moves between rdma-core tags)
// and follow rdma-core's names so they can be checked against driver.h line
// by line. Only what siwx uses is declared; everything else stays opaque.
//
// What moves inside the supported range: only struct ibv_qp_ex (public,
// from the installed verbs.h) embedded in verbs_qp. CMake picks its size for
// the installed version (SIWX_IBV_QP_EX_SIZE) and the static_asserts below
// tie that choice to the header actually compiled against.
//
// What this header does not cover: the ibv_cmd_* kernel command layer (siwx
// never talks to a kernel), verbs_sysfs_dev (siwx devices have none) and the
// match tables (siwx claims no kernel device).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#ifndef SIWX_PABI_VERSION
#error "SIWX_PABI_VERSION must come from cmake/SiwxRdmaCore.cmake"
#endif
#ifndef SIWX_IBV_QP_EX_SIZE
#error "SIWX_IBV_QP_EX_SIZE must come from cmake/SiwxRdmaCore.cmake"
#endif
static_assert(SIWX_PABI_VERSION == 34, "these declarations are PABI 34 only");

namespace siwx::pabi {

// Opaque: never dereferenced by siwx.
struct verbs_sysfs_dev;
struct verbs_match_ent;
struct verbs_xrcd;

// ccan/list.h list_node.
struct list_node {
  list_node* next;
  list_node* prev;
};

// driver.h: how libibverbs matches, creates and opens devices of a provider.
struct verbs_device_ops {
  const char* name;
  std::uint32_t match_min_abi_version;
  std::uint32_t match_max_abi_version;
  const verbs_match_ent* match_table;
  const verbs_device_ops** static_providers;
  bool (*match_device)(verbs_sysfs_dev* sysfs_dev);
  verbs_context* (*alloc_context)(ibv_device* device, int cmd_fd, void* private_data);
  verbs_context* (*import_context)(ibv_device* device, int cmd_fd);
  struct verbs_device* (*alloc_device)(verbs_sysfs_dev* sysfs_dev);
  void (*uninit_device)(struct verbs_device* device);
};
static_assert(sizeof(verbs_device_ops) == 72);

// driver.h: the device object libibverbs hands to applications as ibv_device.
struct verbs_device {
  ibv_device device;  // must be first
  const verbs_device_ops* ops;
  std::atomic<int> refcount;  // C11 atomic_int
  list_node entry;            // libibverbs' device list; unused for siwx devices
  verbs_sysfs_dev* sysfs;     // NULL for siwx devices
  std::uint64_t core_support;
};
static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
static_assert(sizeof(ibv_device) == 664);
static_assert(offsetof(verbs_device, ops) == 664);
static_assert(offsetof(verbs_device, refcount) == 672);
static_assert(offsetof(verbs_device, entry) == 680);
static_assert(offsetof(verbs_device, sysfs) == 696);
static_assert(offsetof(verbs_device, core_support) == 704);
static_assert(sizeof(verbs_device) == 712);

// driver.h enum ibv_mr_type (values of verbs_mr::mr_type).
inline constexpr int kMrTypeMr = 0;

// driver.h: libibverbs reads mr_type and access in ibv_dereg_mr/ibv_rereg_mr.
struct verbs_mr {
  ibv_mr mr;  // driver.h names this member ibv_mr
  int mr_type;  // enum ibv_mr_type
  int access;
};
static_assert(sizeof(ibv_mr) == 48);
static_assert(offsetof(verbs_mr, mr_type) == 48);
static_assert(sizeof(verbs_mr) == 56);

struct verbs_cq {
  union {
    ibv_cq cq;
    ibv_cq_ex cq_ex;
  };
};
static_assert(sizeof(ibv_cq) == 128);
static_assert(sizeof(verbs_cq) == 288);

struct verbs_srq {
  ibv_srq srq;
  ibv_srq_type srq_type;
  verbs_xrcd* xrcd;
  ibv_cq* cq;
  std::uint32_t srq_num;
};
static_assert(sizeof(verbs_srq) == 160);

// verbs_qp::comp_mask bits.
inline constexpr std::uint32_t kVerbsQpXrcd = 1u << 0;
inline constexpr std::uint32_t kVerbsQpEx = 1u << 1;

// ibv_qp_to_qp_ex() tests comp_mask & kVerbsQpEx right after the ibv_qp_ex.
struct verbs_qp {
  union {
    ibv_qp qp;
    ibv_qp_ex qp_ex;
  };
  std::uint32_t comp_mask;
  verbs_xrcd* xrcd;
};
static_assert(sizeof(ibv_qp) == 160);
static_assert(sizeof(ibv_qp_ex) == SIWX_IBV_QP_EX_SIZE,
              "the installed verbs.h does not match the rdma-core version CMake detected");
static_assert(offsetof(verbs_qp, comp_mask) == SIWX_IBV_QP_EX_SIZE);

// Public verbs_context (verbs.h); libibverbs finds it from ibv_context by a
// fixed offset, so the provider's context must embed it unchanged.
static_assert(offsetof(verbs_context, context) == 320);
static_assert(sizeof(verbs_context) == 648);
static_assert(sizeof(ibv_context) == 328);

// driver.h: every op a provider may implement, alphabetical, 76 entries in
// all of v36.0..v56.x. NULL entries keep libibverbs' dummy (EOPNOTSUPP).
struct verbs_context_ops {
  int (*advise_mr)(ibv_pd* pd, ibv_advise_mr_advice advice, std::uint32_t flags,
                   ibv_sge* sg_list, std::uint32_t num_sges);
  ibv_dm* (*alloc_dm)(ibv_context* context, ibv_alloc_dm_attr* attr);
  ibv_mw* (*alloc_mw)(ibv_pd* pd, ibv_mw_type type);
  ibv_mr* (*alloc_null_mr)(ibv_pd* pd);
  ibv_pd* (*alloc_parent_domain)(ibv_context* context, ibv_parent_domain_init_attr* attr);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  ibv_td* (*alloc_td)(ibv_context* context, ibv_td_init_attr* init_attr);
  void (*async_event)(ibv_context* context, ibv_async_event* event);
  int (*attach_counters_point_flow)(ibv_counters* counters, ibv_counter_attach_attr* attr,
                                    ibv_flow* flow);
  int (*attach_mcast)(ibv_qp* qp, const ibv_gid* gid, std::uint16_t lid);
  int (*bind_mw)(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind);
  int (*close_xrcd)(ibv_xrcd* xrcd);
  void (*cq_event)(ibv_cq* cq);
  ibv_ah* (*create_ah)(ibv_pd* pd, ibv_ah_attr* attr);
  ibv_counters* (*create_counters)(ibv_context* context, ibv_counters_init_attr* init_attr);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, ibv_comp_channel* channel,
                       int comp_vector);
  ibv_cq_ex* (*create_cq_ex)(ibv_context* context, ibv_cq_init_attr_ex* init_attr);
  ibv_flow* (*create_flow)(ibv_qp* qp, ibv_flow_attr* flow_attr);
  ibv_flow_action* (*create_flow_action_esp)(ibv_context* context,
                                             ibv_flow_action_esp_attr* attr);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  ibv_qp* (*create_qp_ex)(ibv_context* context, ibv_qp_init_attr_ex* qp_init_attr_ex);
  ibv_rwq_ind_table* (*create_rwq_ind_table)(ibv_context* context,
                                             ibv_rwq_ind_table_init_attr* init_attr);
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* srq_init_attr);
  ibv_srq* (*create_srq_ex)(ibv_context* context, ibv_srq_init_attr_ex* srq_init_attr_ex);
  ibv_wq* (*create_wq)(ibv_context* context, ibv_wq_init_attr* wq_init_attr);
  int (*dealloc_mw)(ibv_mw* mw);
  int (*dealloc_pd)(ibv_pd* pd);
  int (*dealloc_td)(ibv_td* td);
  int (*dereg_mr)(verbs_mr* vmr);
  int (*destroy_ah)(ibv_ah* ah);
  int (*destroy_counters)(ibv_counters* counters);
  int (*destroy_cq)(ibv_cq* cq);
  int (*destroy_flow)(ibv_flow* flow);
  int (*destroy_flow_action)(ibv_flow_action* action);
  int (*destroy_qp)(ibv_qp* qp);
  int (*destroy_rwq_ind_table)(ibv_rwq_ind_table* rwq_ind_table);
  int (*destroy_srq)(ibv_srq* srq);
  int (*destroy_wq)(ibv_wq* wq);
  int (*detach_mcast)(ibv_qp* qp, const ibv_gid* gid, std::uint16_t lid);
  void (*free_context)(ibv_context* context);
  int (*free_dm)(ibv_dm* dm);
  int (*get_srq_num)(ibv_srq* srq, std::uint32_t* srq_num);
  ibv_dm* (*import_dm)(ibv_context* context, std::uint32_t dm_handle);
  ibv_mr* (*import_mr)(ibv_pd* pd, std::uint32_t mr_handle);
  ibv_pd* (*import_pd)(ibv_context* context, std::uint32_t pd_handle);
  int (*modify_cq)(ibv_cq* cq, ibv_modify_cq_attr* attr);
  int (*modify_flow_action_esp)(ibv_flow_action* action, ibv_flow_action_esp_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
  int (*modify_qp_rate_limit)(ibv_qp* qp, ibv_qp_rate_limit_attr* attr);
  int (*modify_srq)(ibv_srq* srq, ibv_srq_attr* srq_attr, int srq_attr_mask);
  int (*modify_wq)(ibv_wq* wq, ibv_wq_attr* wq_attr);
  ibv_qp* (*open_qp)(ibv_context* context, ibv_qp_open_attr* attr);
  ibv_xrcd* (*open_xrcd)(ibv_context* context, ibv_xrcd_init_attr* xrcd_init_attr);
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int (*post_srq_ops)(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad_op);
  int (*post_srq_recv)(ibv_srq* srq, ibv_recv_wr* recv_wr, ibv_recv_wr** bad_recv_wr);
  int (*query_device_ex)(ibv_context* context, const ibv_query_device_ex_input* input,
                         ibv_device_attr_ex* attr, std::size_t attr_size);
  int (*query_ece)(ibv_qp* qp, ibv_ece* ece);
  int (*query_port)(ibv_context* context, std::uint8_t port_num, ibv_port_attr* port_attr);
  int (*query_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr);
  int (*query_qp_data_in_order)(ibv_qp* qp, ibv_wr_opcode op, std::uint32_t flags);
  int (*query_rt_values)(ibv_context* context, ibv_values_ex* values);
  int (*query_srq)(ibv_srq* srq, ibv_srq_attr* srq_attr);
  int (*read_counters)(ibv_counters* counters, std::uint64_t* counters_value,
                       std::uint32_t ncounters, std::uint32_t flags);
  ibv_mr* (*reg_dm_mr)(ibv_pd* pd, ibv_dm* dm, std::uint64_t dm_offset, std::size_t length,
                       unsigned int access);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, std::uint64_t offset, std::size_t length,
                           std::uint64_t iova, int fd, int access);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t hca_va,
                    int access);
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only);
  int (*rereg_mr)(verbs_mr* vmr, int flags, ibv_pd* pd, void* addr, std::size_t length,
                  int access);
  int (*resize_cq)(ibv_cq* cq, int cqe);
  int (*set_ece)(ibv_qp* qp, ibv_ece* ece);
  void (*unimport_dm)(ibv_dm* dm);
  void (*unimport_mr)(ibv_mr* mr);
  void (*unimport_pd)(ibv_pd* pd);
};
static_assert(sizeof(verbs_context_ops) == 76 * sizeof(void*));

// IBVERBS_PRIVATE_34 functions siwx calls (exported by libibverbs.so.1).
extern "C" {
void verbs_register_driver_34(const verbs_device_ops* ops);
// calloc(alloc_size) and initialise the verbs_context found `context_offset`
// bytes in (passed as a pointer value, as rdma-core's macro does): takes a
// device reference, sets cmd_fd, async_fd = -1 and the dummy ops.
void* _verbs_init_and_alloc_context(ibv_device* device, int cmd_fd, std::size_t alloc_size,
                                    verbs_context* context_offset, std::uint32_t driver_id);
// Frees libibverbs' part, closes cmd_fd and async_fd, drops the device reference.
void verbs_uninit_context(verbs_context* context);
// Copies every non-NULL op into the context (callable more than once).
void verbs_set_ops(verbs_context* vctx, const verbs_context_ops* ops);
}

}  // namespace siwx::pabi
