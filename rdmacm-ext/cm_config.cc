// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "rdmacm-ext/cm_config.h"

#include <strings.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/util/log.h"

namespace siwx::cm {
namespace {

bool Equals(std::string_view a, const char* b) {
  return a.size() == std::strlen(b) && strncasecmp(a.data(), b, a.size()) == 0;
}

std::string Problem(const char* name, const char* value, const char* expected) {
  return std::string(name) + "='" + value + "' is not " + expected;
}

void ParseDialect(const char* value, CmConfig& config) {
  const std::string_view v(value);
  if (Equals(v, "v2")) {
    config.mpa.dialect = mpa::MpaDialect::kV2;
  } else if (Equals(v, "v1-rtr")) {
    config.mpa.dialect = mpa::MpaDialect::kV1Rtr;
  } else if (Equals(v, "v1")) {
    config.mpa.dialect = mpa::MpaDialect::kV1;
  } else {
    config.problems.push_back(Problem("SIWX_MPA_DIALECT", value, "v2, v1-rtr or v1 (using v2)"));
  }
}

void ParsePolicy(const char* name, const char* value, Policy& out, CmConfig& config) {
  const std::string_view v(value);
  if (Equals(v, "allow")) {
    out = Policy::kAllow;
  } else if (Equals(v, "require")) {
    out = Policy::kRequire;
  } else if (Equals(v, "refuse")) {
    out = Policy::kRefuse;
  } else {
    config.problems.push_back(Problem(name, value, "allow, require or refuse (using allow)"));
  }
}

void ParsePeerToPeer(const char* value, CmConfig& config) {
  const std::string_view v(value);
  if (Equals(v, "off")) {
    config.mpa.peer_to_peer = false;
    return;
  }
  if (Equals(v, "on")) {
    config.mpa.peer_to_peer = true;
    config.mpa.rtr_types = {true, true, true};
    return;
  }
  mpa::RtrTypeSet types{false, false, false};
  std::size_t start = 0;
  bool ok = !v.empty();
  while (ok && start <= v.size()) {
    std::size_t end = v.find(',', start);
    if (end == std::string_view::npos) end = v.size();
    const std::string_view item = v.substr(start, end - start);
    if (Equals(item, "send")) {
      types.send = true;
    } else if (Equals(item, "write")) {
      types.write = true;
    } else if (Equals(item, "read")) {
      types.read = true;
    } else {
      ok = false;
    }
    start = end + 1;
  }
  if (!ok || !types.Any()) {
    config.problems.push_back(Problem("SIWX_MPA_P2P", value,
                                      "off, on or a comma list of send, write, read (using off)"));
    return;
  }
  config.mpa.peer_to_peer = true;
  config.mpa.rtr_types = types;
}

void ParseOnOff(const char* name, const char* value, bool& out, CmConfig& config) {
  const std::string_view v(value);
  if (v == "1") {
    out = true;
  } else if (v == "0") {
    out = false;
  } else {
    config.problems.push_back(Problem(name, value, "1 or 0") + " (using " + (out ? "1" : "0") +
                              ")");
  }
}

void ParseMs(const char* name, const char* value, std::chrono::milliseconds& out,
             CmConfig& config) {
  const std::string_view v(value);
  std::int64_t ms = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), ms);
  if (ec != std::errc() || ptr != v.data() + v.size() || ms < kMinTimeoutMs || ms > kMaxTimeoutMs) {
    config.problems.push_back(Problem(name, value, "a number of milliseconds in 1..600000") +
                              " (using " + std::to_string(out.count()) + ")");
    return;
  }
  out = std::chrono::milliseconds(ms);
}

void ParseCount(const char* name, const char* value, std::size_t& out, CmConfig& config) {
  const std::string_view v(value);
  std::int64_t n = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || ptr != v.data() + v.size() || n < 1 || n > kMaxHalfOpen) {
    config.problems.push_back(Problem(name, value, "a number in 1..65536") + " (using " +
                              std::to_string(out) + ")");
    return;
  }
  out = static_cast<std::size_t>(n);
}

}  // namespace

CmConfig ParseCmConfig(const std::function<const char*(const char*)>& lookup) {
  CmConfig config;
  auto get = [&](const char* name) -> const char* {
    const char* v = lookup(name);
    return (v != nullptr && v[0] != '\0') ? v : nullptr;
  };
  if (const char* v = get("SIWX_MPA_DIALECT")) ParseDialect(v, config);
  if (const char* v = get("SIWX_MPA_CRC")) ParsePolicy("SIWX_MPA_CRC", v, config.mpa.crc, config);
  if (const char* v = get("SIWX_MPA_MARKERS")) {
    ParsePolicy("SIWX_MPA_MARKERS", v, config.mpa.markers, config);
  }
  if (const char* v = get("SIWX_MPA_P2P")) ParsePeerToPeer(v, config);
  if (const char* v = get("SIWX_MPA_LARGE_FPDUS")) {
    ParseOnOff("SIWX_MPA_LARGE_FPDUS", v, config.mpa.large_fpdus, config);
  }
  if (const char* v = get("SIWX_CM_CONNECT_TIMEOUT_MS")) {
    ParseMs("SIWX_CM_CONNECT_TIMEOUT_MS", v, config.mpa.connect_timeout, config);
  }
  if (const char* v = get("SIWX_MPA_TIMEOUT_MS")) {
    ParseMs("SIWX_MPA_TIMEOUT_MS", v, config.mpa.mpa_timeout, config);
  }
  if (const char* v = get("SIWX_CM_HALF_OPEN_MAX")) {
    ParseCount("SIWX_CM_HALF_OPEN_MAX", v, config.half_open_max, config);
  }
  if (const char* v = get("SIWX_CM_HALF_OPEN_PER_SOURCE")) {
    ParseCount("SIWX_CM_HALF_OPEN_PER_SOURCE", v, config.half_open_per_source, config);
  }
  config.half_open_per_source = std::min(config.half_open_per_source, config.half_open_max);
  if (config.mpa.peer_to_peer && config.mpa.dialect != mpa::MpaDialect::kV2) {
    config.problems.push_back("SIWX_MPA_P2P needs SIWX_MPA_DIALECT=v2 (peer-to-peer RTR is "
                              "RFC 6581's); not requesting it");
    config.mpa.peer_to_peer = false;
  }
  return config;
}

const CmConfig& GetCmConfig() {
  // The one place the CM reads the environment. Never destroyed: the CM
  // thread may still read it while the process exits.
  static const CmConfig* config = [] {
    auto* c = new CmConfig(ParseCmConfig([](const char* name) { return std::getenv(name); }));
    for (const std::string& p : c->problems) SIWX_LOG(kWarn, "CM: %s", p.c_str());
    return c;
  }();
  return *config;
}

mpa::NegotiatorConfig MakeNegotiatorConfig(const MpaOptions& options, mpa::MpaRole role,
                                           std::uint16_t ird, std::uint16_t ord) {
  mpa::NegotiatorConfig c;
  c.role = role;
  c.dialect = options.dialect;
  switch (options.crc) {
    case Policy::kAllow: c.crc = mpa::CrcPolicy::kAllow; break;
    case Policy::kRequire: c.crc = mpa::CrcPolicy::kRequire; break;
    case Policy::kRefuse: c.crc = mpa::CrcPolicy::kRefuse; break;
  }
  c.markers_wanted = options.markers == Policy::kRequire;
  c.markers_can_send = options.markers != Policy::kRefuse;
  c.ird = ird;
  c.ord = ord;
  c.peer_to_peer = role == mpa::MpaRole::kInitiator && options.peer_to_peer &&
                   options.dialect == mpa::MpaDialect::kV2;
  c.rtr_types = options.rtr_types;
  c.large_fpdus = options.large_fpdus;
  c.startup_timeout = std::chrono::duration_cast<mpa::MpaTime>(options.mpa_timeout);
  // The first FPDU arrives after the handover; the engine enforces that
  // wait (siwx_stream_params.first_fpdu_timeout_ms), not the negotiator.
  c.first_fpdu_timeout = mpa::MpaTime::zero();
  return c;
}

std::string_view PolicyName(Policy p) {
  switch (p) {
    case Policy::kAllow: return "allow";
    case Policy::kRequire: return "require";
    case Policy::kRefuse: return "refuse";
  }
  return "unknown";
}

std::string_view DialectToken(mpa::MpaDialect d) {
  switch (d) {
    case mpa::MpaDialect::kV1: return "v1";
    case mpa::MpaDialect::kV1Rtr: return "v1-rtr";
    case mpa::MpaDialect::kV2: return "v2";
  }
  return "unknown";
}

}  // namespace siwx::cm
