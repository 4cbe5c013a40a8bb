/* tcp_pingpong: the TCP reference for perftest's latency tests. Two
 * processes (like perftest's server and client) over one loopback TCP
 * connection with TCP_NODELAY bounce a message of --size octets --iters
 * times; the client times every round trip and prints the half round trip
 * (what ib_send_lat and ib_write_lat report) as a median and a 99th
 * percentile, on one line that perftest-configs/run reads:
 *
 *   tcp_pingpong mode=busy size=8 iters=5000 half_rtt_median_us=... half_rtt_p99_us=...
 *
 * --mode=busy: non-blocking sockets polled in a loop (as perftest polls its
 * CQ); --mode=blocking: blocking recv (the thread sleeps in the kernel).
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

enum { kMaxSize = 1 << 20 };

static int busy_mode = 1;

static int usage(const char *why)
{
	fprintf(stderr,
		"tcp_pingpong: %s\n"
		"usage: tcp_pingpong [--mode=busy|blocking] [--size=OCTETS (1..%d)] "
		"[--iters=N] [--warmup=N]\n",
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

int main(int argc, char **argv)
{
	long size = 8, iters = 5000, warmup = 500;
	for (int i = 1; i < argc; ++i) {
		const char *a = argv[i];
		if (strcmp(a, "--mode=busy") == 0) {
			busy_mode = 1;
		} else if (strcmp(a, "--mode=blocking") == 0) {
			busy_mode = 0;
		} else if (strncmp(a, "--size=", 7) == 0) {
			if (parse_count(a + 7, 1, kMaxSize, &size) != 0)
				return usage("--size must be a number of octets from 1 to 1048576");
		} else if (strncmp(a, "--iters=", 8) == 0) {
			if (parse_count(a + 8, 1, 100000000, &iters) != 0)
				return usage("--iters must be a number from 1 to 100000000");
		} else if (strncmp(a, "--warmup=", 9) == 0) {
			if (parse_count(a + 9, 0, 100000000, &warmup) != 0)
				return usage("--warmup must be a number from 0 to 100000000");
		} else {
			return usage("unknown argument (see usage)");
		}
	}

	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in addr;
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t addr_len = sizeof(addr);
	if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
	    listen(listener, 1) != 0 ||
	    getsockname(listener, (struct sockaddr *)&addr, &addr_len) != 0) {
		fprintf(stderr, "tcp_pingpong: cannot listen on 127.0.0.1: %s; check that loopback is up\n",
			strerror(errno));
		return 1;
	}

	char *buf = calloc(1, (size_t)size);
	if (buf == NULL) {
		fprintf(stderr, "tcp_pingpong: out of memory for a %ld-octet buffer\n", size);
		return 1;
	}
	const int one = 1;
	const long rounds = warmup + iters;

	pid_t echo = fork();
	if (echo < 0) {
		fprintf(stderr, "tcp_pingpong: fork failed: %s\n", strerror(errno));
		return 1;
	}
	if (echo == 0) {
		/* The echoing side. */
		int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			_exit(1);
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		for (long i = 0; i < rounds; ++i) {
			if (recv_all(fd, buf, (size_t)size) != 0 || send_all(fd, buf, (size_t)size) != 0)
				_exit(1);
		}
		_exit(0);
	}
	close(listener);

	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		fprintf(stderr, "tcp_pingpong: cannot connect to 127.0.0.1:%u: %s\n",
			ntohs(addr.sin_port), strerror(errno));
		kill(echo, SIGTERM);
		return 1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	double *half_rtt = malloc(sizeof(double) * (size_t)iters);
	if (half_rtt == NULL) {
		fprintf(stderr, "tcp_pingpong: out of memory for %ld samples\n", iters);
		kill(echo, SIGTERM);
		return 1;
	}
	for (long i = 0; i < rounds; ++i) {
		const double start = now_us();
		if (send_all(fd, buf, (size_t)size) != 0 || recv_all(fd, buf, (size_t)size) != 0) {
			fprintf(stderr, "tcp_pingpong: the echoing process went away after %ld round trips\n", i);
			kill(echo, SIGTERM);
			return 1;
		}
		if (i >= warmup)
			half_rtt[i - warmup] = (now_us() - start) / 2.0;
	}
	close(fd);
	int status = 0;
	waitpid(echo, &status, 0);

	qsort(half_rtt, (size_t)iters, sizeof(double), compare_doubles);
	const double median = half_rtt[iters / 2];
	long p99_index = (long)((double)iters * 0.99);
	if (p99_index >= iters)
		p99_index = iters - 1;
	printf("tcp_pingpong mode=%s size=%ld iters=%ld half_rtt_median_us=%.3f half_rtt_p99_us=%.3f\n",
	       busy_mode ? "busy" : "blocking", size, iters, median, half_rtt[p99_index]);
	free(half_rtt);
	free(buf);
	return 0;
}
