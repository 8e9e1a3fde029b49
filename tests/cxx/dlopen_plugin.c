/* Opens NVSHMEM plugin names the way NVSHMEM does (dlopen(name, RTLD_NOW), dlsym(handle,
 * "nvshmemt_init")) and checks that every name resolves to the one copy of libnvshmem_efa_gda.
 *
 *   dlopen_plugin <expected library dir> <plugin path or name>...
 *
 * Exit status 0 when each name opens, nvshmemt_init resolves inside <dir>/libnvshmem_efa_gda.so,
 * all names give the same address and the process has mapped exactly one libnvshmem_efa_gda. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_copies;

static int count_copies(struct dl_phdr_info *info, size_t size, void *data) {
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    (void)size;
    (void)data;
    base = base ? base + 1 : name;
    if (base && strncmp(base, "libnvshmem_efa_gda.so", 21) == 0) n_copies++;
    return 0;
}

int main(int argc, char **argv) {
    char want[PATH_MAX], got[PATH_MAX];
    void *first = NULL;
    int failures = 0;

    if (argc < 3) {
        fprintf(stderr, "usage: %s <expected library dir> <plugin>...\n", argv[0]);
        return 2;
    }
    if (!realpath(argv[1], want)) {
        perror(argv[1]);
        return 2;
    }
    strncat(want, "/libnvshmem_efa_gda.so", sizeof(want) - strlen(want) - 1);
    for (int i = 2; i < argc; i++) {
        Dl_info info;
        void *h = dlopen(argv[i], RTLD_NOW);
        void *init;

        if (!h) {
            printf("FAIL: dlopen(%s): %s\n", argv[i], dlerror());
            failures++;
            continue;
        }
        init = dlsym(h, "nvshmemt_init");
        if (!init) {
            printf("FAIL: dlsym(%s, nvshmemt_init): %s\n", argv[i], dlerror());
            failures++;
            continue;
        }
        if (!dladdr(init, &info) || !info.dli_fname || !realpath(info.dli_fname, got)) {
            printf("FAIL: %s: cannot tell which object defines nvshmemt_init\n", argv[i]);
            failures++;
            continue;
        }
        if (strcmp(got, want) != 0) {
            printf("FAIL: %s: nvshmemt_init comes from %s, expected %s\n", argv[i], got, want);
            failures++;
            continue;
        }
        if (first && init != first) {
            printf("FAIL: %s: nvshmemt_init at %p, another name gave %p\n", argv[i], init, first);
            failures++;
            continue;
        }
        first = init;
        printf("ok: %s -> nvshmemt_init in %s\n", argv[i], got);
    }
    dl_iterate_phdr(count_copies, NULL);
    if (n_copies != 1) {
        printf("FAIL: %d copies of libnvshmem_efa_gda are mapped\n", n_copies);
        failures++;
    } else {
        printf("ok: one copy of libnvshmem_efa_gda in the process\n");
    }
    return failures ? 1 : 0;
}
