#!/usr/bin/env python3
"""A loopback TCP proxy in front of an S3-compatible server that adds first-byte latency.

  latency_proxy.py LISTEN_PORT TARGET_PORT DELAY_MS COUNTS_FILE [TRACE_FILE]

Every HTTP request a client sends waits DELAY_MS before the first byte of its response is
passed on (what an object store's first-byte latency looks like to a client; bodies then stream
at loopback speed). Each request's method is counted (from its request line) and the counts
written to COUNTS_FILE as JSON on SIGTERM/SIGINT and every second, so a benchmark can report
requests per run by method. With TRACE_FILE, every request is also written there as a line
"<ms since start> <connection> <method> <path> [<range>]", to see which requests a run makes one after
another.
With the environment variable MBPS (MB/s, e.g. 80), each connection's response bodies are also
paced to that rate: a single S3 GET streams at roughly 50-100 MB/s, which loopback does not, so
without it bigger objects look free.
"""
import os
import asyncio
import json
import signal
import sys
import time

LISTEN, TARGET, DELAY, OUT = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000, sys.argv[4]
TRACE = open(sys.argv[5], "w") if len(sys.argv) > 5 else None
START = time.monotonic()
RATE = float(os.environ.get("MBPS", "0")) * 1e6  # bytes per second per connection; 0: unpaced
connections = 0
counts = {}
METHODS = (b"GET ", b"PUT ", b"HEAD ", b"POST ", b"DELETE ")


def save():
    with open(OUT, "w") as f:
        json.dump(counts, f)


async def handle(client_r, client_w):
    global connections
    connections += 1
    conn = connections
    server_r, server_w = await asyncio.open_connection("127.0.0.1", TARGET)
    pending = asyncio.Queue()  # one entry per request whose response has not started

    async def upstream():
        try:
            while True:
                data = await client_r.read(65536)
                if not data:
                    break
                # a request line starts a new request (bodies of PUTs never start with a method
                # followed by a path in practice for this benchmark's Parquet/JSON payloads)
                for m in METHODS:
                    if data.startswith(m):
                        counts[m.decode().strip()] = counts.get(m.decode().strip(), 0) + 1
                        pending.put_nowait(True)
                        if TRACE:
                            head = data.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
                            lines = head.split("\r\n")
                            rng = [h.split(":", 1)[1].strip() for h in lines[1:]
                                   if h.lower().startswith("range:")]
                            ms = (time.monotonic() - START) * 1000
                            TRACE.write(f"{ms:.0f} {conn} {lines[0].rsplit(' ', 1)[0]}"
                                        f"{' ' + rng[0] if rng else ''}\n")
                        break
                server_w.write(data)
                await server_w.drain()
        finally:
            server_w.close()

    async def downstream():
        began, sent = 0.0, 0  # pacing: when the current response's first byte went, bytes since
        try:
            while True:
                data = await server_r.read(65536)
                if not data:
                    break
                if not pending.empty():
                    pending.get_nowait()
                    await asyncio.sleep(DELAY)
                    began, sent = time.monotonic(), 0
                if RATE:
                    sent += len(data)
                    ahead = began + sent / RATE - time.monotonic()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                client_w.write(data)
                await client_w.drain()
        finally:
            client_w.close()

    await asyncio.gather(upstream(), downstream(), return_exceptions=True)


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)

    async def saver():
        while not stop.is_set():
            save()
            await asyncio.sleep(1)

    async with server:
        t = asyncio.create_task(saver())
        await stop.wait()
        t.cancel()
    save()
    if TRACE:
        TRACE.close()


asyncio.run(main())
