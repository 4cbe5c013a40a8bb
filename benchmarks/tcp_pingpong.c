/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/* tcp_pingpong: the TCP reference for perftest's latency tests. Two
 * processes (like perftest's server and client) over one TCP connection with
 * TCP_NODELAY bounce a message of --size octets --iters times; the client
 * times every round trip and prints the half round trip (what ib_send_lat
 * and ib_write_lat report) as a median and a 99th percentile, on one line
 * that perftest-configs/run reads:
 *
 *   tcp_pingpong mode=busy size=8 iters=5000 pad_ns=0 half_rtt_median_us=... half_rtt_p99_us=...
 *
 * Without --server/--client it forks the echoing process itself and runs
 * over loopback. --server=PORT echoes for one client on any address and
 * exits; --client=IPV4:PORT is the timing end (start the server first, with
 * the same --size, --iters and --warmup), as perftest runs between hosts.
 * --mode=busy: non-blocking sockets polled in a loop (as perftest polls its
 * CQ); --mode=blocking: blocking recv (the thread sleeps in the kernel).
 * --pad-ns=N: each end spins N ns after a message has arrived before it
 * answers, which lengthens the half round trip by about N: a TCP ping-pong
 * as slow as the stack it is compared with, so that both meet the machine's
 * interruptions as often (perftest-configs/run's "matched" reference).
 * A figure printer, not a test. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kMaxSize = 8 << 20 };  /* perftest -a goes up to 8 MiB */

static int busy_mode = 1;
static long pad_ns;

static int usage(const char *why)
{
	fprintf(stderr,
		"tcp_pingpong: %s\n"
		"usage: tcp_pingpong [--mode=busy|blocking] [--size=OCTETS (1..%d)] "
		"[--iters=N] [--warmup=N] [--pad-ns=N] [--server=PORT | --client=IPV4:PORT]\n",
		why, kMaxSize);
	return 2;
}

/* Moves exactly len octets; 0 on success, -1 when the peer went away. */
static int send_all(int fd, const char *buf, size_t len)
{
	size_t done = 0;
	while (done < len) {
		ssize_t n = send(fd, buf + done, len - done,
				 MSG_NOSIGNAL | (busy_mode ? MSG_DONTWAIT : 0));
		if (n > 0) {
			done += (size_t)n;
		} else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			continue;
		} else {
			return -1;
		}
	}
	return 0;
}

static int recv_all(int fd, char *buf, size_t len)
{
	size_t done = 0;
	while (done < len) {
		ssize_t n = recv(fd, buf + done, len - done, busy_mode ? MSG_DONTWAIT : 0);
		if (n > 0) {
			done += (size_t)n;
		} else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			continue;
		} else {
			return -1;
		}
	}
	return 0;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* --pad-ns: the time a slower stack would spend on a message. */
static void pad(void)
{
	if (pad_ns == 0)
		return;
	const double until = now_us() + (double)pad_ns / 1e3;
	while (now_us() < until)
		;
}

static int parse_count(const char *text, long min, long max, long *out)
{
	char *end = NULL;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static void set_nodelay(int fd)
{
	const int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The echoing end: bounces every message back; 0 when all rounds ran. */
static int echo_rounds(int fd, char *buf, long size, long rounds)
{
	for (long i = 0; i < rounds; ++i) {
		if (recv_all(fd, buf, (size_t)size) != 0)
			return -1;
		pad();
		if (send_all(fd, buf, (size_t)size) != 0)
			return -1;
	}
	return 0;
}

/* The timing end: runs warmup + iters round trips and prints the line. */
static int time_rounds(int fd, char *buf, long size, long iters, long warmup)
{
	double *half_rtt = malloc(sizeof(double) * (size_t)iters);
	if (half_rtt == NULL) {
		fprintf(stderr, "tcp_pingpong: out of memory for %ld samples\n", iters);
		return -1;
	}
	for (long i = 0; i < warmup + iters; ++i) {
		const double start = now_us();
		if (send_all(fd, buf, (size_t)size) != 0 || recv_all(fd, buf, (size_t)size) != 0) {
			fprintf(stderr, "tcp_pingpong: the echoing process went away after %ld round trips\n", i);
			free(half_rtt);
			return -1;
		}
		pad();
		if (i >= warmup)
			half_rtt[i - warmup] = (now_us() - start) / 2.0;
	}
	qsort(half_rtt, (size_t)iters, sizeof(double), compare_doubles);
	const double median = half_rtt[iters / 2];
	long p99_index = (long)((double)iters * 0.99);
	if (p99_index >= iters)
		p99_index = iters - 1;
	printf("tcp_pingpong mode=%s size=%ld iters=%ld pad_ns=%ld half_rtt_median_us=%.3f "
	       "half_rtt_p99_us=%.3f\n",
	       busy_mode ? "busy" : "blocking", size, iters, pad_ns, median, half_rtt[p99_index]);
	free(half_rtt);
	return 0;
}

/* A listening socket on addr (port 0: any free one, written back to addr). */
static int listen_on(struct sockaddr_in *addr)
{
	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	socklen_t addr_len = sizeof(*addr);
	const int one = 1;
	if (listener < 0)
		return -1;
	setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(listener, (struct sockaddr *)addr, sizeof(*addr)) != 0 || listen(listener, 1) != 0 ||
	    getsockname(listener, (struct sockaddr *)addr, &addr_len) != 0) {
		close(listener);
		return -1;
	}
	return listener;
}

/* "IPV4:PORT" into addr; 0 on success. */
static int parse_endpoint(const char *text, struct sockaddr_in *addr)
{
	char host[64];
	const char *colon = strrchr(text, ':');
	long port = 0;
	if (colon == NULL || (size_t)(colon - text) >= sizeof(host) ||
	    parse_count(colon + 1, 1, 65535, &port) != 0)
		return -1;
	memcpy(host, text, (size_t)(colon - text));
	host[colon - text] = '\0';
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &addr->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	long size = 8, iters = 5000, warmup = 500, server_port = 0;
	const char *client_of = NULL;
	for (int i = 1; i < argc; ++i) {
		const char *a = argv[i];
		if (strcmp(a, "--mode=busy") == 0) {
			busy_mode = 1;
		} else if (strcmp(a, "--mode=blocking") == 0) {
			busy_mode = 0;
		} else if (strncmp(a, "--size=", 7) == 0) {
			if (parse_count(a + 7, 1, kMaxSize, &size) != 0)
				return usage("--size must be a number of octets from 1 to 8388608");
		} else if (strncmp(a, "--iters=", 8) == 0) {
			if (parse_count(a + 8, 1, 100000000, &iters) != 0)
				return usage("--iters must be a number from 1 to 100000000");
		} else if (strncmp(a, "--warmup=", 9) == 0) {
			if (parse_count(a + 9, 0, 100000000, &warmup) != 0)
				return usage("--warmup must be a number from 0 to 100000000");
		} else if (strncmp(a, "--pad-ns=", 9) == 0) {
			if (parse_count(a + 9, 0, 1000000000, &pad_ns) != 0)
				return usage("--pad-ns must be a number of nanoseconds from 0 to 1000000000");
		} else if (strncmp(a, "--server=", 9) == 0) {
			if (parse_count(a + 9, 1, 65535, &server_port) != 0)
				return usage("--server needs a port from 1 to 65535");
		} else if (strncmp(a, "--client=", 9) == 0) {
			client_of = a + 9;
		} else {
			return usage("unknown argument (see usage)");
		}
	}
	if (server_port != 0 && client_of != NULL)
		return usage("--server and --client exclude each other");

	char *buf = calloc(1, (size_t)size);
	if (buf == NULL) {
		fprintf(stderr, "tcp_pingpong: out of memory for a %ld-octet buffer\n", size);
		return 1;
	}
	const long rounds = warmup + iters;
	struct sockaddr_in addr;
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;

	if (server_port != 0) {
		addr.sin_addr.s_addr = htonl(INADDR_ANY);
		addr.sin_port = htons((uint16_t)server_port);
		int listener = listen_on(&addr);
		if (listener < 0) {
			fprintf(stderr, "tcp_pingpong: cannot listen on port %ld: %s\n", server_port,
				strerror(errno));
			return 1;
		}
		int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
		close(listener);
		if (fd < 0) {
			fprintf(stderr, "tcp_pingpong: accept failed: %s\n", strerror(errno));
			return 1;
		}
		set_nodelay(fd);
		if (echo_rounds(fd, buf, size, rounds) != 0) {
			fprintf(stderr, "tcp_pingpong: the client went away early; were --size, --iters "
					"and --warmup the same on both ends?\n");
			return 1;
		}
		return 0;
	}

	pid_t echo = -1;
	if (client_of != NULL) {
		if (parse_endpoint(client_of, &addr) != 0)
			return usage("--client needs IPV4:PORT, e.g. 192.0.2.1:5001");
	} else {
		addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		int listener = listen_on(&addr);
		if (listener < 0) {
			fprintf(stderr, "tcp_pingpong: cannot listen on 127.0.0.1: %s; check that loopback is up\n",
				strerror(errno));
			return 1;
		}
		echo = fork();
		if (echo < 0) {
			fprintf(stderr, "tcp_pingpong: fork failed: %s\n", strerror(errno));
			return 1;
		}
		if (echo == 0) {
			/* The echoing side. */
			int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
			if (fd < 0)
				_exit(1);
			set_nodelay(fd);
			_exit(echo_rounds(fd, buf, size, rounds) == 0 ? 0 : 1);
		}
		close(listener);
	}

	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		char host[INET_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET, &addr.sin_addr, host, sizeof(host));
		fprintf(stderr, "tcp_pingpong: cannot connect to %s:%u: %s\n", host,
			ntohs(addr.sin_port), strerror(errno));
		if (echo > 0)
			kill(echo, SIGTERM);
		return 1;
	}
	set_nodelay(fd);
	const int failed = time_rounds(fd, buf, size, iters, warmup);
	close(fd);
	if (echo > 0) {
		if (failed)
			kill(echo, SIGTERM);
		int status = 0;
		waitpid(echo, &status, 0);
	}
	free(buf);
	return failed ? 1 : 0;
}
