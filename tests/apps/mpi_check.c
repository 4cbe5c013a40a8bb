/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* A 2-rank MPI program that checks every byte it moves: point-to-point from
 * 0 B to 4 MiB both ways, both directions at once (MPI_Sendrecv, and
 * MPI_Isend/MPI_Irecv with several messages in flight each way), and the
 * collectives MPI_Bcast (from each root) and MPI_Allreduce. At the end it
 * prints the 8 B round-trip time and the 4 MiB ping-pong and bidirectional
 * bandwidth (figures, not checks). Exit 0 when every check passed; any
 * mismatch names what differed and aborts the job with 1.
 *
 * run_mpi.sh runs it under mpirun with Open MPI's cm PML and ofi MTL over
 * libfabric's verbs;ofi_rxm, each rank under siwx-run. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
	kMiB = 1 << 20,
	kMax = 4 * kMiB,
	kInFlight = 4, /* Isend/Irecv pairs per direction at once */
	kBandwidthRounds = 20,
	kLatencyRounds = 1000,
};

static int rank;

/* A pattern that depends on seed and position (as the verbs tests use). */
static void fill(uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFF);
}

static void check(const uint8_t *buf, size_t len, uint32_t seed, const char *what)
{
	for (size_t i = 0; i < len; i++) {
		uint8_t want = (uint8_t)((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFF);
		if (buf[i] != want) {
			fprintf(stderr, "mpi_check: rank %d: %s: %zu bytes, byte %zu is 0x%02x, "
				"want 0x%02x\n", rank, what, len, i, buf[i], want);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
	}
}

static void check_count(MPI_Status *status, int want, const char *what)
{
	int got = -1;
	MPI_Get_count(status, MPI_BYTE, &got);
	if (got != want) {
		fprintf(stderr, "mpi_check: rank %d: %s: received %d bytes, want %d\n", rank,
			what, got, want);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

static void *alloc(size_t len)
{
	void *p = malloc(len);
	if (p == NULL) {
		fprintf(stderr, "mpi_check: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	return p;
}

/* Rank 0 sends `len` bytes to rank 1 and rank 1 answers with other bytes. */
static void ping_pong(uint8_t *out, uint8_t *in, int len, uint32_t seed)
{
	MPI_Status status;
	const int peer = 1 - rank;
	fill(out, (size_t)len, seed + (uint32_t)rank);
	memset(in, 0xEE, (size_t)len + 1);
	if (rank == 0) {
		MPI_Send(out, len, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
		MPI_Recv(in, len + 1, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &status);
	} else {
		MPI_Recv(in, len + 1, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &status);
		MPI_Send(out, len, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
	}
	check_count(&status, len, "ping-pong");
	check(in, (size_t)len, seed + (uint32_t)peer, "ping-pong");
	if (in[len] != 0xEE) {
		fprintf(stderr, "mpi_check: rank %d: ping-pong of %d bytes wrote past the end\n",
			rank, len);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

/* Both ranks send `len` bytes to each other at once. */
static void both_ways(uint8_t *out, uint8_t *in, int len, uint32_t seed)
{
	MPI_Status status;
	const int peer = 1 - rank;
	fill(out, (size_t)len, seed + (uint32_t)rank);
	memset(in, 0xEE, (size_t)len);
	MPI_Sendrecv(out, len, MPI_BYTE, peer, 3, in, len, MPI_BYTE, peer, 3, MPI_COMM_WORLD,
		     &status);
	check_count(&status, len, "MPI_Sendrecv");
	check(in, (size_t)len, seed + (uint32_t)peer, "MPI_Sendrecv");
}

/* kInFlight messages of `len` bytes each way, all posted before any wait. */
static void in_flight(uint8_t *out, uint8_t *in, int len, uint32_t seed)
{
	MPI_Request req[2 * kInFlight];
	MPI_Status status[2 * kInFlight];
	const int peer = 1 - rank;
	for (int i = 0; i < kInFlight; i++) {
		fill(out + (size_t)i * (size_t)len, (size_t)len, seed + 10 * (uint32_t)i +
		     (uint32_t)rank);
		memset(in + (size_t)i * (size_t)len, 0xEE, (size_t)len);
		MPI_Irecv(in + (size_t)i * (size_t)len, len, MPI_BYTE, peer, 100 + i,
			  MPI_COMM_WORLD, &req[i]);
	}
	for (int i = 0; i < kInFlight; i++)
		MPI_Isend(out + (size_t)i * (size_t)len, len, MPI_BYTE, peer, 100 + i,
			  MPI_COMM_WORLD, &req[kInFlight + i]);
	MPI_Waitall(2 * kInFlight, req, status);
	for (int i = 0; i < kInFlight; i++) {
		check_count(&status[i], len, "Isend/Irecv");
		check(in + (size_t)i * (size_t)len, (size_t)len,
		      seed + 10 * (uint32_t)i + (uint32_t)peer, "Isend/Irecv");
	}
}

static void collectives(uint8_t *buf)
{
	/* MPI_Bcast of 1 MiB from each root. */
	for (int root = 0; root < 2; root++) {
		if (rank == root)
			fill(buf, kMiB, 500 + (uint32_t)root);
		else
			memset(buf, 0xEE, kMiB);
		MPI_Bcast(buf, kMiB, MPI_BYTE, root, MPI_COMM_WORLD);
		check(buf, kMiB, 500 + (uint32_t)root, "MPI_Bcast");
	}
	/* MPI_Allreduce (sum) of 256 Ki ints (1 MiB) and of one int. */
	enum { kInts = 256 * 1024 };
	int32_t *mine = alloc(kInts * sizeof(int32_t));
	int32_t *sum = alloc(kInts * sizeof(int32_t));
	for (int i = 0; i < kInts; i++)
		mine[i] = (rank + 1) * (i % 1000) - rank;
	MPI_Allreduce(mine, sum, kInts, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
	for (int i = 0; i < kInts; i++) {
		if (sum[i] != 3 * (i % 1000) - 1) {
			fprintf(stderr, "mpi_check: rank %d: MPI_Allreduce element %d is %d, want %d\n",
				rank, i, sum[i], 3 * (i % 1000) - 1);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
	}
	int one = rank + 40, total = 0;
	MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (total != 81) {
		fprintf(stderr, "mpi_check: rank %d: MPI_Allreduce of one int is %d, want 81\n",
			rank, total);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	free(mine);
	free(sum);
	MPI_Barrier(MPI_COMM_WORLD);
}

/* Figures only: the job's outcome never depends on them. */
static void figures(uint8_t *out, uint8_t *in)
{
	const int peer = 1 - rank;
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < kLatencyRounds; i++) {
		if (rank == 0) {
			MPI_Send(out, 8, MPI_BYTE, peer, 7, MPI_COMM_WORLD);
			MPI_Recv(in, 8, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(in, 8, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(out, 8, MPI_BYTE, peer, 7, MPI_COMM_WORLD);
		}
	}
	const double rtt = (MPI_Wtime() - t0) / kLatencyRounds;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < kBandwidthRounds; i++) {
		if (rank == 0) {
			MPI_Send(out, kMax, MPI_BYTE, peer, 8, MPI_COMM_WORLD);
			MPI_Recv(in, kMax, MPI_BYTE, peer, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(in, kMax, MPI_BYTE, peer, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(out, kMax, MPI_BYTE, peer, 8, MPI_COMM_WORLD);
		}
	}
	const double pingpong = 2.0 * kBandwidthRounds * kMax / (MPI_Wtime() - t0);

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < kBandwidthRounds; i++)
		MPI_Sendrecv(out, kMax, MPI_BYTE, peer, 9, in, kMax, MPI_BYTE, peer, 9,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	const double bidir = 2.0 * kBandwidthRounds * kMax / (MPI_Wtime() - t0);
	if (rank == 0) {
		printf("mpi_check: 8 B round trip %.1f us; 4 MiB ping-pong %.1f MB/s; "
		       "4 MiB both ways at once %.1f MB/s (sum of both directions)\n",
		       rtt * 1e6, pingpong / 1e6, bidir / 1e6);
	}
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int size = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		if (rank == 0)
			fprintf(stderr, "mpi_check: needs exactly 2 ranks, got %d\n", size);
		MPI_Finalize();
		return 2;
	}
	uint8_t *out = alloc((size_t)kInFlight * kMax);
	uint8_t *in = alloc((size_t)kInFlight * kMax + 1);

	static const int kSizes[] = {0,	   1,	   7,	   64,	   1000,   4096, 16383, 65536,
				     131071, 131072, 262145, kMiB, 3 * kMiB + 5, kMax};
	const int n_sizes = (int)(sizeof(kSizes) / sizeof(kSizes[0]));
	uint32_t seed = 1;
	for (int i = 0; i < n_sizes; i++) {
		ping_pong(out, in, kSizes[i], seed);
		seed += 2;
		both_ways(out, in, kSizes[i], seed);
		seed += 2;
	}
	if (rank == 0)
		printf("mpi_check: ping-pong and MPI_Sendrecv, %d sizes 0 B .. 4 MiB ok\n", n_sizes);
	for (int len = 4096; len <= kMax; len *= 32) {
		in_flight(out, in, len, seed);
		seed += 50;
	}
	if (rank == 0)
		printf("mpi_check: Isend/Irecv, %d in flight each way up to 4 MiB ok\n", kInFlight);
	collectives(in);
	if (rank == 0)
		printf("mpi_check: MPI_Bcast from each root and MPI_Allreduce ok\n");
	figures(out, in);
	free(out);
	free(in);
	MPI_Finalize();
	if (rank == 0)
		printf("mpi_check: all checks passed\n");
	return 0;
}
