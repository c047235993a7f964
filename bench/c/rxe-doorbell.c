/*
 * The measurement behind RUCX_IB_TX_DB_BATCH: the time per RC SEND (8000 bytes) when K send
 * requests share one ibv_post_send (one doorbell), on the first verbs device. One process, two
 * RC QPs connected to each other (a stream as in rc_verbs am_bw: every 64th request signaled,
 * up to 192 in flight, receives reposted as they complete). On Soft-RoCE every ibv_post_send
 * is a write() to the uverbs device in whose context the kernel runs the requester for all
 * queued requests, so K > 1 saves that entry per request. Prints one line per run.
 *
 *   gcc -O2 -o /tmp/rxe-doorbell bench/c/rxe-doorbell.c -libverbs
 *   testbed/rxe-vm.sh -- sh -c 'for k in 1 2 4 8 1 2 4 8; do /tmp/rxe-doorbell $k; done'
 *
 * Arguments: K [MESSAGES (20000)] [PATH_MTU as ibv_mtu (3 = 1024, the VM's active MTU)]
 *            [SIZE (8000, at most 8192)]
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUF 256
#define NRECV 1024
#define RSZ 8192
#define SIGNAL_EVERY 64
#define MAX_OUTSTANDING 192
#define WARMUP 2000

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static void connect_qp(struct ibv_qp *q, uint32_t dqp, union ibv_gid *gid, int gid_index, int mtu)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("modify INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dqp;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("modify RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("modify RTS");
}

static void post_recv(struct ibv_qp *q, char *rb, uint32_t lkey, uint64_t i)
{
    struct ibv_sge s = {(uintptr_t)(rb + RSZ * i), RSZ, lkey};
    struct ibv_recv_wr w = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
    if (ibv_post_recv(q, &w, &bad))
        die("ibv_post_recv");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s K [MESSAGES] [PATH_MTU]\n", argv[0]);
        return 2;
    }
    int k = atoi(argv[1]);
    long n = argc > 2 ? atol(argv[2]) : 20000;
    int mtu = argc > 3 ? atoi(argv[3]) : IBV_MTU_1024;
    long SZ = argc > 4 ? atol(argv[4]) : 8000;
    if (k < 1 || k > 16 || n < 1 || SZ < 1 || SZ > RSZ)
        return 2;
    struct ibv_device **dl = ibv_get_device_list(NULL);
    if (!dl || !dl[0])
        die("no verbs device");
    struct ibv_context *c = ibv_open_device(dl[0]);
    if (!c)
        die("ibv_open_device");
    struct ibv_pd *pd = ibv_alloc_pd(c);
    struct ibv_cq *scq = ibv_create_cq(c, 4096, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(c, 4096, NULL, NULL, 0);
    if (!pd || !scq || !rcq)
        die("pd/cq");
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = scq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 256;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    struct ibv_qp *a = ibv_create_qp(pd, &ia);
    ia.send_cq = ia.recv_cq = rcq;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = NRECV;
    struct ibv_qp *b = ibv_create_qp(pd, &ia);
    if (!a || !b)
        die("ibv_create_qp");
    /* GID 1: the VM's ::ffff:<IPv4> RoCE v2 entry (testbed/rxe-vm.sh) */
    int gid_index = getenv("GID_INDEX") ? atoi(getenv("GID_INDEX")) : 1;
    union ibv_gid gid;
    if (ibv_query_gid(c, 1, gid_index, &gid))
        die("ibv_query_gid");
    connect_qp(a, b->qp_num, &gid, gid_index, mtu);
    connect_qp(b, a->qp_num, &gid, gid_index, mtu);
    char *sb = aligned_alloc(4096, (size_t)SZ * NBUF), *rb = aligned_alloc(4096, (size_t)RSZ * NRECV);
    memset(sb, 1, (size_t)SZ * NBUF);
    memset(rb, 0, (size_t)RSZ * NRECV);
    struct ibv_mr *smr = ibv_reg_mr(pd, sb, (size_t)SZ * NBUF, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *rmr = ibv_reg_mr(pd, rb, (size_t)RSZ * NRECV, IBV_ACCESS_LOCAL_WRITE);
    if (!smr || !rmr)
        die("ibv_reg_mr");
    for (uint64_t i = 0; i < NRECV; i++)
        post_recv(b, rb, rmr->lkey, i);

    long sent = 0, recvd = 0, outstanding = 0;
    uint64_t sn = 0;
    double t0 = 0;
    struct ibv_wc wc[64];
    while (recvd < n + WARMUP) {
        if (recvd >= WARMUP && t0 == 0)
            t0 = now();
        if (sent < n + WARMUP && outstanding + k <= MAX_OUTSTANDING) {
            struct ibv_send_wr w[16], *bad;
            struct ibv_sge s[16];
            for (int j = 0; j < k; j++) {
                uint64_t id = sn + j;
                s[j] = (struct ibv_sge){(uintptr_t)(sb + SZ * (id % NBUF)), (uint32_t)SZ, smr->lkey};
                memset(&w[j], 0, sizeof w[j]);
                w[j].wr_id = id;
                w[j].sg_list = &s[j];
                w[j].num_sge = 1;
                w[j].opcode = IBV_WR_SEND;
                w[j].send_flags = (id % SIGNAL_EVERY == SIGNAL_EVERY - 1) ? IBV_SEND_SIGNALED : 0;
                w[j].next = j + 1 < k ? &w[j + 1] : NULL;
            }
            if (ibv_post_send(a, w, &bad))
                die("ibv_post_send");
            sn += k;
            sent += k;
            outstanding += k;
        }
        int m = ibv_poll_cq(scq, 64, wc);
        for (int i = 0; i < m; i++) {
            if (wc[i].status) {
                fprintf(stderr, "send completion: %s\n", ibv_wc_status_str(wc[i].status));
                return 1;
            }
            outstanding -= SIGNAL_EVERY; /* one signaled completion covers 64 requests */
        }
        m = ibv_poll_cq(rcq, 64, wc);
        for (int i = 0; i < m; i++) {
            if (wc[i].status) {
                fprintf(stderr, "receive completion: %s\n", ibv_wc_status_str(wc[i].status));
                return 1;
            }
            recvd++;
            post_recv(b, rb, rmr->lkey, wc[i].wr_id);
        }
    }
    double t = now() - t0;
    printf("k=%d mtu=%d size=%ld messages=%ld per_message_us=%.2f MBps=%.1f\n", k, mtu, SZ, n, t / n * 1e6,
           n * (double)SZ / t / 1048576);
    return 0;
}
