/* See shim.h. */
#include "shim.h"
#include <stdlib.h>
#include <string.h>

int rucx_fi_close(struct fid *fid) { return fi_close(fid); }
int rucx_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context)
{ return fi_domain(fabric, info, domain, context); }
int rucx_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context)
{ return fi_endpoint(domain, info, ep, context); }
int rucx_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context)
{ return fi_cq_open(domain, attr, cq, context); }
int rucx_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context)
{ return fi_av_open(domain, attr, av, context); }
int rucx_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int rucx_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int rucx_fi_control(struct fid *fid, int command, void *arg) { return fi_control(fid, command, arg); }
int rucx_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{ return fi_trywait(fabric, fids, count); }
int rucx_fi_getname(struct fid *fid, void *addr, size_t *addrlen) { return fi_getname(fid, addr, addrlen); }
int rucx_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
                      void *context)
{ return fi_av_insert(av, addr, count, fi_addr, flags, context); }
int rucx_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset,
                   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{ return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context); }
void *rucx_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t rucx_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
ssize_t rucx_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context)
{ return fi_send(ep, buf, len, desc, dest, context); }
ssize_t rucx_fi_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest)
{ return fi_inject(ep, buf, len, dest); }
ssize_t rucx_fi_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{ return fi_sendmsg(ep, msg, flags); }
ssize_t rucx_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, void *context)
{ return fi_recv(ep, buf, len, desc, src, context); }
ssize_t rucx_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{ return fi_writemsg(ep, msg, flags); }
ssize_t rucx_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{ return fi_readmsg(ep, msg, flags); }
ssize_t rucx_fi_inject_atomic(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr,
                              uint64_t key, enum fi_datatype datatype, enum fi_op op)
{ return fi_inject_atomic(ep, buf, count, dest, addr, key, datatype, op); }
ssize_t rucx_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
                             void *result_desc, fi_addr_t dest, uint64_t addr, uint64_t key,
                             enum fi_datatype datatype, enum fi_op op, void *context)
{ return fi_fetch_atomic(ep, buf, count, desc, result, result_desc, dest, addr, key, datatype, op, context); }
ssize_t rucx_fi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare,
                               void *compare_desc, void *result, void *result_desc, fi_addr_t dest, uint64_t addr,
                               uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context)
{
    return fi_compare_atomic(ep, buf, count, desc, compare, compare_desc, result, result_desc, dest, addr, key,
                             datatype, op, context);
}
int rucx_fi_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count)
{ return fi_atomicvalid(ep, datatype, op, count); }
int rucx_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count)
{ return fi_fetch_atomicvalid(ep, datatype, op, count); }
int rucx_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op, size_t *count)
{ return fi_compare_atomicvalid(ep, datatype, op, count); }
ssize_t rucx_fi_cq_read(struct fid_cq *cq, void *buf, size_t count) { return fi_cq_read(cq, buf, count); }
ssize_t rucx_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{ return fi_cq_readerr(cq, buf, flags); }
const char *rucx_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len)
{ return fi_cq_strerror(cq, prov_errno, err_data, buf, len); }
uint32_t rucx_fi_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }
uint32_t rucx_fi_lib_version(void) { return fi_version(); }

int rucx_fi_eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **eq, void *context)
{ return fi_eq_open(fabric, attr, eq, context); }
ssize_t rucx_fi_eq_read(struct fid_eq *eq, uint32_t *event, void *buf, size_t len, uint64_t flags)
{ return fi_eq_read(eq, event, buf, len, flags); }
ssize_t rucx_fi_eq_readerr(struct fid_eq *eq, struct fi_eq_err_entry *buf, uint64_t flags)
{ return fi_eq_readerr(eq, buf, flags); }
int rucx_fi_passive_ep(struct fid_fabric *fabric, struct fi_info *info, struct fid_pep **pep, void *context)
{ return fi_passive_ep(fabric, info, pep, context); }
int rucx_fi_pep_bind(struct fid_pep *pep, struct fid *bfid, uint64_t flags) { return fi_pep_bind(pep, bfid, flags); }
int rucx_fi_listen(struct fid_pep *pep) { return fi_listen(pep); }
int rucx_fi_connect(struct fid_ep *ep, const void *addr, const void *param, size_t paramlen)
{ return fi_connect(ep, addr, param, paramlen); }
int rucx_fi_accept(struct fid_ep *ep, const void *param, size_t paramlen) { return fi_accept(ep, param, paramlen); }
int rucx_fi_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t paramlen)
{ return fi_reject(pep, handle, param, paramlen); }
int rucx_fi_shutdown(struct fid_ep *ep, uint64_t flags) { return fi_shutdown(ep, flags); }
int rucx_fi_srx_context(struct fid_domain *domain, struct fi_rx_attr *attr, struct fid_ep **rx_ep, void *context)
{ return fi_srx_context(domain, attr, rx_ep, context); }
int rucx_fi_query_atomic(struct fid_domain *domain, enum fi_datatype datatype, enum fi_op op,
                         struct fi_atomic_attr *attr, uint64_t flags)
{ return fi_query_atomic(domain, datatype, op, attr, flags); }
int rucx_fi_info_set_dest(struct fi_info *info, const void *addr, size_t len)
{
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return -FI_ENOMEM;
    memcpy(copy, addr, len);
    free(info->dest_addr);
    info->dest_addr = copy;
    info->dest_addrlen = len;
    return 0;
}
void rucx_fi_info_set_shared_rx(struct fi_info *info)
{
    if (info->ep_attr)
        info->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
}
