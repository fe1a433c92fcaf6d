// Memory read bandwidth probe for tools/bench_peers.sh: N threads each stream-read their
// own slice of one buffer much larger than the last-level cache (summing 64-bit words, 4
// independent accumulators so the loop is load-bound, not add-bound), best of several
// passes. The buffer is 2 MiB-aligned and advised for huge pages (MADV_HUGEPAGE), as
// colibri's weights are (engine/src/hugemem.rs): with 4 KiB pages the probe measures the
// page walks as much as the memory (on the Xeon of docs/benchmarks.md 10.8 against 17-18.6
// GB/s at one thread). Prints one JSON line:
//   {"threads":N,"buffer_bytes":B,"passes":P,"read_bytes_per_second":best,"median_bytes_per_second":..}
//
//   cc -O3 -march=native -pthread -o membw tools/bench/membw.c && ./membw THREADS [MiB=1024] [passes=7]
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *start;
} job_t;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    job_t *j = arg;
    pthread_barrier_wait(j->start);
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        a += j->p[i];
        b += j->p[i + 1];
        c += j->p[i + 2];
        d += j->p[i + 3];
    }
    j->sum = a + b + c + d;
    return NULL;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s THREADS [MiB=1024] [passes=7]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    int passes = argc > 3 ? atoi(argv[3]) : 7;
    if (threads < 1 || threads > 256 || mib < 1 || passes < 1 || passes > 1000) {
        fprintf(stderr, "membw: bad arguments (threads 1..256, MiB >= 1, passes 1..1000)\n");
        return 2;
    }
    size_t bytes = mib << 20, words = bytes / 8;
    uint64_t *buf = aligned_alloc(2u << 20, bytes);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    int huge = madvise(buf, bytes, MADV_HUGEPAGE) == 0;
#else
    int huge = 0;
#endif
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    double *rates = calloc(passes, sizeof(double));
    uint64_t check = 0;
    for (int p = 0; p < passes; p++) {
        pthread_t tid[256];
        job_t jobs[256];
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, threads + 1);
        size_t per = words / threads / 4 * 4;
        for (int t = 0; t < threads; t++) {
            jobs[t] = (job_t){buf + per * t, per, 0, &start};
            pthread_create(&tid[t], NULL, reader, &jobs[t]);
        }
        double t0 = now();
        pthread_barrier_wait(&start);
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            check += jobs[t].sum;
        }
        rates[p] = (double)(per * threads * 8) / (now() - t0);
        pthread_barrier_destroy(&start);
    }
    qsort(rates, passes, sizeof(double), cmp);
    printf("{\"threads\":%d,\"buffer_bytes\":%zu,\"passes\":%d,\"read_bytes_per_second\":%.0f,"
           "\"median_bytes_per_second\":%.0f,\"huge_pages_advised\":%s,\"checksum\":%llu}\n",
           threads, bytes, passes, rates[passes - 1], rates[passes / 2], huge ? "true" : "false",
           (unsigned long long)(check & 0xffff));
    free(rates);
    free(buf);
    return 0;
}
