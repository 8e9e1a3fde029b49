/* C consumer built with `pkg-config --cflags --libs nvshmem-efa-gda` (tests/cxx/run.sh). */
#include <stdio.h>
#include <string.h>

#include "nvshmem_efa_gda.h"

int main(int argc, char **argv) {
    const char *version = nvshmem_efa_gda_version();
    if (argc != 2 || version == NULL || strcmp(version, argv[1]) != 0) {
        printf("FAIL: version %s, expected %s\n", version ? version : "(null)",
               argc == 2 ? argv[1] : "?");
        return 1;
    }
    if (nvshmemt_efa_gda_mode() >= 0) {
        printf("FAIL: nvshmemt_efa_gda_mode() is not negative before init\n");
        return 1;
    }
    printf("ok: C consumer through pkg-config, version %s\n", version);
    return 0;
}
