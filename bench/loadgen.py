"""Load generators: wrk with a Lua script when installed, else a Python client; and a paced client.

``closed_loop`` keeps a fixed number of keep-alive connections busy (what wrk
does) and prints the same ``BENCH_RESULT`` line as the Lua script. It runs in
its own process (``python -m bench.loadgen``) so it never shares a core's
event loop with the harness. ``paced`` sends at a fixed rate (open loop) and
records when each 200 arrived, for the pipeline latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.deliveries import SignedSet

ROOT = Path(__file__).resolve().parents[1]
LUA_SCRIPT = ROOT / "bench" / "intake.lua"


@dataclass(frozen=True)
class LoadResult:
    generator: str
    requests: int
    seconds: float
    errors: int  # connect/read/write/timeout errors and non-2xx answers
    p50_ms: float
    p99_ms: float
    wraps: int

    @property
    def rps(self) -> float:
        return (self.requests - self.errors) / self.seconds if self.seconds else 0.0


def wrk_path() -> str | None:
    return shutil.which("wrk")


def _parse(generator: str, output: str) -> LoadResult:
    for line in output.splitlines():
        if line.startswith("BENCH_RESULT "):
            data = json.loads(line.removeprefix("BENCH_RESULT "))
            errors = sum(data[key] for key in data if key.startswith("errors_"))
            return LoadResult(
                generator,
                int(data["requests"]),
                data["duration_us"] / 1e6,
                int(errors),
                data["p50_us"] / 1000,
                data["p99_us"] / 1000,
                int(data["wraps"]),
            )
    raise RuntimeError(f"{generator} printed no result:\n{output[-2000:]}")


async def run_closed_loop(
    url: str, lines: Path, template: Path, *, seconds: float, connections: int, use_wrk: bool
) -> LoadResult:
    """One closed-loop run at ``connections`` concurrency; wrk (1 thread) or the Python client."""
    wrk = wrk_path() if use_wrk else None
    if wrk:
        command = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
        command += ["-s", str(LUA_SCRIPT), url, "--", str(lines), str(template), "1"]
        generator = "wrk"
    else:
        command = [sys.executable, "-m", "bench.loadgen", url, str(lines), str(template)]
        command += ["--seconds", str(seconds), "--connections", str(connections)]
        generator = "python"
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return _parse(generator, output.decode(errors="replace"))


# ---------------------------------------------------------------- raw HTTP/1.1


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _load_set(lines: Path, template: Path) -> SignedSet:
    kind, path, prefix, suffix = template.read_text().split("\n")[:4]
    signed = SignedSet(kind, path, prefix, suffix, [])
    for line in lines.read_text().splitlines():
        event_id, token, ts, signature = line.split(" ")
        signed.lines.append((event_id, token, int(ts), signature))
    return signed


async def closed_loop(host: str, port: int, signed: SignedSet, *, seconds: float, connections: int) -> dict[str, int]:
    latencies: list[float] = []
    errors = 0
    wraps = 0
    requests = signed.raw_requests()

    def next_request() -> bytes:
        nonlocal requests, wraps
        for _, request in requests:
            return request
        requests, wraps = signed.raw_requests(), wraps + 1
        return next(requests)[1]

    deadline = time.perf_counter() + seconds

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                writer.write(next_request())
                status = await _read_response(reader)
                latencies.append(time.perf_counter() - started)
                if status >= 300:
                    errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "duration_us": int(elapsed * 1e6),
        "errors_status": errors,
        "p50_us": int(_percentile(latencies, 0.50) * 1e6),
        "p90_us": int(_percentile(latencies, 0.90) * 1e6),
        "p99_us": int(_percentile(latencies, 0.99) * 1e6),
        "max_us": int((latencies[-1] if latencies else 0) * 1e6),
        "wraps": wraps,
    }


@dataclass(frozen=True)
class Sent:
    event_id: str
    status: int
    answered_at: float  # time.time() when the response arrived
    latency: float  # seconds from the scheduled send time to the response


async def paced(
    host: str, port: int, requests: Sequence[tuple[str, bytes]], *, rate: float, connections: int = 32
) -> list[Sent]:
    """Send ``requests`` at ``rate`` per second (open loop) over up to ``connections`` keep-alive connections."""
    queue: asyncio.Queue[tuple[float, str, bytes] | None] = asyncio.Queue()
    results: list[Sent] = []

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (item := await queue.get()) is not None:
                scheduled, event_id, request = item
                writer.write(request)
                status = await _read_response(reader)
                results.append(Sent(event_id, status, time.time(), time.perf_counter() - scheduled))
        finally:
            writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    start = time.perf_counter() + 0.05
    for n, (event_id, request) in enumerate(requests):
        scheduled = start + n / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((scheduled, event_id, request))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="Closed-loop HTTP/1.1 load (the fallback when wrk is absent).")
    parser.add_argument("url")
    parser.add_argument("lines", type=Path)
    parser.add_argument("template", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    host, _, port = args.url.removeprefix("http://").rstrip("/").partition(":")
    signed = _load_set(args.lines, args.template)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(closed_loop(host, int(port), signed, seconds=args.seconds, connections=args.connections))
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
