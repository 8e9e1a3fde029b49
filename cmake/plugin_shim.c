/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NVSHMEM plugin-name shim.
 *
 * NVSHMEM opens its remote transport as dlopen("nvshmem_transport_libfabric.so.<ABI major>") and
 * reuses a library that is already loaded (LD_PRELOAD) only when that library's SONAME equals the
 * name. cmake/install.sh builds this file once per ABI major into an object that carries exactly
 * that SONAME and nothing else: it depends (DT_NEEDED) on libnvshmem_efa_gda.so, found through
 * RUNPATH $ORIGIN, and NVSHMEM's dlsym(handle, "nvshmemt_init") finds the library's entry point
 * among the handle's dependencies. Whichever name NVSHMEM asks for, the process holds one copy of
 * libnvshmem_efa_gda and of its state.
 */
#ifndef NVSHMEM_EFA_GDA_PLUGIN_ABI
#error "build with -DNVSHMEM_EFA_GDA_PLUGIN_ABI=<NVSHMEM transport ABI major>"
#endif

#define NEGDA_STR2(x) #x
#define NEGDA_STR(x) NEGDA_STR2(x)
#define NEGDA_CAT2(a, b) a##b
#define NEGDA_CAT(a, b) NEGDA_CAT2(a, b)

/* Marker naming the plugin file this shim stands for (visible with nm -D and strings). */
__attribute__((visibility("default"), used)) const char NEGDA_CAT(
    nvshmem_efa_gda_plugin_shim_abi, NVSHMEM_EFA_GDA_PLUGIN_ABI)[] =
    "nvshmem_transport_libfabric.so." NEGDA_STR(NVSHMEM_EFA_GDA_PLUGIN_ABI);
