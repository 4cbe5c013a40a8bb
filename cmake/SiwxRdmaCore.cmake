# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Finds the installed rdma-core (libibverbs) and decides whether siwx can be
# built against it. Sets, in the including scope:
#
#   SIWX_RDMA_CORE_MAJOR    major version of rdma-core, e.g. 44
#   SIWX_PABI_VERSION       libibverbs private provider ABI, e.g. 34
#   SIWX_IBV_QP_EX_SIZE     sizeof(struct ibv_qp_ex) in that version (bytes)
#   SIWX_PROVIDER_SUFFIX    file name suffix libibverbs loads, "-rdmav34.so"
#   SIWX_PROVIDER_DIR       where libibverbs looks for providers
#   SIWX_DRIVER_CONF_DIR    where libibverbs reads *.driver files
#
# It also writes the major version to <build>/rdma-core-major: packages
# depend on the rdma-core range they were built for (debian/rules,
# rpm/siwx.spec), as struct ibv_qp_ex differs between majors.
#
# and the imported target PkgConfig::IBVERBS. Safe to include from several
# directories (each gets the variables).
#
# Why a range: the provider is built against our own declarations of the
# PABI-34 private structs (rdma-core does not install driver.h). Those are
# byte-identical from v36.0 to v56.x; v57 moved to PABI 57 (new symbol
# versions and file suffix). Devices without sysfs, which is all siwx has on a
# host without RDMA kernel support, can be opened only from v37.0 on
# (verbs_open_device()). Inside the range the one layout that moves is the
# public struct ibv_qp_ex embedded in the private struct verbs_qp: it grew in
# v44.0 (wr_atomic_write) and v45.0 (wr_flush).
# Facts: docs/provider-abi.md.

set(SIWX_RDMA_CORE_MIN 37)
set(SIWX_RDMA_CORE_MAX 56)

pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET GLOBAL libibverbs)

# The rdma-core version comes from libibverbs' pkg-config version
# "1.<api>.<rdma-core>.<patch>", or failing that from the library file name
# libibverbs.so.1.<api>.<rdma-core>.<patch>. SIWX_RDMA_CORE_VERSION can name
# it when neither works; it must agree with what is installed.
set(SIWX_RDMA_CORE_VERSION "" CACHE STRING
    "rdma-core major version to build for (empty: detect the installed one)")
set(siwx_installed_version "")
if(IBVERBS_VERSION MATCHES "^[0-9]+\\.[0-9]+\\.([0-9]+)(\\.[0-9]+)?$")
  set(siwx_installed_version "${CMAKE_MATCH_1}")
else()
  find_library(siwx_ibverbs_library ibverbs HINTS ${IBVERBS_LIBRARY_DIRS})
  if(siwx_ibverbs_library)
    get_filename_component(siwx_ibverbs_real "${siwx_ibverbs_library}" REALPATH)
    get_filename_component(siwx_ibverbs_name "${siwx_ibverbs_real}" NAME)
    if(siwx_ibverbs_name MATCHES "^libibverbs\\.so\\.[0-9]+\\.[0-9]+\\.([0-9]+)(\\.[0-9]+)?$")
      set(siwx_installed_version "${CMAKE_MATCH_1}")
    endif()
  endif()
endif()
set(siwx_detected_version "${SIWX_RDMA_CORE_VERSION}")
if(siwx_detected_version STREQUAL "")
  set(siwx_detected_version "${siwx_installed_version}")
  if(NOT siwx_detected_version MATCHES "^[0-9]+$")
    message(FATAL_ERROR
      "siwx: cannot tell which rdma-core version is installed (libibverbs "
      "pkg-config version '${IBVERBS_VERSION}'). siwx supports rdma-core "
      "v${SIWX_RDMA_CORE_MIN} to v${SIWX_RDMA_CORE_MAX}; pass "
      "-DSIWX_RDMA_CORE_VERSION=<major> if you know it.")
  endif()
elseif(NOT siwx_detected_version MATCHES "^[0-9]+$")
  message(FATAL_ERROR
    "siwx: SIWX_RDMA_CORE_VERSION='${siwx_detected_version}' is not a major "
    "version number such as 44.")
endif()

if(siwx_detected_version LESS SIWX_RDMA_CORE_MIN)
  message(FATAL_ERROR
    "siwx: rdma-core v${siwx_detected_version} is too old. siwx needs "
    "v${SIWX_RDMA_CORE_MIN} to v${SIWX_RDMA_CORE_MAX}: before v37.0 "
    "libibverbs cannot open a device that has no sysfs entry, and siwx devices "
    "never have one. Install a newer libibverbs-dev (Debian 12 ships v44).")
elseif(siwx_detected_version GREATER SIWX_RDMA_CORE_MAX)
  if(siwx_detected_version LESS 59)
    set(siwx_new_pabi 57)
  elseif(siwx_detected_version LESS 64)
    set(siwx_new_pabi 59)
  else()
    set(siwx_new_pabi "64 or later")
  endif()
  message(FATAL_ERROR
    "siwx: rdma-core v${siwx_detected_version} is not supported. Its "
    "libibverbs uses provider ABI ${siwx_new_pabi}, and siwx is written "
    "against provider ABI 34, which rdma-core v${SIWX_RDMA_CORE_MIN} to "
    "v${SIWX_RDMA_CORE_MAX} use. Build on a system with rdma-core "
    "v${SIWX_RDMA_CORE_MIN}..v${SIWX_RDMA_CORE_MAX} (Debian 12 ships v44).")
endif()

if(NOT siwx_installed_version STREQUAL "" AND
   NOT siwx_installed_version EQUAL siwx_detected_version)
  message(FATAL_ERROR
    "siwx: SIWX_RDMA_CORE_VERSION=${siwx_detected_version}, but the installed "
    "libibverbs is rdma-core v${siwx_installed_version}; siwx must be built "
    "against the headers of the version it will run with. Clear "
    "SIWX_RDMA_CORE_VERSION to use the installed one.")
endif()
set(SIWX_RDMA_CORE_MAJOR ${siwx_detected_version})
set(SIWX_PABI_VERSION 34)
if(siwx_detected_version LESS 44)
  set(SIWX_IBV_QP_EX_SIZE 344)
elseif(siwx_detected_version EQUAL 44)
  set(SIWX_IBV_QP_EX_SIZE 352)
else()
  set(SIWX_IBV_QP_EX_SIZE 360)
endif()
set(SIWX_PROVIDER_SUFFIX "-rdmav${SIWX_PABI_VERSION}.so")

include(GNUInstallDirs)
set(SIWX_PROVIDER_DIR "${CMAKE_INSTALL_FULL_LIBDIR}/libibverbs" CACHE PATH
    "Directory libibverbs loads providers from")
set(SIWX_DRIVER_CONF_DIR "${CMAKE_INSTALL_FULL_SYSCONFDIR}/libibverbs.d" CACHE PATH
    "Directory libibverbs reads *.driver files from")

# Included by every room that needs the results; say it once.
get_property(siwx_reported GLOBAL PROPERTY SIWX_RDMA_CORE_REPORTED)
if(NOT siwx_reported)
  set_property(GLOBAL PROPERTY SIWX_RDMA_CORE_REPORTED TRUE)
  file(WRITE ${PROJECT_BINARY_DIR}/rdma-core-major "${siwx_detected_version}\n")
  message(STATUS "siwx: rdma-core v${siwx_detected_version}, provider ABI "
                 "${SIWX_PABI_VERSION}, ibv_qp_ex ${SIWX_IBV_QP_EX_SIZE} bytes")
endif()
