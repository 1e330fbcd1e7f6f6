/* Drives the verbs and NCCL-network stand-ins the way NCCL does, for the transport probes'
 * tests. Usage: transport_driver <verbs stand-in> <ncclnet stand-in>
 * - main thread: two queue pairs; the first is moved INIT → RTR (peer QP 0x4242 at
 *   10.7.0.2) → RTS; two memory registrations (ibv_reg_mr, which goes through
 *   ibv_reg_mr_iova2, and ibv_reg_mr_iova2 itself) and their deregistrations; one call of the
 *   IBVERBS_1.0 copy of ibv_modify_qp, which the probes must not see; the first queue pair
 *   then goes to ERROR and the second is destroyed.
 * - an "async" thread: two ibv_get_async_event calls (a port error, a fatal QP error).
 * - a "proxy" thread: connect and accept (two calls each, one queue pair each), 10 isends of
 *   1 MiB, 5 irecvs of two 256 KiB buffers, and 1000 test polls.
 * Prints `pid <pid> send_comm <ptr> recv_comm <ptr>`.
 * TRANSPORT_DRIVER_WAIT=FILE: after mapping the libraries, wait until FILE exists. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *verbs, *net;
static void *send_comm, *recv_comm;

static void *sym(void *h, const char *name, const char *version) {
  void *p = version ? dlvsym(h, name, version) : dlsym(h, name);
  if (!p) {
    fprintf(stderr, "transport_driver: no %s: %s\n", name, dlerror());
    exit(2);
  }
  return p;
}

/* Reads the device's asynchronous events, as a real program does on the context its queue
 * pairs belong to (`arg`). */
static void *async_thread(void *arg) {
  struct ibv_context *ctx = arg;
  int (*get)(struct ibv_context *, struct ibv_async_event *) =
      sym(verbs, "ibv_get_async_event", "IBVERBS_1.1");
  struct ibv_async_event ev;
  for (int i = 0; i < 2; i++)
    if (get(ctx, &ev) != 0) exit(3);
  return NULL;
}

static void *proxy_thread(void *arg) {
  const char *verbs_path = arg;
  int (*init)(const char *) = sym(net, "standin_net_init", NULL);
  int (*connect)(void *, int, void *, void **, void **) =
      sym(net, "_Z13ncclIbConnectPviS_PS_PP24ncclNetDeviceHandle_v7_t", NULL);
  int (*accept)(void *, void **, void **) =
      sym(net, "_Z12ncclIbAcceptPvPS_PP24ncclNetDeviceHandle_v7_t", NULL);
  int (*isend)(void *, void *, size_t, int, void *, void *, void **) =
      sym(net, "_Z11ncclIbIsendPvS_miS_S_PS_", NULL);
  int (*irecv)(void *, int, void **, size_t *, int *, void **, void **, void **) =
      sym(net, "_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_", NULL);
  int (*test)(void *, int *, int *) = sym(net, "_Z10ncclIbTestPvPiS0_", NULL);
  if (init(verbs_path) != 0) exit(4);
  void *dh = NULL, *req = NULL;
  while (!send_comm)
    if (connect(NULL, 0, NULL, &send_comm, &dh) != 0) exit(5);
  while (!recv_comm)
    if (accept(NULL, &recv_comm, &dh) != 0) exit(6);
  static char buf[1 << 20];
  for (int i = 0; i < 10; i++) isend(send_comm, buf, sizeof buf, 0, NULL, NULL, &req);
  size_t sizes[2] = {256 << 10, 256 << 10};
  void *data[2] = {buf, buf};
  int tags[2] = {0, 0};
  for (int i = 0; i < 5; i++) irecv(recv_comm, 2, data, sizes, tags, NULL, NULL, &req);
  int done = 0;
  for (int i = 0; i < 1000; i++) test(req, &done, NULL);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: transport_driver <verbs stand-in> <ncclnet stand-in>\n");
    return 2;
  }
  verbs = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  net = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!verbs || !net) {
    fprintf(stderr, "transport_driver: %s\n", dlerror());
    return 2;
  }
  /* TRANSPORT_DRIVER_WAIT=FILE: with the libraries mapped, wait (up to 60 s) until FILE exists,
   * so that probes found by scanning /proc are in place before the calls. */
  const char *wait_for = getenv("TRANSPORT_DRIVER_WAIT");
  if (wait_for) {
    fprintf(stderr, "transport_driver: mapped, waiting for %s\n", wait_for);
    for (int i = 0; i < 600 && access(wait_for, F_OK) != 0; i++) usleep(100000);
  }
  struct ibv_qp *(*create)(struct ibv_pd *, struct ibv_qp_init_attr *) =
      sym(verbs, "ibv_create_qp", "IBVERBS_1.1");
  int (*modify)(struct ibv_qp *, struct ibv_qp_attr *, int) =
      sym(verbs, "ibv_modify_qp", "IBVERBS_1.1");
  int (*modify_1_0)(struct ibv_qp *, struct ibv_qp_attr *, int) =
      sym(verbs, "ibv_modify_qp", "IBVERBS_1.0");
  int (*destroy)(struct ibv_qp *) = sym(verbs, "ibv_destroy_qp", "IBVERBS_1.1");
  struct ibv_mr *(*reg)(struct ibv_pd *, void *, size_t, int) =
      sym(verbs, "ibv_reg_mr", "IBVERBS_1.1");
  struct ibv_mr *(*reg_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned) =
      sym(verbs, "ibv_reg_mr_iova2", "IBVERBS_1.8");
  int (*dereg)(struct ibv_mr *) = sym(verbs, "ibv_dereg_mr", "IBVERBS_1.1");

  struct ibv_qp_init_attr init = {.qp_type = IBV_QPT_RC};
  struct ibv_qp *qp = create(NULL, &init), *qp2 = create(NULL, &init);
  if (!qp || !qp2) return 7;
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_INIT;
  modify(qp, &attr, IBV_QP_STATE);
  attr.qp_state = IBV_QPS_RTR;
  attr.dest_qp_num = 0x4242;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.port_num = 1;
  attr.ah_attr.dlid = 7;
  attr.ah_attr.grh.dgid.raw[10] = 0xff;
  attr.ah_attr.grh.dgid.raw[11] = 0xff;
  attr.ah_attr.grh.dgid.raw[12] = 10;
  attr.ah_attr.grh.dgid.raw[13] = 7;
  attr.ah_attr.grh.dgid.raw[15] = 2;
  modify(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN);
  attr.qp_state = IBV_QPS_RTS;
  modify(qp, &attr, IBV_QP_STATE);
  modify_1_0(qp, &attr, IBV_QP_STATE);

  static char region[4 << 20];
  struct ibv_mr *mr = reg(NULL, region, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *mr2 = reg_iova2(NULL, region + (1 << 20), 3 << 20, 0, IBV_ACCESS_LOCAL_WRITE);
  if (!mr || !mr2) return 8;
  dereg(mr);
  dereg(mr2);

  pthread_t a, p;
  pthread_create(&a, NULL, async_thread, qp->context);
  pthread_join(a, NULL);
  pthread_create(&p, NULL, proxy_thread, argv[1]);
  pthread_join(p, NULL);

  attr.qp_state = IBV_QPS_ERR;
  modify(qp, &attr, IBV_QP_STATE);
  destroy(qp2);
  printf("pid %d send_comm %p recv_comm %p\n", (int)getpid(), send_comm, recv_comm);
  return 0;
}
