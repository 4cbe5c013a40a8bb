// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// EventQueue (providers/siwx/event_queue.h): fixed-size records through a
// SOCK_SEQPACKET fd, with an in-memory backlog when the socket is full, and
// Purge taking unread records back.
#include "providers/siwx/event_queue.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

namespace siwx::provider {
namespace {

using Record = std::array<std::uint8_t, 8>;

Record MakeRecord(std::uint64_t value) {
  Record r;
  std::memcpy(r.data(), &value, sizeof(value));
  return r;
}

std::uint64_t ValueOf(ByteSpan bytes) {
  std::uint64_t value = 0;
  std::memcpy(&value, bytes.data(), sizeof(value));
  return value;
}

// Reads one record without blocking; nullopt when nothing is pending.
std::optional<std::uint64_t> ReadOne(int fd) {
  std::uint8_t buffer[16];
  const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  if (n < 0) return std::nullopt;
  EXPECT_EQ(n, 8);  // one record per read, never merged
  return ValueOf(ByteSpan(buffer, 8));
}

bool Readable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN) != 0;
}

TEST(ProviderEventQueueTest, RejectsRecordSizesOutsideOneTo64) {
  errno = 0;
  EXPECT_EQ(EventQueue::Create(0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(EventQueue::Create(EventQueue::kMaxRecordSize + 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  auto queue = EventQueue::Create(EventQueue::kMaxRecordSize);
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->record_size(), 64u);
}

TEST(ProviderEventQueueTest, DeliversRecordsInOrderOnePerRead) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  EXPECT_FALSE(Readable(queue->read_fd()));
  for (std::uint64_t v = 1; v <= 5; ++v) {
    const Record r = MakeRecord(v * 0x0101010101010101ull);
    ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
  }
  EXPECT_TRUE(Readable(queue->read_fd()));
  for (std::uint64_t v = 1; v <= 5; ++v) {
    EXPECT_EQ(ReadOne(queue->read_fd()), v * 0x0101010101010101ull);
  }
  EXPECT_EQ(ReadOne(queue->read_fd()), std::nullopt);
  EXPECT_EQ(queue->backlog_size(), 0u);
}

TEST(ProviderEventQueueTest, RefusesRecordsOfTheWrongSize) {
  auto queue = EventQueue::Create(16);
  ASSERT_NE(queue, nullptr);
  const std::uint8_t seven[7] = {};
  const std::uint8_t seventeen[17] = {};
  EXPECT_FALSE(queue->Post(ByteSpan(seven, 7)));
  EXPECT_FALSE(queue->Post(ByteSpan(seventeen, 17)));
  EXPECT_FALSE(Readable(queue->read_fd()));
}

TEST(ProviderEventQueueTest, BlockingReaderGetsExactlyOneRecord) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  const Record a = MakeRecord(0xAAAA);
  const Record b = MakeRecord(0xBBBB);
  ASSERT_TRUE(queue->Post(ByteSpan(a.data(), a.size())));
  ASSERT_TRUE(queue->Post(ByteSpan(b.data(), b.size())));
  // What ibv_get_cq_event does: a blocking read of exactly 8 octets.
  std::uint64_t value = 0;
  ASSERT_EQ(::read(queue->read_fd(), &value, sizeof(value)), 8);
  EXPECT_EQ(value, 0xAAAAu);
  ASSERT_EQ(::read(queue->read_fd(), &value, sizeof(value)), 8);
  EXPECT_EQ(value, 0xBBBBu);
}

TEST(ProviderEventQueueTest, FullSocketSpillsToBacklogAndConsumptionDrainsIt) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  // Post until the socket is full, then 100 more.
  std::uint64_t posted = 0;
  while (queue->backlog_size() == 0) {
    const Record r = MakeRecord(++posted);
    ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
    ASSERT_LT(posted, 1000000u);
  }
  for (int i = 0; i < 100; ++i) {
    const Record r = MakeRecord(++posted);
    ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
  }
  EXPECT_EQ(queue->backlog_size(), 101u);
  // The application reads everything, telling the queue after each record
  // (the provider's cq_event op): nothing is lost, the order holds.
  for (std::uint64_t expected = 1; expected <= posted; ++expected) {
    const std::optional<std::uint64_t> got = ReadOne(queue->read_fd());
    ASSERT_TRUE(got.has_value()) << "record " << expected << " missing";
    ASSERT_EQ(*got, expected);
    queue->OnConsumed();
  }
  EXPECT_EQ(ReadOne(queue->read_fd()), std::nullopt);
  EXPECT_EQ(queue->backlog_size(), 0u);
}

TEST(ProviderEventQueueTest, PurgeRemovesOnlyMatchingUnreadRecordsAndKeepsOrder) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  for (std::uint64_t v : {1, 2, 1, 3, 1, 4}) {
    const Record r = MakeRecord(v);
    ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
  }
  // The first record was already read by the application: it stays read.
  EXPECT_EQ(ReadOne(queue->read_fd()), 1u);
  const std::size_t removed =
      queue->Purge([](ByteSpan record) { return ValueOf(record) == 1; });
  EXPECT_EQ(removed, 2u);
  EXPECT_EQ(ReadOne(queue->read_fd()), 2u);
  EXPECT_EQ(ReadOne(queue->read_fd()), 3u);
  EXPECT_EQ(ReadOne(queue->read_fd()), 4u);
  EXPECT_EQ(ReadOne(queue->read_fd()), std::nullopt);
}

TEST(ProviderEventQueueTest, PurgeReachesIntoTheBacklog) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  std::uint64_t posted = 0;
  while (queue->backlog_size() < 10) {
    const Record r = MakeRecord(++posted);
    ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
    ASSERT_LT(posted, 1000000u);
  }
  // Remove every even record, in the socket and in the backlog.
  const std::size_t removed =
      queue->Purge([](ByteSpan record) { return ValueOf(record) % 2 == 0; });
  EXPECT_EQ(removed, posted / 2);
  for (std::uint64_t expected = 1; expected <= posted; expected += 2) {
    const std::optional<std::uint64_t> got = ReadOne(queue->read_fd());
    ASSERT_TRUE(got.has_value()) << "record " << expected << " missing";
    ASSERT_EQ(*got, expected);
    queue->OnConsumed();
  }
  EXPECT_EQ(ReadOne(queue->read_fd()), std::nullopt);
  EXPECT_EQ(queue->backlog_size(), 0u);
}

TEST(ProviderEventQueueTest, PurgeWithNoMatchChangesNothing) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(queue->Purge([](ByteSpan) { return true; }), 0u);  // empty
  const Record r = MakeRecord(9);
  ASSERT_TRUE(queue->Post(ByteSpan(r.data(), r.size())));
  EXPECT_EQ(queue->Purge([](ByteSpan) { return false; }), 0u);
  EXPECT_EQ(ReadOne(queue->read_fd()), 9u);
}

TEST(ProviderEventQueueTest, NonBlockingReaderSeesEagainWhenEmpty) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  const int flags = ::fcntl(queue->read_fd(), F_GETFL);
  ASSERT_EQ(::fcntl(queue->read_fd(), F_SETFL, flags | O_NONBLOCK), 0);
  std::uint64_t value;
  errno = 0;
  EXPECT_EQ(::read(queue->read_fd(), &value, sizeof(value)), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST(ProviderEventQueueTest, ReleasedReadEndOutlivesTheQueue) {
  int fd = -1;
  {
    auto queue = EventQueue::Create(16);
    ASSERT_NE(queue, nullptr);
    queue->ReleaseReadFd();
    fd = queue->read_fd();
  }
  // Still open (libibverbs closes it), and the writer is gone: end of file.
  ASSERT_NE(::fcntl(fd, F_GETFD), -1);
  std::uint8_t buffer[16];
  EXPECT_EQ(::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT), 0);
  ::close(fd);
}

TEST(ProviderEventQueueTest, OwnedReadEndClosesWithTheQueue) {
  int fd = -1;
  {
    auto queue = EventQueue::Create(8);
    ASSERT_NE(queue, nullptr);
    fd = queue->read_fd();
  }
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(ProviderEventQueueTest, DescriptorsAreCloseOnExec) {
  auto queue = EventQueue::Create(8);
  ASSERT_NE(queue, nullptr);
  EXPECT_EQ(::fcntl(queue->read_fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

}  // namespace
}  // namespace siwx::provider
