// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
// A plain TCP echo pair for the rsockets apps test: nothing RDMA in it.
// Under LD_PRELOAD=librspreload.so (and siwx-run) its sockets become
// rsockets over siwx.
//
//   stream_echo server <port>          echo one connection until its EOF
//   stream_echo client <addr> <port> <bytes>
//                                      send a pattern with poll(2), read the
//                                      echo back, compare every octet
// Exit status 0 when the echo matched; a message on stderr otherwise.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fail(const char* what) {
  fprintf(stderr, "stream_echo: %s: %s\n", what, strerror(errno));
  return 1;
}

static uint8_t pattern(size_t i) { return (uint8_t)((i * 131u + (i >> 9)) & 0xFF); }

static int server(int port) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) return fail("socket");
  const int on = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, (struct sockaddr*)&a, sizeof(a)) != 0) return fail("bind");
  if (listen(l, 1) != 0) return fail("listen");
  const int c = accept(l, NULL, NULL);
  if (c < 0) return fail("accept");
  static uint8_t buf[1 << 16];
  size_t total = 0;
  for (;;) {
    const ssize_t n = read(c, buf, sizeof(buf));
    if (n < 0) return fail("read");
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = write(c, buf + off, (size_t)(n - off));
      if (w <= 0) return fail("write");
      off += w;
    }
    total += (size_t)n;
  }
  close(c);
  close(l);
  printf("echoed %zu bytes\n", total);
  return 0;
}

static int client(const char* addr, int port, size_t bytes) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return fail("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    fprintf(stderr, "stream_echo: bad address %s\n", addr);
    return 2;
  }
  if (connect(s, (struct sockaddr*)&a, sizeof(a)) != 0) return fail("connect");
  uint8_t* out = malloc(bytes);
  uint8_t* in = malloc(bytes);
  if (out == NULL || in == NULL) return fail("malloc");
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern(i);
  size_t sent = 0, got = 0;
  int shut = 0;
  // Send and receive at once: the echo comes back while we still send.
  while (got < bytes) {
    struct pollfd p = {.fd = s, .events = POLLIN | (sent < bytes ? POLLOUT : 0)};
    if (poll(&p, 1, 20000) <= 0) {
      fprintf(stderr, "stream_echo: no progress in 20 s (%zu sent, %zu received)\n", sent, got);
      return 1;
    }
    if ((p.revents & POLLOUT) && sent < bytes) {
      size_t chunk = bytes - sent;
      if (chunk > 100000) chunk = 100000;
      const ssize_t w = send(s, out + sent, chunk, MSG_DONTWAIT);
      if (w > 0) sent += (size_t)w;
      else if (w < 0 && errno != EAGAIN) return fail("send");
    }
    if (sent == bytes && !shut) {
      shutdown(s, SHUT_WR);
      shut = 1;
    }
    if (p.revents & (POLLIN | POLLHUP)) {
      const ssize_t r = recv(s, in + got, bytes - got, MSG_DONTWAIT);
      if (r == 0) break;
      if (r > 0) got += (size_t)r;
      else if (errno != EAGAIN) return fail("recv");
    }
  }
  if (got != bytes) {
    fprintf(stderr, "stream_echo: echo ended after %zu of %zu bytes\n", got, bytes);
    return 1;
  }
  for (size_t i = 0; i < bytes; ++i) {
    if (in[i] != out[i]) {
      fprintf(stderr, "stream_echo: byte %zu differs (0x%02x, sent 0x%02x)\n", i, in[i], out[i]);
      return 1;
    }
  }
  close(s);
  printf("echo of %zu bytes matched\n", bytes);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "server") == 0) return server(atoi(argv[2]));
  if (argc == 5 && strcmp(argv[1], "client") == 0) {
    return client(argv[2], atoi(argv[3]), (size_t)strtoull(argv[4], NULL, 10));
  }
  fprintf(stderr, "usage: stream_echo server <port> | client <addr> <port> <bytes>\n");
  return 2;
}
