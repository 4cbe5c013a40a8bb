// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// The per-process statistics file that `siwx stat` reads.
//
// Every process that creates a siwx QP maps /dev/shm/siwx-<pid> (mode 0600;
// SIWX_STATS=off turns it off): a FileHeader, then `slot_count` QpSlots of
// `slot_size` octets. A QP takes a slot when the engine creates it and frees
// it when it is destroyed; the file is removed when the process exits.
// A process that dies without exiting leaves its file behind: readers tell
// it from a live one by the pid and the process start time in the header,
// skip it and remove it when they may.
//
// Layout (version 1, host byte order, fixed offsets; a reader refuses other
// magic/version values and uses header_size/slot_size to step, so fields can
// be appended without breaking older readers):
//   - QpSlot::counters: the engine's data-path counters, each written by one
//     thread with relaxed atomic stores, once per sendmsg/recvmsg batch. The
//     engine uses the slot's block as its own counters (no copy, no extra
//     store on the data path).
//   - QpSlot::state: the QP state (engine::QpState values), relaxed.
//   - QpSlot::description: what a stream negotiated and how it ended,
//     written rarely (bind, error) under a sequence lock: `sequence` is odd
//     while a writer is inside; readers retry until they see the same even
//     value before and after their copy.
//   - completion counters: relaxed fetch_add, only for completions that are
//     not successful (never on the good path).
// A slot is in use while qp_num != 0 (released with a release store).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/transport/endpoints.h"

namespace siwx::stats {

inline constexpr std::uint64_t kMagic = 0x3130545453585753ULL;  // "SWXSTT01" as octets
inline constexpr std::uint32_t kLayoutVersion = 1;
inline constexpr std::uint32_t kDefaultSlotCount = 1024;
inline constexpr std::size_t kHeaderSize = 256;
inline constexpr std::size_t kSlotSize = 512;

static_assert(sizeof(std::atomic<std::uint64_t>) == 8 &&
                  std::atomic<std::uint64_t>::is_always_lock_free,
              "the stats file needs lock-free 64-bit atomics");

struct FileHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t header_size;
  std::uint32_t slot_size;
  std::uint32_t slot_count;
  std::int32_t pid;
  std::uint32_t reserved0;
  std::uint64_t start_ticks;            // /proc/<pid>/stat starttime: tells a reused pid
  std::atomic<std::uint64_t> qps_without_slot;  // QPs created while every slot was taken
  char comm[32];                        // the program, NUL-terminated
  std::uint8_t reserved[kHeaderSize - 80];
};
static_assert(sizeof(FileHeader) == kHeaderSize);

// The engine's data-path counters (engine::Qp uses this block directly).
// One writer per field; readers load relaxed.
struct QpCounterBlock {
  std::atomic<std::uint64_t> tx_fpdus{0};
  std::atomic<std::uint64_t> tx_octets{0};       // wire octets written
  std::atomic<std::uint64_t> tx_syscalls{0};     // sendmsg calls that moved data
  std::atomic<std::uint64_t> tx_would_block{0};  // sendmsg calls that found the socket full
  std::atomic<std::uint64_t> rx_fpdus{0};
  std::atomic<std::uint64_t> rx_octets{0};       // wire octets read
  std::atomic<std::uint64_t> rx_syscalls{0};     // recvmsg calls that returned data
  std::atomic<std::uint64_t> rx_staged_payload{0};  // payload copied from the staging buffer
  std::atomic<std::uint64_t> rx_direct_payload{0};  // payload received straight into targets
  std::atomic<std::uint64_t> reserved[7]{};      // room for more without moving what follows
};
static_assert(sizeof(QpCounterBlock) == 128);

// A Terminate cause in a slot (RFC 5040 7: layer, type, code).
struct CauseRecord {
  std::uint8_t valid;
  std::uint8_t layer;
  std::uint8_t etype;
  std::uint8_t ecode;
};

// What a stream negotiated and how it ended (sequence-locked).
struct QpDescription {
  std::uint8_t bound;          // a stream was bound
  std::uint8_t mpa_dialect;    // enum siwx_mpa_dialect; 0 unknown
  std::uint8_t mpa_revision;
  std::uint8_t crc;
  std::uint8_t tx_markers;
  std::uint8_t rx_markers;
  std::uint8_t large_fpdus;
  std::uint8_t rtr_role;       // engine::RtrRole
  std::uint32_t ird;
  std::uint32_t ord;
  std::uint32_t max_ulpdu;
  transport::Endpoint local;   // 20 octets each
  transport::Endpoint peer;
  CauseRecord terminate_sent;
  CauseRecord terminate_received;
  CauseRecord local_error;     // the stream failed without a Terminate
  std::uint8_t reserved0[8];
  std::uint64_t bound_unix_ms; // when the stream was bound
  std::uint8_t reserved[40];
};
static_assert(sizeof(QpDescription) == 128);

struct QpSlot {
  std::atomic<std::uint32_t> qp_num{0};    // 0: free
  std::atomic<std::uint32_t> sequence{0};  // odd while `description` is written
  std::atomic<std::uint8_t> state{0};      // engine::QpState
  std::uint8_t reserved0[55]{};
  QpDescription description{};             // offset 64
  QpCounterBlock counters;                 // offset 192
  std::atomic<std::uint64_t> completion_errors{0};   // WCs with an error status other than flush
  std::atomic<std::uint64_t> completions_flushed{0}; // WCs with WR_FLUSH_ERR
  std::uint8_t reserved[kSlotSize - 336]{};
};
static_assert(sizeof(QpSlot) == kSlotSize);
static_assert(offsetof(QpSlot, description) == 64 && offsetof(QpSlot, counters) == 192);

// Changes a slot's description under its sequence lock (any thread).
template <typename Change>
void UpdateDescription(QpSlot* slot, Change&& change) {
  if (slot == nullptr) return;
  std::uint32_t seen = slot->sequence.load(std::memory_order_relaxed);
  for (;;) {
    if ((seen & 1) == 0 &&
        slot->sequence.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire)) {
      break;
    }
    seen = slot->sequence.load(std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
  change(slot->description);
  slot->sequence.store(seen + 2, std::memory_order_release);
}

void RecordCause(CauseRecord* record, std::uint8_t layer, std::uint8_t etype, std::uint8_t ecode);

// A mapped statistics file this process writes.
class StatsFile {
 public:
  // Creates (truncating) `path` with `slot_count` slots; nullptr with errno.
  static std::unique_ptr<StatsFile> Create(const std::string& path,
                                           std::uint32_t slot_count = kDefaultSlotCount);
  ~StatsFile();
  StatsFile(const StatsFile&) = delete;
  StatsFile& operator=(const StatsFile&) = delete;

  // A zeroed slot for `qp_num` (non-zero), or nullptr when all are taken.
  QpSlot* Acquire(std::uint32_t qp_num);
  void Release(QpSlot* slot);

  const std::string& path() const { return path_; }
  FileHeader* header() const { return header_; }

  // The process's file, /dev/shm/siwx-<pid>, made on first use; nullptr
  // when SIWX_STATS=off or it cannot be made (then QPs simply have no slot).
  // After fork() the child gets a file of its own.
  static StatsFile* ForProcess();
  // ForProcess()->Acquire, or nullptr.
  static QpSlot* AcquireForProcess(std::uint32_t qp_num);
  // Releases a slot of ForProcess(); nothing in a child of the process that
  // acquired it (the parent still owns the slot).
  static void ReleaseForProcess(QpSlot* slot);

 private:
  StatsFile() = default;
  std::string path_;
  int pid_ = 0;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  FileHeader* header_ = nullptr;
  std::uint32_t slot_count_ = 0;
  std::mutex mutex_;  // slot allocation
  std::uint32_t next_ = 0;
};

// The directory and name prefix of the files: /dev/shm/siwx-<pid>.
inline constexpr const char* kStatsDirectory = "/dev/shm";
inline constexpr const char* kStatsPrefix = "siwx-";
std::string StatsPathFor(int pid);

// ---- Reading (`siwx stat`) ----

struct QpSnapshot {
  std::uint32_t qp_num = 0;
  std::uint8_t state = 0;
  QpDescription description{};
  std::uint64_t tx_fpdus = 0, tx_octets = 0, tx_syscalls = 0;
  std::uint64_t rx_fpdus = 0, rx_octets = 0, rx_syscalls = 0;
  std::uint64_t completion_errors = 0, completions_flushed = 0;
};

struct ProcessSnapshot {
  int pid = 0;
  std::string comm;
  std::string path;
  std::uint64_t qps_without_slot = 0;
  std::vector<QpSnapshot> qps;  // in slot order
};

enum class ReadStatus {
  kOk,
  kUnreadable,   // cannot open or map (errno in *error)
  kNotAStatsFile,  // wrong magic, version or sizes
  kStale,        // its process is gone (or the pid was reused)
};

// Reads one file. `check_alive`: compare the header's pid and start time with
// /proc (off for tests that read a file of their own).
ReadStatus ReadStatsFile(const std::string& path, ProcessSnapshot* out, int* error,
                         bool check_alive = true);

// Removes the statistics files in `directory` (siwx-<pid>) whose process is
// gone, as far as this user may; returns how many. A new process's file
// does this once, so files of killed processes do not pile up.
int RemoveStaleStatsFiles(const std::string& directory);

// The start time of process `pid` from /proc/<pid>/stat (field 22), 0 when
// it does not exist.
std::uint64_t ProcessStartTicks(int pid);

// Whether `name` is a statistics file name, siwx-<pid>; the pid in *pid.
bool ParseStatsFileName(const char* name, int* pid);

}  // namespace siwx::stats
