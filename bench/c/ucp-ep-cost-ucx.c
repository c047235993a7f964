/*
 * bench/c/ucp-ep-cost-ucx.c — what a connected UCP endpoint costs in UCX, measured exactly as
 * rucx's `ucp-ep-cost` (bench/src/bin/ucp-ep-cost.rs) measures rucx: one process, one context
 * (UCP_FEATURE_AM), two workers (a "server" and a "client"); the client creates N endpoints to
 * the server's worker address, sends one 8-byte active message on each (ucp_am_send_nbx), and
 * both workers are progressed until the server's handler counted N. Per connected endpoint
 * (both ends: the client's endpoint and whatever the server keeps for it): heap bytes
 * (mallinfo2: arena + mmap'd blocks in use), resident memory (/proc/self/statm), file
 * descriptors; and the wall time from the first ucp_ep_create to the last message received.
 * Each round uses fresh workers; its endpoints are closed before the next (flush mode: UCX
 * refuses a forced close without UCP_ERR_HANDLING_MODE_PEER, which these endpoints don't use).
 *
 *   cc -O2 -o ucp-ep-cost-ucx bench/c/ucp-ep-cost-ucx.c -lucp -lucs
 *   UCX_TLS=tcp UCX_NET_DEVICES=lo ./ucp-ep-cost-ucx [-n 1000] [-r rounds]
 *
 * Transports and devices come from UCX_TLS / UCX_NET_DEVICES. Output: the same CSV as ep-cost
 * ("ucx" in the first column, "ucp/" and UCX_TLS in the second).
 */
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return (long)(mi.uordblks + mi.hblkhd);
}

static long rss_bytes(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) {
            res = 0;
        }
        fclose(f);
    }
    return res * sysconf(_SC_PAGESIZE);
}

static long fds(void)
{
    long n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        while (readdir(d)) {
            n++;
        }
        closedir(d);
    }
    return n;
}

static size_t received;

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg; (void)header; (void)header_length; (void)data; (void)length; (void)param;
    received++;
    return UCS_OK;
}

#define CHECK(x, what) do { ucs_status_t _s = (x); if (_s != UCS_OK) { \
    fprintf(stderr, "ucp-ep-cost-ucx: %s: %s\n", what, ucs_status_string(_s)); exit(1); } } while (0)

static double t0;

static void progress2(ucp_worker_h a, ucp_worker_h b, const char *what)
{
    ucp_worker_progress(a);
    ucp_worker_progress(b);
    if (now() - t0 > 60) {
        fprintf(stderr, "ucp-ep-cost-ucx: %s timed out after 60 s\n", what);
        exit(1);
    }
}

/* Waits for a request from a _nbx call (NULL: done at once). */
static void wait_req(void *req, ucp_worker_h a, ucp_worker_h b, const char *what)
{
    ucs_status_t st;
    if (req == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(req)) {
        CHECK(UCS_PTR_STATUS(req), what);
    }
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        progress2(a, b, what);
    }
    ucp_request_free(req);
    CHECK(st, what);
}

static ucp_worker_h new_worker(ucp_context_h ctx)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w;
    CHECK(ucp_worker_create(ctx, &wp, &w), "ucp_worker_create");
    return w;
}

int main(int argc, char **argv)
{
    size_t n = 1000, rounds = 1, i, round;
    int o;
    while ((o = getopt(argc, argv, "n:r:")) != -1) {
        switch (o) {
        case 'n': n = strtoul(optarg, NULL, 0); break;
        case 'r': rounds = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: [UCX_TLS=tl] ucp-ep-cost-ucx [-n eps] [-r rounds]\n");
            return 2;
        }
    }
    if (n == 0) {
        fprintf(stderr, "ucp-ep-cost-ucx: -n must be at least 1\n");
        return 2;
    }
    const char *tls = getenv("UCX_TLS");
    ucp_config_t *cfg;
    ucp_context_h ctx;
    ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    CHECK(ucp_config_read(NULL, NULL, &cfg), "ucp_config_read");
    CHECK(ucp_init(&cp, cfg, &ctx), "ucp_init");
    ucp_config_release(cfg);
    printf("tool,transport,eps,connect_ms,heap_per_ep,rss_per_ep,fds_per_ep\n");
    for (round = 0; round < rounds; round++) {
        ucp_worker_h server = new_worker(ctx), client = new_worker(ctx);
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                                   UCP_AM_HANDLER_PARAM_FIELD_CB,
                                     .id = 1, .cb = am_cb};
        CHECK(ucp_worker_set_am_recv_handler(server, &hp), "ucp_worker_set_am_recv_handler");
        ucp_address_t *addr;
        size_t addr_len;
        CHECK(ucp_worker_get_address(server, &addr, &addr_len), "ucp_worker_get_address");
        ucp_ep_h *eps = calloc(n, sizeof(*eps));
        void **reqs = calloc(n, sizeof(*reqs));
        uint64_t payload = 0;
        received = 0;
        long heap0 = heap_bytes(), rss0 = rss_bytes(), fd0 = fds();
        t0 = now();
        for (i = 0; i < n; i++) {
            ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                  .address = addr};
            CHECK(ucp_ep_create(client, &ep, &eps[i]), "ucp_ep_create");
        }
        for (i = 0; i < n; i++) {
            ucp_request_param_t rp = {.op_attr_mask = 0};
            reqs[i] = ucp_am_send_nbx(eps[i], 1, NULL, 0, &payload, sizeof(payload), &rp);
            if (UCS_PTR_IS_ERR(reqs[i])) {
                CHECK(UCS_PTR_STATUS(reqs[i]), "ucp_am_send_nbx");
            }
        }
        while (received < n) {
            progress2(server, client, "delivery");
        }
        double secs = now() - t0;
        for (i = 0; i < n; i++) {
            wait_req(reqs[i], server, client, "ucp_am_send_nbx");
        }
        for (i = 0; i < 1000; i++) {
            ucp_worker_progress(server);
            ucp_worker_progress(client);
        }
        long heap = heap_bytes() - heap0, rss = rss_bytes() - rss0, fd = fds() - fd0;
        printf("ucx,ucp/%s,%zu,%.2f,%.0f,%.0f,%.2f\n", tls ? tls : "all", n, secs * 1e3,
               (double)heap / n, (double)rss / n, (double)fd / n);
        fflush(stdout);
        t0 = now();
        for (i = 0; i < n; i++) {
            ucp_request_param_t rp = {.op_attr_mask = 0};
            wait_req(ucp_ep_close_nbx(eps[i], &rp), server, client, "ucp_ep_close_nbx");
        }
        free(eps);
        free(reqs);
        ucp_worker_release_address(server, addr);
        ucp_worker_destroy(client);
        ucp_worker_destroy(server);
    }
    ucp_cleanup(ctx);
    return 0;
}
