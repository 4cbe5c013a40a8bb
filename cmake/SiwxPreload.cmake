# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Sanitizer builds of code that is preloaded into programs that were not built
# with sanitizers (libsiwx-shim.so and the provider it pulls in, under
# siwx-run, e.g. into ibv_devinfo).
#
# A sanitizer runtime must be the first library of the process, so it cannot
# arrive as a dependency of a preloaded library: siwx-run preloads it in front
# of the shim. For that, every siwx binary that runs under siwx-run must use
# the shared runtime (clang links a static one into executables by default;
# -shared-libsan switches; gcc uses the shared one already).
#
# ThreadSanitizer cannot work this way: its shared runtime crashes when it is
# preloaded (clang 14: even into /bin/true). In TSan builds the libraries
# leave the runtime's symbols undefined and get them from the executable:
# siwx's own TSan-built test programs can run under siwx-run, uninstrumented
# tools cannot (SIWX_PRELOAD_WORKS is OFF).
#
# Sets SIWX_SANITIZER_RUNTIME (the runtime's path, empty without sanitizers),
# SIWX_PRELOAD_WORKS and SIWX_LIBRARY_LINK_CHECKS (linker options that refuse
# undefined symbols, where the sanitizer allows them), and defines
# siwx_preloadable(<target>).
#
# Also sets SIWX_PRIVATE_LIBDIR (relative to the prefix) and
# SIWX_PRIVATE_FULL_LIBDIR: where the preloaded libraries are installed,
# <libdir>/siwx. They are not for linking against and have no versioned
# SONAME, so they stay out of the public libdir (as Debian's librspreload
# does in <libdir>/rsocket).

include(GNUInstallDirs)
set(SIWX_PRIVATE_LIBDIR ${CMAKE_INSTALL_LIBDIR}/siwx)
set(SIWX_PRIVATE_FULL_LIBDIR ${CMAKE_INSTALL_FULL_LIBDIR}/siwx)

set(SIWX_SANITIZER_RUNTIME "")
set(SIWX_PRELOAD_LINK_OPTIONS "")
set(SIWX_PRELOAD_WORKS ON)
set(SIWX_LIBRARY_LINK_CHECKS -Wl,--no-undefined -Wl,-z,defs)
if(SIWX_SANITIZE MATCHES "thread")
  set(SIWX_PRELOAD_WORKS OFF)
  set(SIWX_LIBRARY_LINK_CHECKS "")
elseif(SIWX_SANITIZE)
  set(siwx_arch ${CMAKE_SYSTEM_PROCESSOR})
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    if(SIWX_SANITIZE MATCHES "address")
      set(siwx_runtime libclang_rt.asan-${siwx_arch}.so)
    else()
      set(siwx_runtime libclang_rt.ubsan_standalone-${siwx_arch}.so)
    endif()
    set(SIWX_PRELOAD_LINK_OPTIONS -shared-libsan)
  else()
    if(SIWX_SANITIZE MATCHES "address")
      set(siwx_runtime libasan.so)
    else()
      set(siwx_runtime libubsan.so)
    endif()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${siwx_runtime}
                  OUTPUT_VARIABLE siwx_runtime_path OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${siwx_runtime_path}" OR NOT EXISTS "${siwx_runtime_path}")
    message(FATAL_ERROR "SIWX_SANITIZE=${SIWX_SANITIZE}: the shared sanitizer runtime "
                        "${siwx_runtime} of ${CMAKE_CXX_COMPILER} was not found; siwx-run "
                        "needs it to preload the shim. Install the compiler's runtime "
                        "package (libclang-rt-14-dev for clang 14).")
  endif()
  get_filename_component(SIWX_SANITIZER_RUNTIME "${siwx_runtime_path}" REALPATH)
endif()

function(siwx_preloadable target)
  if(SIWX_PRELOAD_LINK_OPTIONS)
    target_link_options(${target} PRIVATE ${SIWX_PRELOAD_LINK_OPTIONS})
  endif()
  # The C++ libraries it loads get TSan's runtime from the executable, C++
  # part included (operator new, the __cxa_guard_* of function-local
  # statics): a C program linked by the C driver lacks that part, and TSan
  # then reported every first use of a static initialized on another thread.
  if(SIWX_SANITIZE MATCHES "thread")
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
endfunction()
