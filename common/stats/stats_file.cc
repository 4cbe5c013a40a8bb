// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "common/stats/stats_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "common/util/log.h"

namespace siwx::stats {

void RecordCause(CauseRecord* record, std::uint8_t layer, std::uint8_t etype, std::uint8_t ecode) {
  if (record->valid != 0) return;  // the first one counts
  record->valid = 1;
  record->layer = layer;
  record->etype = etype;
  record->ecode = ecode;
}

std::string StatsPathFor(int pid) {
  return std::string(kStatsDirectory) + "/" + kStatsPrefix + std::to_string(pid);
}

std::uint64_t ProcessStartTicks(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return 0;
  // The command name (field 2) may hold spaces and parentheses: fields are
  // counted after its last ')'.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int index = 3; fields >> field; ++index) {
    if (index == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool ParseStatsFileName(const char* name, int* pid) {
  const std::size_t prefix = std::strlen(kStatsPrefix);
  if (std::strncmp(name, kStatsPrefix, prefix) != 0 || name[prefix] < '0' ||
      name[prefix] > '9') {
    return false;
  }
  char* end = nullptr;
  const long value = std::strtol(name + prefix, &end, 10);
  if (*end != '\0' || value <= 0 || value > 0x3fffffff) return false;
  *pid = static_cast<int>(value);
  return true;
}

int RemoveStaleStatsFiles(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return 0;
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    int pid = 0;
    if (!ParseStatsFileName(entry->d_name, &pid)) continue;
    const std::string path = directory + "/" + entry->d_name;
    ProcessSnapshot snapshot;
    int error = 0;
    if (ReadStatsFile(path, &snapshot, &error) == ReadStatus::kStale) stale.push_back(path);
  }
  ::closedir(dir);
  int removed = 0;
  for (const std::string& path : stale) {
    if (::unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

namespace {

std::string OwnCommand() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::unique_ptr<StatsFile> StatsFile::Create(const std::string& path, std::uint32_t slot_count) {
  if (slot_count == 0) {
    errno = EINVAL;
    return nullptr;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return nullptr;
  const std::size_t size = kHeaderSize + std::size_t{slot_count} * kSlotSize;
  // Sparse: only the pages of slots in use take memory.
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(path.c_str());
    errno = error;
    return nullptr;
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    ::unlink(path.c_str());
    errno = map_error;
    return nullptr;
  }
  std::unique_ptr<StatsFile> file(new StatsFile());
  file->path_ = path;
  file->pid_ = static_cast<int>(::getpid());
  file->map_ = map;
  file->map_size_ = size;
  file->slot_count_ = slot_count;
  FileHeader* h = new (map) FileHeader{};
  h->version = kLayoutVersion;
  h->header_size = kHeaderSize;
  h->slot_size = kSlotSize;
  h->slot_count = slot_count;
  h->pid = file->pid_;
  h->start_ticks = ProcessStartTicks(file->pid_);
  const std::string comm = OwnCommand();
  std::snprintf(h->comm, sizeof(h->comm), "%s", comm.c_str());
  // The magic last: a reader that sees it sees a complete header.
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  file->header_ = h;
  return file;
}

StatsFile::~StatsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  if (pid_ == static_cast<int>(::getpid())) ::unlink(path_.c_str());
}

QpSlot* StatsFile::Acquire(std::uint32_t qp_num) {
  if (qp_num == 0) return nullptr;
  std::lock_guard lock(mutex_);
  auto* base = static_cast<unsigned char*>(map_) + kHeaderSize;
  for (std::uint32_t i = 0; i < slot_count_; ++i) {
    const std::uint32_t index = (next_ + i) % slot_count_;
    auto* raw = base + std::size_t{index} * kSlotSize;
    auto* slot = reinterpret_cast<QpSlot*>(raw);
    if (slot->qp_num.load(std::memory_order_relaxed) != 0) continue;
    slot = new (raw) QpSlot{};
    slot->qp_num.store(qp_num, std::memory_order_release);
    next_ = (index + 1) % slot_count_;
    return slot;
  }
  header_->qps_without_slot.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void StatsFile::Release(QpSlot* slot) {
  if (slot == nullptr) return;
  slot->qp_num.store(0, std::memory_order_release);
}

namespace {

bool StatsEnabled() {
  const char* value = std::getenv("SIWX_STATS");
  if (value == nullptr || value[0] == '\0' || strcasecmp(value, "on") == 0) return true;
  if (strcasecmp(value, "off") != 0) {
    SIWX_LOG(kWarn, "SIWX_STATS='%s' is not on or off; using on", value);
    return true;
  }
  return false;
}

std::mutex process_file_mutex;
StatsFile* process_file = nullptr;  // guarded by process_file_mutex
int process_file_pid = 0;           // guarded by process_file_mutex
bool process_file_tried = false;    // guarded by process_file_mutex

// Removes the file at exit (the process's own file only).
struct ProcessFileCleanup {
  ~ProcessFileCleanup() {
    std::lock_guard lock(process_file_mutex);
    if (process_file != nullptr && process_file_pid == static_cast<int>(::getpid())) {
      ::unlink(process_file->path().c_str());
    }
  }
} process_file_cleanup;

}  // namespace

StatsFile* StatsFile::ForProcess() {
  std::lock_guard lock(process_file_mutex);
  const int pid = static_cast<int>(::getpid());
  if (process_file_tried && process_file_pid == pid) return process_file;
  // First use, or the first use in a child after fork(): the parent's
  // mapping stays the parent's (its slots are left alone, never freed here).
  process_file_tried = true;
  process_file_pid = pid;
  process_file = nullptr;
  if (!StatsEnabled()) return nullptr;
  std::unique_ptr<StatsFile> file = Create(StatsPathFor(pid));
  if (file == nullptr) {
    SIWX_LOG(kWarn, "cannot create %s (%s): `siwx stat` will not see this process; "
             "check that /dev/shm is writable, or set SIWX_STATS=off",
             StatsPathFor(pid).c_str(), std::strerror(errno));
    return nullptr;
  }
  // Files of processes that were killed (no exit, no cleanup) go now.
  RemoveStaleStatsFiles(kStatsDirectory);
  // Lives until the process exits (QPs may outlive any owner we could name).
  process_file = file.release();
  return process_file;
}

QpSlot* StatsFile::AcquireForProcess(std::uint32_t qp_num) {
  StatsFile* file = ForProcess();
  return file != nullptr ? file->Acquire(qp_num) : nullptr;
}

void StatsFile::ReleaseForProcess(QpSlot* slot) {
  if (slot == nullptr) return;
  std::lock_guard lock(process_file_mutex);
  if (process_file == nullptr || process_file_pid != static_cast<int>(::getpid())) return;
  const auto* base = static_cast<const unsigned char*>(process_file->map_);
  const auto* raw = reinterpret_cast<const unsigned char*>(slot);
  if (raw < base || raw >= base + process_file->map_size_) return;  // the parent's slot
  process_file->Release(slot);
}

// ---- Reading ----

ReadStatus ReadStatsFile(const std::string& path, ProcessSnapshot* out, int* error,
                         bool check_alive) {
  *out = ProcessSnapshot{};
  *error = 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *error = errno;
    return ReadStatus::kUnreadable;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return ReadStatus::kNotAStatsFile;
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < kHeaderSize) {
    ::close(fd);
    return ReadStatus::kNotAStatsFile;
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  *error = errno;
  ::close(fd);
  if (map == MAP_FAILED) return ReadStatus::kUnreadable;
  *error = 0;
  const auto* base = static_cast<const unsigned char*>(map);
  const auto* h = reinterpret_cast<const FileHeader*>(base);
  ReadStatus status = ReadStatus::kOk;
  if (h->magic != kMagic || h->version != kLayoutVersion || h->header_size < kHeaderSize ||
      h->slot_size < kSlotSize || h->slot_count == 0 ||
      h->header_size + std::size_t{h->slot_count} * h->slot_size > size) {
    status = ReadStatus::kNotAStatsFile;
  } else if (check_alive &&
             (h->pid <= 0 || ProcessStartTicks(h->pid) != h->start_ticks || h->start_ticks == 0)) {
    status = ReadStatus::kStale;
  }
  if (status == ReadStatus::kOk || status == ReadStatus::kStale) {
    out->pid = h->pid;
    out->comm.assign(h->comm, strnlen(h->comm, sizeof(h->comm)));
    out->path = path;
  }
  if (status == ReadStatus::kOk) {
    out->qps_without_slot = h->qps_without_slot.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < h->slot_count; ++i) {
      const auto* slot =
          reinterpret_cast<const QpSlot*>(base + h->header_size + std::size_t{i} * h->slot_size);
      QpSnapshot q;
      q.qp_num = slot->qp_num.load(std::memory_order_acquire);
      if (q.qp_num == 0) continue;
      // Sequence lock: a copy taken while no writer was inside.
      for (int attempt = 0; attempt < 1000; ++attempt) {
        const std::uint32_t before = slot->sequence.load(std::memory_order_acquire);
        if ((before & 1) != 0) continue;
        std::memcpy(&q.description, &slot->description, sizeof(q.description));
        std::atomic_thread_fence(std::memory_order_acquire);
        if (slot->sequence.load(std::memory_order_relaxed) == before) break;
      }
      constexpr auto r = std::memory_order_relaxed;
      q.state = slot->state.load(r);
      q.tx_fpdus = slot->counters.tx_fpdus.load(r);
      q.tx_octets = slot->counters.tx_octets.load(r);
      q.tx_syscalls = slot->counters.tx_syscalls.load(r);
      q.rx_fpdus = slot->counters.rx_fpdus.load(r);
      q.rx_octets = slot->counters.rx_octets.load(r);
      q.rx_syscalls = slot->counters.rx_syscalls.load(r);
      q.completion_errors = slot->completion_errors.load(r);
      q.completions_flushed = slot->completions_flushed.load(r);
      // Released while we read: not a QP any more.
      if (slot->qp_num.load(std::memory_order_acquire) != q.qp_num) continue;
      out->qps.push_back(q);
    }
  }
  ::munmap(map, size);
  return status;
}

}  // namespace siwx::stats
