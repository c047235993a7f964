/* Out-of-line wrappers for libfabric's `static inline` calls (bindgen cannot bind those).
 * Each forwards its arguments unchanged; see the fi_*(3) man pages for the contracts. */
#ifndef RUCX_OFI_SHIM_H
#define RUCX_OFI_SHIM_H
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>

int rucx_fi_close(struct fid *fid);
int rucx_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context);
int rucx_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
int rucx_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
int rucx_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
int rucx_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int rucx_fi_enable(struct fid_ep *ep);
int rucx_fi_control(struct fid *fid, int command, void *arg);
int rucx_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);
int rucx_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int rucx_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
                      void *context);
int rucx_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset,
                   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
void *rucx_fi_mr_desc(struct fid_mr *mr);
uint64_t rucx_fi_mr_key(struct fid_mr *mr);
ssize_t rucx_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context);
ssize_t rucx_fi_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest);
ssize_t rucx_fi_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags);
ssize_t rucx_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, void *context);
ssize_t rucx_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
ssize_t rucx_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
ssize_t rucx_fi_inject_atomic(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr,
                              uint64_t key, enum fi_datatype datatype, enum fi_op op);
ssize_t rucx_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
                             void *result_desc, fi_addr_t dest, uint64_t addr, uint64_t key,
                             enum fi_datatype datatype, enum fi_op op, void *context);
ssize_t rucx_fi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare,
                               void *compare_desc, void *result, void *result_desc, fi_addr_t dest, uint64_t addr,
                               uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
int rucx_fi_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count);
int rucx_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count);
int rucx_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count);
ssize_t rucx_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t rucx_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *rucx_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);
uint32_t rucx_fi_version(void);
/* The version of the libfabric loaded at run time (fi_version). */
uint32_t rucx_fi_lib_version(void);
/* Connected (FI_EP_MSG) endpoints. */
int rucx_fi_eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **eq, void *context);
ssize_t rucx_fi_eq_read(struct fid_eq *eq, uint32_t *event, void *buf, size_t len, uint64_t flags);
ssize_t rucx_fi_eq_readerr(struct fid_eq *eq, struct fi_eq_err_entry *buf, uint64_t flags);
int rucx_fi_passive_ep(struct fid_fabric *fabric, struct fi_info *info, struct fid_pep **pep, void *context);
int rucx_fi_pep_bind(struct fid_pep *pep, struct fid *bfid, uint64_t flags);
int rucx_fi_listen(struct fid_pep *pep);
int rucx_fi_connect(struct fid_ep *ep, const void *addr, const void *param, size_t paramlen);
int rucx_fi_accept(struct fid_ep *ep, const void *param, size_t paramlen);
int rucx_fi_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t paramlen);
int rucx_fi_shutdown(struct fid_ep *ep, uint64_t flags);
int rucx_fi_srx_context(struct fid_domain *domain, struct fi_rx_attr *attr, struct fid_ep **rx_ep, void *context);
int rucx_fi_query_atomic(struct fid_domain *domain, enum fi_datatype datatype, enum fi_op op,
                         struct fi_atomic_attr *attr, uint64_t flags);
/* Sets an fi_info's destination address (a malloc'd copy, which fi_freeinfo frees); 0 or -FI_ENOMEM. */
int rucx_fi_info_set_dest(struct fi_info *info, const void *addr, size_t len);
/* Makes endpoints opened with this fi_info take a shared receive context. */
void rucx_fi_info_set_shared_rx(struct fi_info *info);
#endif
