/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* cpu_pair_rtt: how far apart two CPUs are right now, as the round trip of
 * one cache line between them. Two threads, pinned to --cpus=A,B, hand a
 * counter back and forth; the figure is the median over batches of the mean
 * round trip per batch, on one line that perftest-configs/run reads:
 *
 *   cpu_pair_rtt cpus=0,1 round_trips=100000 median_ns=55
 *
 * Why: on a VM the hypervisor may move two vCPUs between cores that share a
 * cache and cores that do not, and back, within seconds. On the 2-vCPU test
 * VMs of issue 10 the round trip was 48-66 ns or 275-350 ns, and in the far
 * placement every stack that moves data between the two CPUs pays about 2.5x
 * per octet (TCP between two namespaces: 0.75 instead of 0.29 CPU s/GB for
 * the sender). A benchmark that compares two figures taken seconds apart
 * should say when they came from different placements.
 * A figure printer, not a test. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBatches = 20, kMaxRoundTrips = 10000000 };
/* A partner that never answers (its CPU went offline) ends the run. */
static const double kGiveUpSeconds = 5.0;

static _Alignas(64) atomic_uint_fast64_t turn;
static long round_trips = 100000;
static atomic_int gave_up;

static double now_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* Waits until the counter reaches `value`; 0, or -1 after kGiveUpSeconds. */
static int wait_for(uint_fast64_t value)
{
	unsigned spins = 0;
	double start = 0;
	while (atomic_load_explicit(&turn, memory_order_acquire) != value) {
		if (atomic_load_explicit(&gave_up, memory_order_relaxed))
			return -1;
		if (++spins % (1u << 20) == 0) {
			if (start == 0)
				start = now_seconds();
			else if (now_seconds() - start > kGiveUpSeconds)
				return -1;
		}
	}
	return 0;
}

static void *partner(void *arg)
{
	if (pin_to(*(const int *)arg) != 0) {
		atomic_store(&gave_up, 1);
		return NULL;
	}
	for (long i = 0; i < round_trips; ++i) {
		if (wait_for(2 * (uint_fast64_t)i + 1) != 0) {
			atomic_store(&gave_up, 1);
			return NULL;
		}
		atomic_store_explicit(&turn, 2 * (uint_fast64_t)i + 2, memory_order_release);
	}
	return NULL;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int usage(const char *why)
{
	fprintf(stderr,
		"cpu_pair_rtt: %s\n"
		"usage: cpu_pair_rtt [--cpus=A,B (default: the first two CPUs this process may "
		"use)] [--round-trips=N (%d..%d)]\n",
		why, kBatches, kMaxRoundTrips);
	return 2;
}

int main(int argc, char **argv)
{
	int cpus[2] = {-1, -1};
	for (int i = 1; i < argc; ++i) {
		char *end;
		if (strncmp(argv[i], "--cpus=", 7) == 0) {
			if (sscanf(argv[i] + 7, "%d,%d", &cpus[0], &cpus[1]) != 2 || cpus[0] < 0 ||
			    cpus[1] < 0 || cpus[0] == cpus[1])
				return usage("--cpus needs two different CPU numbers, e.g. --cpus=0,1");
		} else if (strncmp(argv[i], "--round-trips=", 14) == 0) {
			round_trips = strtol(argv[i] + 14, &end, 10);
			if (*end != '\0' || round_trips < kBatches || round_trips > kMaxRoundTrips)
				return usage("--round-trips is out of range");
		} else {
			return usage("unknown argument");
		}
	}
	if (cpus[0] < 0) {
		cpu_set_t allowed;
		if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
			perror("cpu_pair_rtt: sched_getaffinity");
			return 1;
		}
		for (int c = 0, found = 0; c < CPU_SETSIZE && found < 2; ++c)
			if (CPU_ISSET(c, &allowed))
				cpus[found++] = c;
		if (cpus[1] < 0) {
			fprintf(stderr, "cpu_pair_rtt: this process may use one CPU only; there is "
					"no pair to measure\n");
			return 77;
		}
	}
	if (pin_to(cpus[0]) != 0) {
		fprintf(stderr, "cpu_pair_rtt: cannot run on CPU %d (offline, or outside this "
				"process's affinity); pick others with --cpus\n", cpus[0]);
		return 1;
	}
	pthread_t thread;
	if (pthread_create(&thread, NULL, partner, &cpus[1]) != 0) {
		perror("cpu_pair_rtt: pthread_create");
		return 1;
	}
	const long per_batch = round_trips / kBatches;
	double batch_ns[kBatches];
	long i = 0;
	for (int b = 0; b < kBatches; ++b) {
		const double start = now_seconds();
		for (long k = 0; k < per_batch; ++k, ++i) {
			atomic_store_explicit(&turn, 2 * (uint_fast64_t)i + 1, memory_order_release);
			if (wait_for(2 * (uint_fast64_t)i + 2) != 0)
				break;
		}
		batch_ns[b] = (now_seconds() - start) * 1e9 / (double)per_batch;
		if (atomic_load(&gave_up))
			break;
	}
	/* Let the partner finish its loop whatever happened. */
	atomic_store(&gave_up, 1);
	pthread_join(thread, NULL);
	if (i < per_batch * kBatches) {
		fprintf(stderr, "cpu_pair_rtt: CPU %d stopped answering (offline, or outside "
				"this process's affinity); pick others with --cpus\n", cpus[1]);
		return 1;
	}
	qsort(batch_ns, kBatches, sizeof(batch_ns[0]), compare_doubles);
	printf("cpu_pair_rtt cpus=%d,%d round_trips=%ld median_ns=%.0f\n", cpus[0], cpus[1],
	       per_batch * kBatches, (batch_ns[kBatches / 2 - 1] + batch_ns[kBatches / 2]) / 2);
	return 0;
}
