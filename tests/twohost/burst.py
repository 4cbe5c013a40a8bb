#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
"""A burst of hostile connection attempts against one siwx listener.

Usage: burst.py ADDR PORT COUNT HOLD_SECONDS [SOURCE_ADDR]

Opens COUNT TCP connections to ADDR:PORT at once. Even-numbered ones send 64
octets that are not an MPA Request (RFC 5044 7.1.1: the key is wrong);
odd-numbered ones send nothing and wait (a peer that never starts MPA).
Connects from SOURCE_ADDR when given. Holds them for at most HOLD_SECONDS
and prints one line:
  burst: attempts=N connected=N garbage=N silent=N closed_by_server=N left_open=N
The server should close every one of them (the garbage at once, the silent
ones when its MPA startup timeout expires). Exit status 0 once the line is
printed; the caller judges the counts.
"""
import os
import selectors
import socket
import sys
import time


def main():
    addr, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    source = sys.argv[5] if len(sys.argv) > 5 else None
    sel = selectors.DefaultSelector()
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source:
            s.bind((source, 0))
        s.setblocking(False)
        s.connect_ex((addr, port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE, i)
    connected = garbage = silent = closed = 0
    deadline = time.monotonic() + hold
    open_socks = set(range(count))
    while open_socks and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            i = key.data
            s = socks[i]
            if key.events & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    sel.unregister(s)
                    open_socks.discard(i)
                    continue
                connected += 1
                if i % 2 == 0:
                    try:
                        s.send(os.urandom(64))
                    except OSError:
                        pass
                    garbage += 1
                else:
                    silent += 1
                sel.modify(s, selectors.EVENT_READ, i)
                continue
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed += 1
                sel.unregister(s)
                open_socks.discard(i)
    print(f"burst: attempts={count} connected={connected} garbage={garbage} silent={silent} "
          f"closed_by_server={closed} left_open={len(open_socks)}", flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
