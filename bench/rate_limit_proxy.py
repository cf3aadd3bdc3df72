#!/usr/bin/python3
"""A loopback TCP proxy that behaves as a link of a given rate: every byte forwarded, in either
direction, by any connection, draws from one token bucket per direction (a full-duplex link
shared by all connections), so a client behind it meets the link's bandwidth, not loopback's.

Usage: bench/rate_limit_proxy.py --rate 100M --to 127.0.0.1:8420 --ready-file FILE
  --rate  bits per second (suffix K, M or G: 10^3, 10^6, 10^9)
Listens on 127.0.0.1 on a free port and writes the port to --ready-file once it accepts.
Runs until killed; prints the bytes forwarded each way on SIGTERM."""
import argparse
import asyncio
import signal
import sys
import time

_PIECE = 64 << 10


class Bucket:
    """Tokens (bytes) at `rate` bytes/s, at most `burst` held: senders wait for their share."""

    def __init__(self, rate, burst):
        self.rate, self.burst = rate, burst
        self.tokens, self.last = burst, time.monotonic()
        self.lock = asyncio.Lock()
        self.forwarded = 0

    async def take(self, n):
        async with self.lock:  # one sender at a time: the link is shared in order
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            if self.tokens < 0:
                await asyncio.sleep(-self.tokens / self.rate)
        self.forwarded += n


async def pump(reader, writer, bucket):
    try:
        while True:
            data = await reader.read(_PIECE)
            if not data:
                break
            await bucket.take(len(data))
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()


def parse_rate(text):
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}
    if text[-1].upper() in scale:
        return float(text[:-1]) * scale[text[-1].upper()]
    return float(text)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", required=True, help="bits per second (100M, 1G)")
    parser.add_argument("--to", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    rate = parse_rate(args.rate) / 8
    host, port = args.to.rsplit(":", 1)
    # A burst of 10 ms of the link: smooth at the rate, without a wait per piece.
    up, down = Bucket(rate, max(_PIECE, rate / 100)), Bucket(rate, max(_PIECE, rate / 100))

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, up),
                             pump(server_reader, client_writer, down))
        client_writer.close()
        server_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    with open(args.ready_file, "w") as ready:
        ready.write(str(server.sockets[0].getsockname()[1]))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()
    print(f"forwarded up {up.forwarded} down {down.forwarded} bytes", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
