/* A stand-in for libibverbs, for the transport probes' tests: it exports the control-path
 * functions commscope probes, with libibverbs' symbol versions (each function's current
 * IBVERBS_1.1 copy as the default `@@` version and, for the 1.0-era ones, an IBVERBS_1.0
 * compatibility copy beside it), and behaves just enough like the real library for the probes
 * to read what they read there: queue pairs with numbers and a device, attributes, memory
 * regions, asynchronous events. No RDMA happens. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct ibv_device device = {.name = "standin_0"};
static struct ibv_context context = {.device = &device};
static uint32_t next_qp_num = 0x100;
static struct ibv_qp *last_qp;
static int async_calls;

static void pause_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

struct ibv_qp *standin_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
  struct ibv_qp *qp = calloc(1, sizeof *qp);
  if (!qp) return NULL;
  qp->context = (pd && pd->context) ? pd->context : &context;
  qp->pd = pd;
  qp->qp_num = next_qp_num++;
  qp->qp_type = attr ? attr->qp_type : IBV_QPT_RC;
  qp->state = IBV_QPS_RESET;
  last_qp = qp;
  return qp;
}

int standin_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  if (!qp || !attr) return EINVAL;
  if (mask & IBV_QP_STATE) qp->state = attr->qp_state;
  return 0;
}

int standin_destroy_qp(struct ibv_qp *qp) {
  free(qp);
  return 0;
}

struct ibv_mr *standin_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                    unsigned int access) {
  (void)iova;
  (void)access;
  struct ibv_mr *mr = calloc(1, sizeof *mr);
  if (!mr) return NULL;
  pause_us(2000); /* pinning takes time on a real device */
  mr->context = (pd && pd->context) ? pd->context : &context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  return mr;
}

/* As in rdma-core, the old entry point goes through the exported iova2 one. */
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access);
struct ibv_mr *standin_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, access);
}

struct ibv_mr *standin_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                     uint64_t iova, int fd, int access) {
  (void)fd;
  return standin_reg_mr_iova2(pd, (void *)(uintptr_t)offset, length, iova, access);
}

int standin_dereg_mr(struct ibv_mr *mr) {
  if (!mr) return EINVAL;
  pause_us(500);
  free(mr);
  return 0;
}

/* The first call reports port 1 down, the second a fatal error on the last queue pair
 * created; then nothing. */
int standin_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
  (void)ctx;
  switch (async_calls++) {
  case 0:
    event->event_type = IBV_EVENT_PORT_ERR;
    event->element.port_num = 1;
    return 0;
  case 1:
    event->event_type = IBV_EVENT_QP_FATAL;
    event->element.qp = last_qp;
    return 0;
  default:
    return EAGAIN;
  }
}

/* The IBVERBS_1.0 compatibility copies: nothing current calls them, and the probes must not
 * sit on them. */
struct ibv_qp *compat_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
  (void)pd;
  (void)attr;
  return NULL;
}
int compat_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  (void)qp;
  (void)attr;
  (void)mask;
  return ENOSYS;
}
int compat_destroy_qp(struct ibv_qp *qp) {
  (void)qp;
  return ENOSYS;
}
struct ibv_mr *compat_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  (void)pd;
  (void)addr;
  (void)length;
  (void)access;
  return NULL;
}
int compat_dereg_mr(struct ibv_mr *mr) {
  (void)mr;
  return ENOSYS;
}
int compat_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
  (void)ctx;
  (void)event;
  return ENOSYS;
}
__asm__(".symver standin_create_qp, ibv_create_qp@@IBVERBS_1.1");
__asm__(".symver standin_modify_qp, ibv_modify_qp@@IBVERBS_1.1");
__asm__(".symver standin_destroy_qp, ibv_destroy_qp@@IBVERBS_1.1");
__asm__(".symver standin_reg_mr, ibv_reg_mr@@IBVERBS_1.1");
__asm__(".symver standin_dereg_mr, ibv_dereg_mr@@IBVERBS_1.1");
__asm__(".symver standin_get_async_event, ibv_get_async_event@@IBVERBS_1.1");
__asm__(".symver standin_reg_mr_iova2, ibv_reg_mr_iova2@@IBVERBS_1.8");
__asm__(".symver standin_reg_dmabuf_mr, ibv_reg_dmabuf_mr@@IBVERBS_1.12");
__asm__(".symver compat_create_qp, ibv_create_qp@IBVERBS_1.0");
__asm__(".symver compat_modify_qp, ibv_modify_qp@IBVERBS_1.0");
__asm__(".symver compat_destroy_qp, ibv_destroy_qp@IBVERBS_1.0");
__asm__(".symver compat_reg_mr, ibv_reg_mr@IBVERBS_1.0");
__asm__(".symver compat_dereg_mr, ibv_dereg_mr@IBVERBS_1.0");
__asm__(".symver compat_get_async_event, ibv_get_async_event@IBVERBS_1.0");
