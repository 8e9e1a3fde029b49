# nvshmem_efa_gda.cmake: the CMake snippet that NVSHMEM's patched libfabric transport build includes
# (patches/nvshmem-*/0001-*.patch). It provides the imported target NvshmemEfaGda::nvshmem_efa_gda and
#
#   nvshmem_efa_gda_link(<target>)
#
# which links <target> to libnvshmem_efa_gda, adds the include directories (include/ and cuda/) and,
# unless NVSHMEM_EFA_GDA_RPATH is OFF, puts the library's directory into the target's build and
# install RPATH.
#
# Where the library comes from depends on where this file is:
#  - installed (<prefix>/lib/cmake/NvshmemEfaGda/, by cmake/install.sh): the installed package;
#  - the source tree (<root>/cmake/): <root>/include, <root>/cuda and the library that
#    `cargo build --release` made (<root>/target/release), or NVSHMEM_EFA_GDA_LIBRARY.
# NVSHMEM's patched CMake finds this file through the cache variable NVSHMEM_EFA_GDA_ROOT (install
# prefix or source tree; the environment variable of that name is its default) or CMAKE_PREFIX_PATH.
include_guard(GLOBAL)

option(NVSHMEM_EFA_GDA_RPATH "Put the directory of libnvshmem_efa_gda into the RPATH of what links it" ON)

if(NOT TARGET NvshmemEfaGda::nvshmem_efa_gda)
  if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/NvshmemEfaGdaConfig.cmake")
    # <prefix>/lib/cmake/NvshmemEfaGda -> <prefix>
    get_filename_component(_negda_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
    find_package(NvshmemEfaGda CONFIG REQUIRED NO_DEFAULT_PATH PATHS "${_negda_prefix}")
    unset(_negda_prefix)
  else()
    get_filename_component(_negda_root "${CMAKE_CURRENT_LIST_DIR}" DIRECTORY)
    set(NVSHMEM_EFA_GDA_LIBRARY "" CACHE FILEPATH
        "libnvshmem_efa_gda.so to link when NVSHMEM_EFA_GDA_ROOT is the source tree (default: <root>/target/release)")
    if(NVSHMEM_EFA_GDA_LIBRARY)
      set(_negda_lib "${NVSHMEM_EFA_GDA_LIBRARY}")
    else()
      set(_negda_lib "${_negda_root}/target/release/libnvshmem_efa_gda.so")
    endif()
    if(NOT EXISTS "${_negda_lib}")
      message(FATAL_ERROR "nvshmem-efa-gda: ${_negda_lib} does not exist. Build it (cargo build --release "
                          "in ${_negda_root}), set NVSHMEM_EFA_GDA_LIBRARY, or point NVSHMEM_EFA_GDA_ROOT "
                          "at a prefix made by cmake/install.sh.")
    endif()
    if(NOT EXISTS "${_negda_root}/include/nvshmem_efa_gda.h")
      message(FATAL_ERROR "nvshmem-efa-gda: ${_negda_root}/include/nvshmem_efa_gda.h does not exist.")
    endif()
    set(_negda_inc "${_negda_root}/include")
    if(IS_DIRECTORY "${_negda_root}/cuda")
      list(APPEND _negda_inc "${_negda_root}/cuda")
    endif()
    add_library(NvshmemEfaGda::nvshmem_efa_gda SHARED IMPORTED)
    # IMPORTED_NO_SONAME: link with -L<dir> -lnvshmem_efa_gda, so that DT_NEEDED names the library
    # and not the path it had at build time (cargo's cdylib carries no SONAME of its own).
    set_target_properties(NvshmemEfaGda::nvshmem_efa_gda PROPERTIES
      IMPORTED_LOCATION "${_negda_lib}"
      IMPORTED_NO_SONAME TRUE
      INTERFACE_INCLUDE_DIRECTORIES "${_negda_inc}")
    message(STATUS "nvshmem-efa-gda: ${_negda_lib} (source tree ${_negda_root})")
    unset(_negda_lib)
    unset(_negda_inc)
    unset(_negda_root)
  endif()
endif()

function(nvshmem_efa_gda_link target)
  if(NOT TARGET "${target}")
    message(FATAL_ERROR "nvshmem_efa_gda_link: no target named '${target}'")
  endif()
  target_link_libraries(${target} PRIVATE NvshmemEfaGda::nvshmem_efa_gda)
  if(NVSHMEM_EFA_GDA_RPATH)
    get_target_property(_loc NvshmemEfaGda::nvshmem_efa_gda IMPORTED_LOCATION)
    get_filename_component(_dir "${_loc}" DIRECTORY)
    set_property(TARGET ${target} APPEND PROPERTY BUILD_RPATH "${_dir}")
    set_property(TARGET ${target} APPEND PROPERTY INSTALL_RPATH "${_dir}")
  endif()
endfunction()
