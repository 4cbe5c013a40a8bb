// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// FPDUs with markers and CRC written out octet by octet, for the framer and
// parser tests. RFC 5044 4.3, 4.4: the CRC covers the FPDU as sent, markers
// included: a marker inside the ULPDU, one between the pad and the CRC
// field, and the one in front of the ULPDU_Length field (FPDUPTR 0, which
// belongs to the FPDU that follows it, RFC 5044 7.1.2 rule 7).
//
// The CRC values were computed once, apart from the code under test, by a
// bitwise CRC32c in Python (reflected polynomial 0x82F63B78, initial value
// and final XOR 0xFFFFFFFF, checked against the RFC 3720 B.4 vectors) over
// every octet before the CRC field, and are sent least significant octet
// first. The value the same FPDU would carry if markers were left out of
// the CRC is given for each: a receiver or sender that skips markers
// disagrees on exactly these octets.
#pragma once

#include <cstdint>
#include <vector>

namespace siwx::mpa::crc_vectors {

using Bytes = std::vector<std::uint8_t>;

// An untagged Send, MSN 1, payload "abcd": the first FPDU of a stream with
// markers (grid offset 0), so the special first marker 0x00000000 comes
// first (RFC 5044 7.1.2 rule 7).
inline const Bytes kSendUlpdu = {
    0x41, 0x43, 0x00, 0x00, 0x00, 0x00,              // controls, RsvdULP
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  // QN 0, MSN 1
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x61, 0x62, 0x63, 0x64,                          // "abcd"
};
inline const Bytes kSendAfterFirstMarker = {
    0x00, 0x00, 0x00, 0x00,                          // first marker, FPDUPTR 0
    0x00, 0x16,                                      // ULPDU_Length = 22
    0x41, 0x43, 0x00, 0x00, 0x00, 0x00,              // controls, RsvdULP
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  // QN 0, MSN 1
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x61, 0x62, 0x63, 0x64,                          // "abcd"
    0xf6, 0x4f, 0x7f, 0xe1,  // CRC32c 0xE17F4FF6 over the 28 octets before
                             // (0x924D6471 without the marker)
};

// A tagged RDMA Write of one octet: 15-octet ULPDU, 3 pad octets.
inline const Bytes kWriteUlpdu = {
    0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,              // T=1 L=1, Write, STag
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO
    0x5A,                                            // payload
};

// kWriteUlpdu starting at grid offset 504: the marker comes 8 octets in,
// inside the ULPDU, and points 8 back.
inline const Bytes kWriteWithMarkerInUlpdu = {
    0x00, 0x0F,                                      // ULPDU_Length = 15
    0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,              // T=1 L=1, Write, STag
    0x00, 0x00, 0x00, 0x08,                          // marker, FPDUPTR 8
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO
    0x5A,                                            // payload
    0x00, 0x00, 0x00,                                // pad
    0xa1, 0xb5, 0x57, 0xa5,  // CRC32c 0xA557B5A1 over the 24 octets before
                             // (0xEC59E826 without the marker)
};

// kWriteUlpdu starting at grid offset 492: the marker falls between the pad
// and the CRC field, 20 octets after ULPDU_Length.
inline const Bytes kWriteWithMarkerBeforeCrc = {
    0x00, 0x0F,                                      // ULPDU_Length = 15
    0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,              // T=1 L=1, Write, STag
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,  // TO
    0x5A,                                            // payload
    0x00, 0x00, 0x00,                                // pad
    0x00, 0x00, 0x00, 0x14,                          // marker, FPDUPTR 20
    0x85, 0x24, 0x83, 0xf9,  // CRC32c 0xF9832485 over the 24 octets before
                             // (0xEC59E826 without the marker)
};

}  // namespace siwx::mpa::crc_vectors
