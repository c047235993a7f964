/*
 * bench/c/ep-cost-ucx.c — what a connected UCT endpoint costs in UCX, measured exactly as rucx's
 * `ep-cost` (tools/src/bin/ep-cost.rs) measures rucx: one process, one worker, two interfaces
 * on the device; the client creates N endpoints to the server (connect-to-iface if the
 * transport has it, else N endpoint pairs), sends one 8-byte am_short on each (retrying on
 * UCS_ERR_NO_RESOURCE with progress), and progresses until the server's handler counted N.
 * Per connected endpoint (both ends): heap bytes (mallinfo2: arena + mmap'd blocks in use),
 * resident memory (/proc/self/statm), file descriptors; and the wall time from the first
 * endpoint creation to the last message received.
 *
 *   cc -O2 -o ep-cost-ucx bench/c/ep-cost-ucx.c -luct -lucs
 *   ./ep-cost-ucx [-x tcp] [-d lo] [-n 1000] [-r rounds]
 *
 * Output: the same CSV as ep-cost ("ucx" in the first column).
 */
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uct/api/uct.h>

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

static ucs_status_t am_cb(void *arg, void *data, size_t length, unsigned flags)
{
    (void)arg; (void)data; (void)length; (void)flags;
    received++;
    return UCS_OK;
}

#define CHECK(x, what) do { ucs_status_t _s = (x); if (_s != UCS_OK) { \
    fprintf(stderr, "ep-cost-ucx: %s: %s\n", what, ucs_status_string(_s)); exit(1); } } while (0)

/* Finds the md of the component that has transport `tl` on device `dev`. */
static uct_md_h open_md(const char *tl, const char *dev)
{
    uct_component_h *comps;
    unsigned ncomps, c, m, r;
    CHECK(uct_query_components(&comps, &ncomps), "uct_query_components");
    for (c = 0; c < ncomps; c++) {
        uct_component_attr_t ca = {.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        CHECK(uct_component_query(comps[c], &ca), "uct_component_query");
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = calloc(ca.md_resource_count, sizeof(*ca.md_resources));
        CHECK(uct_component_query(comps[c], &ca), "uct_component_query");
        for (m = 0; m < ca.md_resource_count; m++) {
            uct_md_config_t *cfg;
            uct_md_h md;
            uct_tl_resource_desc_t *res;
            unsigned nres;
            CHECK(uct_md_config_read(comps[c], NULL, NULL, &cfg), "uct_md_config_read");
            if (uct_md_open(comps[c], ca.md_resources[m].md_name, cfg, &md) != UCS_OK) {
                uct_config_release(cfg);
                continue;
            }
            uct_config_release(cfg);
            CHECK(uct_md_query_tl_resources(md, &res, &nres), "uct_md_query_tl_resources");
            for (r = 0; r < nres; r++) {
                if (!strcmp(res[r].tl_name, tl) && !strcmp(res[r].dev_name, dev)) {
                    uct_release_tl_resource_list(res);
                    free(ca.md_resources);
                    return md;
                }
            }
            uct_release_tl_resource_list(res);
            uct_md_close(md);
        }
        free(ca.md_resources);
    }
    fprintf(stderr, "ep-cost-ucx: no %s/%s (list resources with ucx_info -d)\n", tl, dev);
    exit(1);
}

static uct_iface_h open_iface(uct_md_h md, uct_worker_h w, const char *tl, const char *dev)
{
    uct_iface_config_t *cfg;
    uct_iface_h iface;
    uct_iface_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                   UCT_IFACE_PARAM_FIELD_STATS_ROOT | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = tl;
    p.mode.device.dev_name = dev;
    CHECK(uct_md_iface_config_read(md, tl, NULL, NULL, &cfg), "uct_md_iface_config_read");
    CHECK(uct_iface_open(md, w, &p, cfg, &iface), "uct_iface_open");
    uct_config_release(cfg);
    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    return iface;
}

int main(int argc, char **argv)
{
    const char *tl = "tcp", *dev = "lo";
    size_t n = 1000, rounds = 1, i, round;
    int o;
    while ((o = getopt(argc, argv, "x:d:n:r:")) != -1) {
        switch (o) {
        case 'x': tl = optarg; break;
        case 'd': dev = optarg; break;
        case 'n': n = strtoul(optarg, NULL, 0); break;
        case 'r': rounds = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: ep-cost-ucx [-x tl] [-d dev] [-n eps] [-r rounds]\n");
            return 2;
        }
    }
    if (n == 0) {
        fprintf(stderr, "ep-cost-ucx: -n must be at least 1\n");
        return 2;
    }
    ucs_async_context_t *async;
    uct_worker_h w;
    CHECK(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async), "ucs_async_context_create");
    CHECK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &w), "uct_worker_create");
    uct_md_h md = open_md(tl, dev);
    printf("tool,transport,eps,connect_ms,heap_per_ep,rss_per_ep,fds_per_ep\n");
    for (round = 0; round < rounds; round++) {
        uct_iface_h server = open_iface(md, w, tl, dev), client = open_iface(md, w, tl, dev);
        uct_iface_attr_t attr;
        CHECK(uct_iface_query(client, &attr), "uct_iface_query");
        /* Both: self delivers to the sender's own interface, whatever address it was given. */
        CHECK(uct_iface_set_am_handler(server, 1, am_cb, NULL, UCT_CB_FLAG_ASYNC),
              "uct_iface_set_am_handler");
        CHECK(uct_iface_set_am_handler(client, 1, am_cb, NULL, UCT_CB_FLAG_ASYNC),
              "uct_iface_set_am_handler");
        int to_iface = !!(attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE);
        uct_device_addr_t *sdev = calloc(1, attr.device_addr_len + 1);
        uct_device_addr_t *cdev = calloc(1, attr.device_addr_len + 1);
        uct_iface_addr_t *saddr = calloc(1, attr.iface_addr_len + 1);
        uct_ep_addr_t *epaddr = calloc(1, attr.ep_addr_len + 1);
        CHECK(uct_iface_get_device_address(server, sdev), "uct_iface_get_device_address");
        CHECK(uct_iface_get_device_address(client, cdev), "uct_iface_get_device_address");
        CHECK(uct_iface_get_address(server, saddr), "uct_iface_get_address");
        uct_ep_h *eps = calloc(n, sizeof(*eps)), *peers = calloc(n, sizeof(*peers));
        received = 0;
        long heap0 = heap_bytes(), rss0 = rss_bytes(), fd0 = fds();
        double t0 = now();
        for (i = 0; i < n; i++) {
            uct_ep_params_t ep = {.field_mask = UCT_EP_PARAM_FIELD_IFACE};
            if (to_iface) {
                ep.field_mask |= UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
                ep.iface = client;
                ep.dev_addr = sdev;
                ep.iface_addr = saddr;
                CHECK(uct_ep_create(&ep, &eps[i]), "uct_ep_create (to iface)");
            } else {
                ep.iface = client;
                CHECK(uct_ep_create(&ep, &eps[i]), "uct_ep_create");
                ep.iface = server;
                CHECK(uct_ep_create(&ep, &peers[i]), "uct_ep_create");
                CHECK(uct_ep_get_address(eps[i], epaddr), "uct_ep_get_address");
                CHECK(uct_ep_connect_to_ep(peers[i], cdev, epaddr), "uct_ep_connect_to_ep");
                CHECK(uct_ep_get_address(peers[i], epaddr), "uct_ep_get_address");
                CHECK(uct_ep_connect_to_ep(eps[i], sdev, epaddr), "uct_ep_connect_to_ep");
            }
        }
        for (i = 0; i < n; i++) {
            ucs_status_t st;
            while ((st = uct_ep_am_short(eps[i], 1, 0, NULL, 0)) == UCS_ERR_NO_RESOURCE) {
                uct_worker_progress(w);
                if (now() - t0 > 60) {
                    fprintf(stderr, "ep-cost-ucx: connecting timed out after 60 s\n");
                    return 1;
                }
            }
            CHECK(st, "uct_ep_am_short");
        }
        while (received < n) {
            uct_worker_progress(w);
            if (now() - t0 > 60) {
                fprintf(stderr, "ep-cost-ucx: delivery timed out after 60 s\n");
                return 1;
            }
        }
        double secs = now() - t0;
        for (i = 0; i < 1000; i++) {
            uct_worker_progress(w);
        }
        long heap = heap_bytes() - heap0, rss = rss_bytes() - rss0, fd = fds() - fd0;
        printf("ucx,%s,%zu,%.2f,%.0f,%.0f,%.2f\n", tl, n, secs * 1e3, (double)heap / n,
               (double)rss / n, (double)fd / n);
        fflush(stdout);
        for (i = 0; i < n; i++) {
            uct_ep_destroy(eps[i]);
            if (peers[i]) {
                uct_ep_destroy(peers[i]);
            }
        }
        free(eps); free(peers); free(sdev); free(cdev); free(saddr); free(epaddr);
        uct_iface_close(client);
        uct_iface_close(server);
    }
    uct_md_close(md);
    uct_worker_destroy(w);
    ucs_async_context_destroy(async);
    return 0;
}
