/* dlsym_owner <library> <symbol> <expected object>: opens <library> as NVSHMEM opens a transport
 * (dlopen RTLD_NOW, then dlsym on the handle) and checks which loaded object defines <symbol>.
 * Exit status 0 when it is <expected object>. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    char want[PATH_MAX], got[PATH_MAX];
    Dl_info info;
    void *h, *sym;

    if (argc != 4) {
        fprintf(stderr, "usage: %s <library> <symbol> <expected object>\n", argv[0]);
        return 2;
    }
    if (!realpath(argv[3], want)) {
        perror(argv[3]);
        return 2;
    }
    h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("FAIL: dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
    sym = dlsym(h, argv[2]);
    if (!sym) {
        printf("FAIL: dlsym(%s): %s\n", argv[2], dlerror());
        return 1;
    }
    if (!dladdr(sym, &info) || !info.dli_fname || !realpath(info.dli_fname, got)) {
        printf("FAIL: cannot tell which object defines %s\n", argv[2]);
        return 1;
    }
    printf("%s: %s defined by %s\n", strcmp(got, want) == 0 ? "ok" : "FAIL", argv[2], got);
    return strcmp(got, want) == 0 ? 0 : 1;
}
