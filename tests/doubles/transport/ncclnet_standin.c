/* A stand-in for NCCL's network layer, for the transport probes' tests: functions under the
 * mangled names NCCL 2.32.3 gives its InfiniBand and socket transports (`ncclIbIsend`, …), with
 * their parameter lists. Connect and accept follow NCCL's state machine: the first call sets
 * up a queue pair through libibverbs (found with dlvsym at IBVERBS_1.1, as NCCL does) and
 * returns no comm yet; a later call returns it. Nothing is sent. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

typedef struct ibv_qp *(*create_qp_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef int (*modify_qp_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
static create_qp_fn create_qp;
static modify_qp_fn modify_qp;

struct comm {
  struct ibv_qp *qp;
};

/* Binds to the verbs library the way NCCL does. */
int standin_net_init(const char *verbs_path) {
  void *h = dlopen(verbs_path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
  create_qp = (create_qp_fn)dlvsym(h, "ibv_create_qp", "IBVERBS_1.1");
  modify_qp = (modify_qp_fn)dlvsym(h, "ibv_modify_qp", "IBVERBS_1.1");
  return create_qp && modify_qp ? 0 : -1;
}

/* A queue pair moved to RTR toward `peer_qpn` at the RoCE v2 GID of 10.7.0.`host`. */
static struct comm *setup(uint32_t peer_qpn, int host) {
  struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_RC};
  struct comm *c = calloc(1, sizeof *c);
  if (!c || !(c->qp = create_qp(NULL, &init))) return NULL;
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_INIT;
  modify_qp(c->qp, &attr, IBV_QP_STATE);
  attr.qp_state = IBV_QPS_RTR;
  attr.dest_qp_num = peer_qpn;
  attr.path_mtu = IBV_MTU_4096;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.port_num = 1;
  /* RoCE v2's IPv4 GID is commonly at index 3 of the port's table. */
  attr.ah_attr.grh.sgid_index = 3;
  attr.ah_attr.grh.dgid.raw[10] = 0xff;
  attr.ah_attr.grh.dgid.raw[11] = 0xff;
  attr.ah_attr.grh.dgid.raw[12] = 10;
  attr.ah_attr.grh.dgid.raw[13] = 7;
  attr.ah_attr.grh.dgid.raw[15] = (uint8_t)host;
  modify_qp(c->qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN);
  return c;
}

int ib_connect(void *ctx, int dev, void *handle, void **send_comm, void **dev_handle)
    __asm__("_Z13ncclIbConnectPviS_PS_PP24ncclNetDeviceHandle_v7_t");
int ib_connect(void *ctx, int dev, void *handle, void **send_comm, void **dev_handle) {
  static struct comm *pending;
  (void)ctx, (void)dev, (void)handle, (void)dev_handle;
  if (!pending) {
    pending = setup(0x5151, 3);
    *send_comm = NULL;
    return pending ? 0 : 2;
  }
  *send_comm = pending;
  pending = NULL;
  return 0;
}

int ib_accept(void *listen_comm, void **recv_comm, void **dev_handle)
    __asm__("_Z12ncclIbAcceptPvPS_PP24ncclNetDeviceHandle_v7_t");
int ib_accept(void *listen_comm, void **recv_comm, void **dev_handle) {
  static struct comm *pending;
  (void)listen_comm, (void)dev_handle;
  if (!pending) {
    pending = setup(0x6161, 4);
    *recv_comm = NULL;
    return pending ? 0 : 2;
  }
  *recv_comm = pending;
  pending = NULL;
  return 0;
}

int ib_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
             void **request) __asm__("_Z11ncclIbIsendPvS_miS_S_PS_");
int ib_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
             void **request) {
  (void)data, (void)size, (void)tag, (void)mhandle, (void)phandle;
  *request = send_comm;
  return 0;
}

int ib_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
             void **phandles, void **request) __asm__("_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_");
int ib_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
             void **phandles, void **request) {
  (void)n, (void)data, (void)sizes, (void)tags, (void)mhandles, (void)phandles;
  *request = recv_comm;
  return 0;
}

/* The poller: the probes must leave it alone. */
int ib_test(void *request, int *done, int *sizes) __asm__("_Z10ncclIbTestPvPiS0_");
int ib_test(void *request, int *done, int *sizes) {
  (void)request, (void)sizes;
  *done = 1;
  return 0;
}
