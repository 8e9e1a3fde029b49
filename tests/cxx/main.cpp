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

    // Bad arguments give an error code, not a crash; the library stays uninitialised.
    check(nvshmemt_efa_gda_init_on_ep(nullptr, nullptr) < 0,
          "nvshmemt_efa_gda_init_on_ep(NULL, NULL) fails");
    check(nvshmemt_efa_gda_mode() < 0, "nvshmemt_efa_gda_mode() still negative");

    std::printf("%s\n", failures == 0 ? "PASS" : "FAILED");
    return failures == 0 ? 0 : 1;
}
