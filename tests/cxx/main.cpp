// C++ consumer of the installed package: links NvshmemEfaGda::nvshmem_efa_gda and checks what the
// library answers before anything is initialised. Exit status 0 only if every answer is expected.
#include <cstdio>
#include <cstring>

#include "nvshmem_efa_gda.h"

#ifndef NEGDA_EXPECTED_VERSION
#error "NEGDA_EXPECTED_VERSION comes from the package (NvshmemEfaGda_VERSION)"
#endif

namespace {
int failures = 0;

void check(bool ok, const char *what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) ++failures;
}
}  // namespace

int main() {
    const char *version = nvshmem_efa_gda_version();
    std::printf("library version: %s (package %s)\n", version ? version : "(null)",
                NEGDA_EXPECTED_VERSION);
    check(version != nullptr && std::strcmp(version, NEGDA_EXPECTED_VERSION) == 0,
          "nvshmem_efa_gda_version() equals the package version");

    check(nvshmemt_efa_gda_mode() < 0, "nvshmemt_efa_gda_mode() is negative before init");

    // Bad arguments give a published error code, not a crash; the library stays uninitialised.
    check(nvshmemt_efa_gda_init_on_ep(nullptr, nullptr) == NVSHMEM_EFA_ERROR_INVALID_VALUE,
          "nvshmemt_efa_gda_init_on_ep(NULL, NULL) returns NVSHMEM_EFA_ERROR_INVALID_VALUE");
    const char *why = nvshmem_efa_gda_last_error();
    check(why != nullptr && std::strstr(why, "nvshmemt_efa_gda_init_on_ep") != nullptr,
          "nvshmem_efa_gda_last_error() names the failed call");
    check(nvshmemt_efa_gda_mode() < 0, "nvshmemt_efa_gda_mode() still negative");
    check(nvshmemt_efa_gda_remove_heap_chunk(0) == NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
          "nvshmemt_efa_gda_remove_heap_chunk() before init returns "
          "NVSHMEM_EFA_ERROR_NOT_INITIALIZED");

    std::printf("%s\n", failures == 0 ? "PASS" : "FAILED");
    return failures == 0 ? 0 : 1;
}
