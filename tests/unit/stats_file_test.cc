// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The statistics file `siwx stat` reads: fixed layout, slots, the reader's
// checks (magic, version, sizes, a process that is gone).
#include "common/stats/stats_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace siwx::stats {
namespace {

std::string TempPath(const char* name) {
  return ::testing::TempDir() + "/siwx-stats-test-" + std::to_string(::getpid()) + "-" + name;
}

// Offsets are the file format: a reader built from another version of siwx
// depends on them.
TEST(StatsLayout, OffsetsAreFixed) {
  EXPECT_EQ(sizeof(FileHeader), 256u);
  EXPECT_EQ(offsetof(FileHeader, magic), 0u);
  EXPECT_EQ(offsetof(FileHeader, version), 8u);
  EXPECT_EQ(offsetof(FileHeader, slot_count), 20u);
  EXPECT_EQ(offsetof(FileHeader, pid), 24u);
  EXPECT_EQ(offsetof(FileHeader, start_ticks), 32u);
  EXPECT_EQ(offsetof(FileHeader, comm), 48u);
  EXPECT_EQ(sizeof(QpSlot), 512u);
  EXPECT_EQ(offsetof(QpSlot, qp_num), 0u);
  EXPECT_EQ(offsetof(QpSlot, sequence), 4u);
  EXPECT_EQ(offsetof(QpSlot, state), 8u);
  EXPECT_EQ(offsetof(QpSlot, description), 64u);
  EXPECT_EQ(offsetof(QpDescription, ird), 8u);
  EXPECT_EQ(offsetof(QpDescription, local), 20u);
  EXPECT_EQ(offsetof(QpDescription, peer), 40u);
  EXPECT_EQ(offsetof(QpDescription, terminate_sent), 60u);
  EXPECT_EQ(offsetof(QpDescription, bound_unix_ms), 80u);
  EXPECT_EQ(offsetof(QpSlot, counters), 192u);
  EXPECT_EQ(offsetof(QpCounterBlock, rx_octets), 40u);
  EXPECT_EQ(offsetof(QpSlot, completion_errors), 320u);
}

TEST(StatsFile, WrittenSlotsReadBack) {
  const std::string path = TempPath("rw");
  std::unique_ptr<StatsFile> file = StatsFile::Create(path, 4);
  ASSERT_NE(file, nullptr);
  QpSlot* a = file->Acquire(7);
  QpSlot* b = file->Acquire(9);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  a->state.store(3);
  a->counters.tx_octets.store(1000);
  a->counters.rx_fpdus.store(5);
  a->completion_errors.fetch_add(2);
  UpdateDescription(a, [](QpDescription& d) {
    d.bound = 1;
    d.mpa_dialect = 3;
    d.ird = 16;
    d.peer.family = AF_INET;
    d.peer.port = 4791;
    RecordCause(&d.terminate_received, 2, 0, 2);
    RecordCause(&d.terminate_received, 0, 1, 0);  // only the first counts
  });
  EXPECT_EQ(a->sequence.load(), 2u);
  file->Release(b);

  ProcessSnapshot snapshot;
  int error = 0;
  ASSERT_EQ(ReadStatsFile(path, &snapshot, &error, /*check_alive=*/true), ReadStatus::kOk);
  EXPECT_EQ(snapshot.pid, ::getpid());
  ASSERT_EQ(snapshot.qps.size(), 1u);
  const QpSnapshot& q = snapshot.qps[0];
  EXPECT_EQ(q.qp_num, 7u);
  EXPECT_EQ(q.state, 3);
  EXPECT_EQ(q.tx_octets, 1000u);
  EXPECT_EQ(q.rx_fpdus, 5u);
  EXPECT_EQ(q.completion_errors, 2u);
  EXPECT_EQ(q.description.mpa_dialect, 3);
  EXPECT_EQ(q.description.ird, 16u);
  EXPECT_EQ(q.description.peer.port, 4791);
  EXPECT_EQ(q.description.terminate_received.valid, 1);
  EXPECT_EQ(q.description.terminate_received.layer, 2);
  EXPECT_EQ(q.description.terminate_received.ecode, 2);
  EXPECT_EQ(q.description.terminate_sent.valid, 0);
  file.reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the owner removes its file";
}

TEST(StatsFile, FullFileCountsQpsWithoutSlot) {
  const std::string path = TempPath("full");
  std::unique_ptr<StatsFile> file = StatsFile::Create(path, 2);
  ASSERT_NE(file, nullptr);
  QpSlot* first = file->Acquire(1);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(file->Acquire(2), nullptr);
  EXPECT_EQ(file->Acquire(3), nullptr);
  EXPECT_EQ(file->Acquire(0), nullptr);  // 0 marks a free slot: never a QP number
  file->Release(first);
  QpSlot* again = file->Acquire(4);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->counters.tx_octets.load(), 0u) << "a reused slot starts from zero";
  ProcessSnapshot snapshot;
  int error = 0;
  ASSERT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kOk);
  EXPECT_EQ(snapshot.qps_without_slot, 1u);
  EXPECT_EQ(snapshot.qps.size(), 2u);
}

TEST(StatsFile, FileOfADeadProcessIsStale) {
  const std::string path = TempPath("stale");
  // A child creates the file and dies without cleaning up (_exit).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<StatsFile> file = StatsFile::Create(path, 2);
    if (file == nullptr || file->Acquire(5) == nullptr) ::_exit(1);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ProcessSnapshot snapshot;
  int error = 0;
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kStale);
  EXPECT_EQ(snapshot.pid, child);
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error, /*check_alive=*/false), ReadStatus::kOk);
  EXPECT_EQ(snapshot.qps.size(), 1u);
  ::unlink(path.c_str());
}

TEST(StatsFile, SweepRemovesOnlyFilesOfDeadProcesses) {
  const std::string dir =
      ::testing::TempDir() + "/siwx-stats-sweep-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<StatsFile> file =
        StatsFile::Create(dir + "/siwx-" + std::to_string(::getpid()));
    ::_exit(file != nullptr ? 0 : 1);  // no cleanup: a killed process
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string live = dir + "/siwx-" + std::to_string(::getpid());
  std::unique_ptr<StatsFile> own = StatsFile::Create(live);
  ASSERT_NE(own, nullptr);
  const std::string other = dir + "/siwx-notes";  // not a statistics file name
  std::ofstream(other) << "x";
  EXPECT_EQ(RemoveStaleStatsFiles(dir), 1);
  EXPECT_NE(::access((dir + "/siwx-" + std::to_string(child)).c_str(), F_OK), 0);
  EXPECT_EQ(::access(live.c_str(), F_OK), 0);
  EXPECT_EQ(::access(other.c_str(), F_OK), 0);
  int pid = 0;
  EXPECT_TRUE(ParseStatsFileName("siwx-123", &pid));
  EXPECT_EQ(pid, 123);
  EXPECT_FALSE(ParseStatsFileName("siwx-12a", &pid));
  EXPECT_FALSE(ParseStatsFileName("siwx-", &pid));
  EXPECT_FALSE(ParseStatsFileName("siwx--1", &pid));
  own.reset();
  ::unlink(other.c_str());
  ::rmdir(dir.c_str());
}

TEST(StatsFile, ForeignOrDamagedFilesAreRefused) {
  const std::string path = TempPath("bad");
  {
    std::ofstream out(path);
    out << std::string(4096, 'x');
  }
  ProcessSnapshot snapshot;
  int error = 0;
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kNotAStatsFile);
  {
    std::ofstream out(path, std::ios::trunc);
    out << "short";
  }
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kNotAStatsFile);
  ::unlink(path.c_str());
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kUnreadable);
  EXPECT_EQ(error, ENOENT);
  // A header that claims more slots than the file holds.
  std::unique_ptr<StatsFile> file = StatsFile::Create(path, 2);
  ASSERT_NE(file, nullptr);
  file->header()->slot_count = 1000;
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kNotAStatsFile);
  file->header()->slot_count = 2;
  file->header()->version = kLayoutVersion + 1;
  EXPECT_EQ(ReadStatsFile(path, &snapshot, &error), ReadStatus::kNotAStatsFile);
}

}  // namespace
}  // namespace siwx::stats
