// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// SendList: the octets its iovecs gather are the slices added, in order,
// with small slices copied and joined, and its limits kept.
#include "common/transport/send_list.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <span>
#include <vector>

namespace siwx::transport {
namespace {

std::vector<std::uint8_t> Gathered(const SendList& list) {
  std::vector<std::uint8_t> out;
  for (const iovec& v : list.iovecs()) {
    const auto* p = static_cast<const std::uint8_t*>(v.iov_base);
    out.insert(out.end(), p, p + v.iov_len);
  }
  return out;
}

std::vector<std::uint8_t> Pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7);
  return v;
}

// The lists are 32 KiB: on the heap, as the engine keeps them.
std::unique_ptr<SendList> NewList() { return std::make_unique<SendList>(); }

// Adds each slice whole to `list`; returns their concatenation, the octets
// the list must gather for them.
std::vector<std::uint8_t> AddEach(SendList& list,
                                  std::initializer_list<std::span<const std::uint8_t>> slices) {
  std::vector<std::uint8_t> added;
  for (std::span<const std::uint8_t> slice : slices) {
    EXPECT_TRUE(list.Add(slice.data(), slice.size()));
    added.insert(added.end(), slice.begin(), slice.end());
  }
  return added;
}

TEST(SendList, SmallSlicesAreCopiedIntoOneIovec) {
  // An FPDU's trailer, then the next FPDU's ULPDU_Length and header.
  const auto trailer = Pattern(6, 1), length = Pattern(2, 2), header = Pattern(14, 3);
  auto list = NewList();
  const auto expected = AddEach(*list, {trailer, length, header});
  ASSERT_EQ(list->iovecs().size(), 1u);
  EXPECT_EQ(list->octets(), 22u);
  EXPECT_EQ(Gathered(*list), expected);
}

TEST(SendList, LargeSlicesAreReferencedAndSmallOnesAroundThemCopied) {
  const auto head = Pattern(16, 1), payload = Pattern(1428, 2), trailer = Pattern(4, 3);
  auto list = NewList();
  const auto expected = AddEach(*list, {head, payload, trailer, head});
  ASSERT_EQ(list->iovecs().size(), 3u);
  EXPECT_NE(list->iovecs()[0].iov_base, head.data());
  EXPECT_EQ(list->iovecs()[1].iov_base, payload.data());
  EXPECT_EQ(list->iovecs()[2].iov_len, trailer.size() + head.size());
  EXPECT_EQ(Gathered(*list), expected);
}

TEST(SendList, ASliceThatContinuesThePreviousOneExtendsIt) {
  const auto buffer = Pattern(4096, 5);
  auto list = NewList();
  ASSERT_TRUE(list->Add(buffer.data(), 1000));
  ASSERT_TRUE(list->Add(buffer.data() + 1000, 3096));
  ASSERT_EQ(list->iovecs().size(), 1u);
  EXPECT_EQ(list->iovecs()[0].iov_base, buffer.data());
  EXPECT_EQ(list->iovecs()[0].iov_len, 4096u);
}

TEST(SendList, AFullListRefusesASliceWithoutChangingAndStillJoinsOne) {
  const auto buffer = Pattern(2 * SendList::kMaxIovecs * 256, 9);
  auto list = NewList();
  // Every other 256-octet piece: no two join.
  for (std::size_t i = 0; i < SendList::kMaxIovecs; ++i) {
    ASSERT_FALSE(list->full());
    ASSERT_TRUE(list->Add(buffer.data() + 2 * i * 256, 256));
  }
  ASSERT_TRUE(list->full());
  const std::size_t octets = list->octets();
  EXPECT_FALSE(list->Add(buffer.data(), 256));
  EXPECT_FALSE(list->Add(buffer.data(), 8));  // would need an iovec for its copy
  EXPECT_EQ(list->octets(), octets);
  EXPECT_EQ(list->iovecs().size(), SendList::kMaxIovecs);
  // The last piece's continuation needs no iovec.
  const std::size_t last = 2 * (SendList::kMaxIovecs - 1) * 256;
  EXPECT_TRUE(list->Add(buffer.data() + last + 256, 256));
  EXPECT_EQ(list->iovecs().back().iov_len, 512u);
  EXPECT_EQ(list->octets(), octets + 256);
}

TEST(SendList, SmallSlicesAreReferencedOnceTheCopiedOctetsRunOut) {
  const auto small = Pattern(SendList::kCopiedSliceOctets, 4), large = Pattern(512, 6);
  auto list = NewList();
  std::vector<std::uint8_t> expected;
  const std::size_t copies = SendList::kCopiedOctets / small.size();
  for (std::size_t i = 0; i < copies; ++i) {
    const auto added = AddEach(*list, {small, large});
    expected.insert(expected.end(), added.begin(), added.end());
  }
  for (const iovec& v : list->iovecs()) {
    if (v.iov_len == small.size()) {
      EXPECT_NE(v.iov_base, small.data());
    }
  }
  const auto added = AddEach(*list, {small});
  expected.insert(expected.end(), added.begin(), added.end());
  EXPECT_EQ(list->iovecs().back().iov_base, small.data());
  EXPECT_EQ(Gathered(*list), expected);
}

TEST(SendList, ClearEmptiesTheListAndItsCopiedOctets) {
  const auto small = Pattern(100, 1);
  auto list = NewList();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(list->Add(small.data(), small.size()));
  list->Clear();
  EXPECT_EQ(list->iovecs().size(), 0u);
  EXPECT_EQ(list->octets(), 0u);
  ASSERT_TRUE(list->Add(small.data(), small.size()));
  EXPECT_NE(list->iovecs()[0].iov_base, small.data());  // copied again from the start
  EXPECT_EQ(Gathered(*list), small);
}

TEST(SendList, RandomSlicesGatherToTheirConcatenation) {
  std::mt19937 rng(20261129);
  const auto source = Pattern(1 << 20, 11);
  for (int round = 0; round < 50; ++round) {
    auto list = NewList();
    std::vector<std::uint8_t> expected;
    std::size_t at = rng() % 1000;
    while (true) {
      const std::size_t n = rng() % 2 ? rng() % 40 : rng() % 3000;
      if (at + n > source.size()) break;
      if (!list->Add(source.data() + at, n)) break;
      expected.insert(expected.end(), source.begin() + at, source.begin() + at + n);
      // Sometimes continue in memory, sometimes jump.
      at += n + (rng() % 3 == 0 ? 0 : rng() % 64);
    }
    EXPECT_EQ(list->octets(), expected.size());
    EXPECT_EQ(Gathered(*list), expected);
  }
}

}  // namespace
}  // namespace siwx::transport
