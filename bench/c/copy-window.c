/*
 * The copy behind RUCX_ARCH_BUILTIN_MEMCPY_MIN/MAX: libc's memcpy against the CPU's string
 * copy (`rep movsb`, what ucs::arch uses inside the window), per length and alignment, on one
 * source and one destination buffer copied over and over (as rucx-perftest's put_bw does).
 * Prints the median of 11 rounds per length, in MB/s, and the ratio string/libc; a ratio
 * above 1 from some length up is where the window pays on this CPU.
 *
 *   gcc -O2 -o /tmp/copy-window bench/c/copy-window.c && /tmp/copy-window [SRC_OFF DST_OFF]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void string_copy(void *d, const void *s, size_t n)
{
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    static const size_t lens[] = {4096, 65536, 524288, 1000000, 1 << 20, 2 << 20, 4 << 20,
                                  8 << 20, 32 << 20};
    size_t soff = argc > 2 ? strtoul(argv[1], NULL, 0) : 0;
    size_t doff = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
    printf("%10s %10s %10s %6s   (source +%zu, destination +%zu bytes from 4 KiB)\n", "bytes",
           "libc MB/s", "rep movsb", "ratio", soff, doff);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        size_t n = lens[k];
        char *s = aligned_alloc(4096, n + 8192), *d = aligned_alloc(4096, n + 8192);
        if (!s || !d)
            return 1;
        memset(s, 1, n + 8192);
        memset(d, 2, n + 8192);
        long iters = (4L << 30) / n;
        double r[2][11];
        for (int round = 0; round < 11; round++)
            for (int m = 0; m < 2; m++) {
                double t0 = now();
                for (long i = 0; i < iters; i++) {
                    if (m == 0)
                        memcpy(d + doff, s + soff, n);
                    else
                        string_copy(d + doff, s + soff, n);
                    asm volatile("" : : "r"(d) : "memory");
                }
                r[m][round] = (double)n * iters / (now() - t0) / 1e6;
            }
        qsort(r[0], 11, sizeof(double), cmp);
        qsort(r[1], 11, sizeof(double), cmp);
        printf("%10zu %10.0f %10.0f %6.2f\n", n, r[0][5], r[1][5], r[1][5] / r[0][5]);
        free(s);
        free(d);
    }
    return 0;
}
