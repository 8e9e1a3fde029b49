/*
 * Fault-injection shim for the harness's self-test: a transport plugin that loads the real one
 * (HARNESS_SHIM_REAL = path of libnvshmem_efa_gda.so), forwards nvshmemt_init to it and then
 * wraps a few host ops to misbehave in one way (HARNESS_SHIM_FAULT):
 *
 *   drop_put       puts of exactly 4096 bytes return 0 without moving data (silently wrong)
 *   wrong_add      AMO ADD adds one more than asked (silently wrong)
 *   crash_rma      PE 1 segfaults in its first rma
 *   hang_quiet     PE 1 never returns from quiet
 *   stray_barrier  PE 1 makes an extra bootstrap barrier inside connect_endpoints (collectives
 *                  out of step between the PEs)
 *
 * The harness must report each of these as a failure, in bounded time, without hanging.
 * Build: cc -shared -fPIC -O1 -g -Wall -Werror -o fault_shim.so tests/harness/fault_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvshmem_abi.h"

enum { F_NONE, F_DROP_PUT, F_WRONG_ADD, F_CRASH_RMA, F_HANG_QUIET, F_STRAY_BARRIER };
static int fault;
static struct harness_host_ops_v3 real3;
static struct harness_host_ops_v4 real4;

/* 1: skip the call (report success); 0: forward it */
static int rma_fault(int my_pe, const harness_rma_verb *v, const harness_rma_bytesdesc *b) {
    if (fault == F_CRASH_RMA && my_pe == 1) {
        volatile int *p = NULL;
        *p = 1; /* SIGSEGV */
    }
    if (fault == F_DROP_PUT && v->op == HARNESS_OP_PUT && b->nelems * (size_t)b->elembytes == 4096) return 1;
    return 0;
}

static void hang_if(int my_pe) {
    if (fault == F_HANG_QUIET && my_pe == 1)
        for (;;) pause();
}

static int rma3(struct harness_transport_v3 *t, int pe, harness_rma_verb v, harness_rma_memdesc *r,
                harness_rma_memdesc *l, harness_rma_bytesdesc b, int q) {
    if (rma_fault(t->my_pe, &v, &b)) return 0;
    return real3.rma(t, pe, v, r, l, b, q);
}
static int rma4(struct harness_transport_v4 *t, int pe, harness_rma_verb v, harness_rma_memdesc *r,
                harness_rma_memdesc *l, harness_rma_bytesdesc b, int q) {
    if (rma_fault(t->my_pe, &v, &b)) return 0;
    return real4.rma(t, pe, v, r, l, b, q);
}

static int amo3(struct harness_transport_v3 *t, int pe, void *cur, harness_amo_verb v, harness_amo_memdesc *m,
                harness_amo_bytesdesc b, int q) {
    harness_amo_memdesc mm;
    if (fault == F_WRONG_ADD && v.op == HARNESS_AMO_ADD && m) {
        mm = *m;
        mm.val += 1;
        m = &mm;
    }
    return real3.amo(t, pe, cur, v, m, b, q);
}
static int amo4(struct harness_transport_v4 *t, int pe, void *cur, harness_amo_verb v, harness_amo_memdesc *m,
                harness_amo_bytesdesc b, int q) {
    harness_amo_memdesc mm;
    if (fault == F_WRONG_ADD && v.op == HARNESS_AMO_ADD && m) {
        mm = *m;
        mm.val += 1;
        m = &mm;
    }
    return real4.amo(t, pe, cur, v, m, b, q);
}

static int quiet3(struct harness_transport_v3 *t, int pe, int q) {
    hang_if(t->my_pe);
    return real3.quiet(t, pe, q);
}
static int quiet4(struct harness_transport_v4 *t, int pe, int q) {
    hang_if(t->my_pe);
    return real4.quiet(t, pe, q);
}

static int connect3(struct harness_transport_v3 *t, int *dev, int n) {
    if (fault == F_STRAY_BARRIER && t->my_pe == 1) t->boot_handle->barrier(t->boot_handle);
    return real3.connect_endpoints(t, dev, n);
}
static int connect4(struct harness_transport_v4 *t, int *dev, int n, int *qps, int nq) {
    if (fault == F_STRAY_BARRIER && t->my_pe == 1 && nq == 0) t->boot_handle->barrier(t->boot_handle);
    return real4.connect_endpoints(t, dev, n, qps, nq);
}

int nvshmemt_init(void **out, void *table, int api_version) {
    const char *path = getenv("HARNESS_SHIM_REAL");
    const char *f = getenv("HARNESS_SHIM_FAULT");
    if (!path) {
        fprintf(stderr, "fault_shim: set HARNESS_SHIM_REAL to the transport library\n");
        return 7;
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    harness_transport_init_fn init = dl ? (harness_transport_init_fn)(uintptr_t)dlsym(dl, "nvshmemt_init") : NULL;
    if (!init) {
        fprintf(stderr, "fault_shim: cannot load %s: %s\n", path, dlerror());
        return 7;
    }
    fault = !f                               ? F_NONE
            : !strcmp(f, "drop_put")         ? F_DROP_PUT
            : !strcmp(f, "wrong_add")        ? F_WRONG_ADD
            : !strcmp(f, "crash_rma")        ? F_CRASH_RMA
            : !strcmp(f, "hang_quiet")       ? F_HANG_QUIET
            : !strcmp(f, "stray_barrier")    ? F_STRAY_BARRIER
                                             : -1;
    if (fault < 0) {
        fprintf(stderr, "fault_shim: unknown HARNESS_SHIM_FAULT '%s'\n", f);
        return 7;
    }
    int rc = init(out, table, api_version);
    if (rc || !out || !*out) return rc;
    if (HARNESS_API_MAJOR(api_version) == 3) {
        struct harness_transport_v3 *t = *out;
        real3 = t->host_ops;
        t->host_ops.rma = rma3;
        t->host_ops.amo = amo3;
        t->host_ops.quiet = quiet3;
        t->host_ops.connect_endpoints = connect3;
    } else {
        struct harness_transport_v4 *t = *out;
        real4 = t->host_ops;
        t->host_ops.rma = rma4;
        t->host_ops.amo = amo4;
        t->host_ops.quiet = quiet4;
        t->host_ops.connect_endpoints = connect4;
    }
    return 0;
}
