#!/usr/bin/env python3
"""Soak and load test of `coli serve` (issue #14, item 7). Not a unit test: run by hand.

Starts a real `coli serve` on 127.0.0.1 (a free port) with a scratch copy of the demo
model, then N clients (default 64) send requests for a fixed time (default 10 min):

  range     single, suffix, open-ended and multi-range (multipart/byteranges) Range GETs
            of the model's files; every byte checked against the file on disk
  chat      streamed /v1/chat/completions (SSE); about a third disconnect mid-stream
  complete  non-streamed /v1/completions
            (chat and complete from --chatters of the clients, default 32, which is the
            helper's default queue per model (--max-queue; up to --parallel of them run
            in one batch); a 503 "busy" is counted, not an error)
  bad       malformed requests: broken JSON, bad Content-Length, oversized bodies and
            headers, bad ranges, path traversal, unknown models, garbage request lines,
            requests cut off mid-head; each must get a 4xx (or a closed connection
            where HTTP gives the server no other answer), never a 5xx other than 503
  health    GET /health and /api/models
  big_prompt  (--big-prompts N clients) 4 MiB prompts to tokenize, as in issue #14's
            load test: /health and ranges must stay quick meanwhile

It prints one JSON record (counts, errors, latency percentiles per kind, the server's RSS
at the start and the end) and a Markdown table, and exits non-zero on any wrong byte,
any unexpected status, a server that died, or RSS growth beyond --rss-growth-mib.

  python3 tools/soak.py --coli target/release/coli --minutes 10 --clients 64

Only loopback traffic; every loop is bounded by the deadline.
"""

import argparse
import http.client
import json
import mmap
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120  # seconds per socket operation; a longer stall is an error


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.count = {}  # kind -> requests
        self.status = {}  # "kind status" -> n
        self.lat = {}  # kind -> [seconds]
        self.errors = []  # first few error descriptions
        self.n_errors = 0
        self.bytes_checked = 0
        self.wrong_bytes = 0
        self.disconnects = 0
        self.tokens = 0

    def done(self, kind, status, seconds):
        with self.lock:
            self.count[kind] = self.count.get(kind, 0) + 1
            key = f"{kind} {status}"
            self.status[key] = self.status.get(key, 0) + 1
            self.lat.setdefault(kind, []).append(seconds)

    def error(self, kind, what):
        with self.lock:
            self.n_errors += 1
            if len(self.errors) < 30:
                self.errors.append(f"{kind}: {what}")

    def add(self, name, n):
        with self.lock:
            setattr(self, name, getattr(self, name) + n)


class Client:
    """One simulated client: a keep-alive connection plus short raw connections."""

    def __init__(self, port, files, stats, rng, deadline, chatter=False):
        self.port, self.files, self.stats, self.rng, self.deadline = port, files, stats, rng, deadline
        self.conn = None
        # A chatter sends generations (streamed chats, some cut off, and completions); the
        # others fetch ranges, send malformed requests and poll /health. Generations run
        # one at a time per model, so a chatter spends most of its time in them.
        if chatter == "big":
            self.kinds = ["big_prompt"]
        elif chatter:
            self.kinds = ["chat"] * 3 + ["complete"]
        else:
            self.kinds = ["range"] * 60 + ["bad"] * 25 + ["health"] * 15

    def http(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        return self.conn

    def drop(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=None, headers=None):
        """One request on the keep-alive connection (reconnecting once if the server closed it)."""
        headers = dict(headers or {})
        for attempt in range(2):
            try:
                c = self.http()
                c.request(method, path, body=body, headers=headers)
                return c.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # An idle keep-alive connection closed by the server (10 s idle timeout,
                # or evicted): a client retries on a new connection, as browsers do.
                self.drop()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def run(self):
        while time.monotonic() < self.deadline:
            kind = self.rng.choice(self.kinds)
            t = time.monotonic()
            try:
                status = getattr(self, kind)()
                self.stats.done(kind, status, time.monotonic() - t)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                self.drop()
                self.stats.done(kind, "exception", time.monotonic() - t)
                self.stats.error(kind, f"{type(e).__name__}: {e}")
        self.drop()

    # -- Range fetches, every byte checked --------------------------------------------

    def pick_ranges(self, size):
        r = self.rng
        shape = r.random()
        if shape < 0.45:
            a = r.randrange(size)
            b = min(size - 1, a + r.choice([0, 1, 4095, 65535, r.randrange(1 << 20)]))
            return f"bytes={a}-{b}", [(a, b)]
        if shape < 0.55:
            n = r.randrange(1, min(size, 1 << 20) + 1)
            return f"bytes=-{n}", [(size - n, size - 1)]
        if shape < 0.62:
            a = r.randrange(max(1, size - (1 << 20)), size)
            return f"bytes={a}-", [(a, size - 1)]
        k = r.randrange(2, 17)
        spans = []
        for _ in range(k):
            a = r.randrange(size)
            spans.append((a, min(size - 1, a + r.randrange(1, 32768))))
        return "bytes=" + ",".join(f"{a}-{b}" for a, b in spans), spans

    def range(self):
        name = self.rng.choice(list(self.files))
        data = self.files[name]
        size = len(data)
        spec, spans = self.pick_ranges(size)
        resp = self.request("GET", f"/models/demo/{name}", headers={"Range": spec})
        body = resp.read()
        if resp.status != 206:
            self.stats.error("range", f"{name} {spec[:60]}: status {resp.status}")
            return resp.status
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("multipart/byteranges"):
            parts = parse_multipart(body, ctype.split("boundary=", 1)[1].strip('"'))
        else:
            cr = resp.getheader("Content-Range", "")
            parts = [(parse_content_range(cr), body)]
        # The parts must cover exactly the union of what was asked.
        want = union(spans)
        got = union([(a, b) for (a, b, _), _ in parts])
        if want != got:
            self.stats.error("range", f"{name} {spec[:60]}: parts cover {got[:4]} not {want[:4]}")
            self.stats.add("wrong_bytes", 1)
        for (a, b, total), chunk in parts:
            if total != size or len(chunk) != b - a + 1:
                self.stats.error("range", f"{name}: part {a}-{b}/{total} has {len(chunk)} bytes")
                self.stats.add("wrong_bytes", 1)
                continue
            if chunk != data[a : b + 1]:
                wrong = sum(1 for x, y in zip(chunk, data[a : b + 1]) if x != y)
                self.stats.error("range", f"{name}: {wrong} wrong bytes in {a}-{b}")
                self.stats.add("wrong_bytes", wrong)
            self.stats.add("bytes_checked", len(chunk))
        return resp.status

    # -- generations ------------------------------------------------------------------

    def chat(self):
        """A streamed chat; about a third of the clients hang up after a few events."""
        prompt = self.rng.choice(["Tell me a story.", "What is the capital of France?", "Count to ten.", "Hi"])
        body = json.dumps(
            {
                "model": "demo",
                "messages": [{"role": "user", "content": prompt}],
                "stream": True,
                "max_tokens": self.rng.randrange(1, 33),
                "temperature": self.rng.choice([0, 0.7]),
                "seed": self.rng.randrange(1000),
            }
        )
        hang_up_after = self.rng.randrange(1, 6) if self.rng.random() < 0.35 else None
        resp = self.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        if resp.status == 503:
            resp.read()  # the model's queue is full: a documented answer under load
            time.sleep(self.rng.uniform(0.1, 0.3))  # as a client would, before trying again
            return 503
        if resp.status != 200:
            self.stats.error("chat", f"status {resp.status}: {resp.read()[:200]!r}")
            return resp.status
        events, done = 0, False
        while True:
            line = resp.readline() if hang_up_after is None or events < hang_up_after else None
            if line is None:
                self.drop()  # hang up mid-stream: the server must cancel the generation
                self.stats.add("disconnects", 1)
                return "200-hung-up"
            if not line:
                break
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                ev = json.loads(payload)
                if "error" in ev:
                    self.stats.error("chat", f"error event {ev['error']}")
                    break
                events += 1
        resp.read()
        if not done:
            self.stats.error("chat", "the stream ended without [DONE]")
        self.stats.add("tokens", events)
        # http.client leaves a chunked response it did not read to the end unusable.
        self.drop()
        return 200

    def complete(self):
        body = json.dumps({"model": "demo", "prompt": "Once upon a time", "max_tokens": self.rng.randrange(1, 17)})
        resp = self.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        data = resp.read()
        if resp.status == 200:
            v = json.loads(data)
            if not isinstance(v["choices"][0]["text"], str):
                self.stats.error("complete", f"no text: {data[:200]!r}")
        elif resp.status == 503:
            time.sleep(self.rng.uniform(0.1, 0.3))
        else:
            self.stats.error("complete", f"status {resp.status}: {data[:200]!r}")
        return resp.status

    def big_prompt(self):
        """A prompt of the largest body /v1 takes (4 MiB of text to tokenize), which the
        demo model refuses as longer than its context: load on the tokenizer, not the model."""
        resp = self.request("POST", "/v1/completions", BIG_PROMPT, {"Content-Type": "application/json"})
        data = resp.read()
        if resp.status not in (200, 400, 503):
            self.stats.error("big_prompt", f"status {resp.status}: {data[:200]!r}")
        return resp.status

    def health(self):
        path = self.rng.choice(["/health", "/health", "/api/models"])
        resp = self.request("GET", path)
        data = resp.read()
        if resp.status != 200:
            self.stats.error("health", f"{path}: status {resp.status}")
        else:
            json.loads(data)
        return resp.status

    # -- malformed requests -----------------------------------------------------------

    def bad(self):
        host = f"127.0.0.1:{self.port}"
        cases = [
            ("POST /v1/chat/completions", b'{"model": "demo", "messages": [', "json", (400,)),
            ("POST /v1/chat/completions", b'{"model": "demo", "messages": 7}', "json", (400, 422)),
            ("POST /v1/chat/completions", b'{"model": "nope", "messages": []}', "json", (400, 404)),
            ("POST /v1/completions", b'{"model": "demo", "prompt": "x", "max_tokens": -1}', "json", (400, 422)),
            ("POST /v1/completions", b'{"model": "demo", "prompt": "x", "n": 5}', "json", (400,)),
            ("POST /api/usage", b'{"model": "demo", "counts": [[999, 999, 1]]}', "json", (400, 422)),
            ("POST /api/usage", b"\xff\xfe garbage", "json", (400, 415, 422)),
            ("GET /models/demo/../../../../etc/passwd", b"", None, (400, 404)),
            ("GET /models/demo/%2e%2e/%2e%2e/etc/passwd", b"", None, (400, 404)),
            ("GET /models/nope/weights.bin", b"", None, (404,)),
            ("GET /models/demo/weights.bin", b"", "range:bytes=999999999-", (416,)),
            ("GET /models/demo/weights.bin", b"", "range:bytes=" + ",".join(["0-0"] * 300), (416,)),
            ("GET /no/such/page", b"", None, (404,)),
            ("DELETE /health", b"", None, (405,)),
        ]
        r = self.rng.random()
        if r < 0.55:
            line, body, extra, ok = self.rng.choice(cases)
            method, path = line.split(" ", 1)
            head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            if extra == "json":
                head += "Content-Type: application/json\r\n"
            elif extra and extra.startswith("range:"):
                head += f"Range: {extra[6:]}\r\n"
            if body or method == "POST":
                head += f"Content-Length: {len(body)}\r\n"
            return self.raw(head.encode() + b"\r\n" + body, ok, line)
        if r < 0.65:  # a Content-Length over the route's limit: refused before the body
            raw = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: 99999999999\r\n\r\n"
            return self.raw(raw.encode(), (413,), "huge content-length")
        if r < 0.72:  # a header block over 64 KiB
            raw = f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Big: {'a' * 70000}\r\n\r\n"
            return self.raw(raw.encode(), (431, "closed"), "big header")
        if r < 0.79:  # a foreign Host (DNS rebinding)
            return self.raw(b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n", (403, 421), "foreign host")
        if r < 0.86:  # garbage instead of a request line
            junk = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200)))
            return self.raw(junk + b"\r\n\r\n", (400, "closed"), "garbage")
        if r < 0.93:  # Content-Length that is not a number
            raw = f"POST /api/usage HTTP/1.1\r\nHost: {host}\r\nContent-Length: 12abc\r\n\r\n"
            return self.raw(raw.encode(), (400, "closed"), "bad content-length")
        # A request head cut off: the client hangs up before finishing it.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        s.sendall(f"GET /models/demo/weights.bin HTTP/1.1\r\nHost: {host}\r\nRange: by".encode())
        s.close()
        return "cut"

    def raw(self, data, ok, what):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        try:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered (and closed) before reading everything
            head = b""
            try:
                while b"\r\n" not in head:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    head += chunk
            except ConnectionResetError:
                pass
        finally:
            s.close()
        if not head:
            status = "closed"
        else:
            try:
                status = int(head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                status = f"junk {head[:30]!r}"
        if status not in ok:
            self.stats.error("bad", f"{what}: got {status}, want one of {ok}")
        return status


# 4 MiB less a little: the largest /v1 body (openai::MAX_BODY).
BIG_PROMPT = json.dumps(
    {"model": "demo", "prompt": "And the earth was without form, and void. " * ((4 * 1024 * 1024 - 1024) // 43), "max_tokens": 1}
).encode()


def parse_content_range(v):
    # "bytes A-B/LEN"
    unit, rest = v.split(" ", 1)
    span, total = rest.split("/", 1)
    a, b = span.split("-", 1)
    return int(a), int(b), int(total)


def parse_multipart(body, boundary):
    parts = []
    delim = b"--" + boundary.encode()
    pos = body.index(delim)
    while True:
        pos += len(delim)
        if body[pos : pos + 2] == b"--":
            return parts
        head_end = body.index(b"\r\n\r\n", pos)
        head = body[pos:head_end].decode()
        cr = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("content-range:")]
        a, b, total = parse_content_range(cr[0])
        start = head_end + 4
        parts.append(((a, b, total), body[start : start + b - a + 1]))
        pos = body.index(delim, start + b - a + 1)


def union(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * p)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coli", default=os.path.join(ROOT, "target/release/coli"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/demo"), help="a converted model directory")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--chatters", type=int, default=32, help="how many of the clients send generations")
    ap.add_argument(
        "--big-prompts", type=int, default=0, help="how many of the clients send maximum-size prompts (4 MiB) instead"
    )
    ap.add_argument("--threads", type=int, default=1, help="the server's engine threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rss-growth-mib",
        type=float,
        default=16,
        help="largest RSS growth over the second half of the run that passes (the first half warms up: "
        "threads, allocator arenas, the expert cache)",
    )
    ap.add_argument("--json", help="also write the record to this file")
    a = ap.parse_args()

    scratch = tempfile.mkdtemp(prefix="coli-soak-")
    models = os.path.join(scratch, "models")
    shutil.copytree(a.model, os.path.join(models, "demo"), ignore=shutil.ignore_patterns("usage.json*"))
    port = free_port()
    env = dict(os.environ, XDG_DATA_HOME=os.path.join(scratch, "data"), RUST_LOG="warn")
    log = open(os.path.join(scratch, "serve.log"), "wb")
    server = subprocess.Popen(
        [a.coli, "serve", "--port", str(port), "--models-dir", models, "--model", "demo", "--threads", str(a.threads)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        files = {}
        for name in sorted(os.listdir(os.path.join(models, "demo"))):
            with open(os.path.join(models, "demo", name), "rb") as f:
                files[name] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(f.name) else b""
        files = {k: v for k, v in files.items() if len(v) > 0}
        # Warm up (the model loads on the first generation), then take the starting RSS.
        warm = Client(port, files, Stats(), random.Random(0), time.monotonic() + 60)
        warm.complete()
        warm.range()
        warm.drop()
        rss_start = rss_kib(server.pid)
        load_start = os.getloadavg()
        stats = Stats()
        deadline = time.monotonic() + a.minutes * 60
        clients = [
            Client(
                port,
                files,
                stats,
                random.Random(a.seed * 1000 + i),
                deadline,
                chatter="big" if i < a.big_prompts else i < a.big_prompts + a.chatters,
            )
            for i in range(a.clients)
        ]
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads):
            time.sleep(5)
            if server.poll() is not None:
                stats.error("server", f"exited with {server.returncode}")
                break
            samples.append((round(time.monotonic() - t0), rss_kib(server.pid)))
        for t in threads:
            t.join(TIMEOUT)
        elapsed = time.monotonic() - t0
        alive = server.poll() is None
        rss_end = rss_kib(server.pid) if alive else 0
        rss_peak = rss_kib(server.pid, "VmHWM") if alive else 0
        health = {}
        if alive:
            # Afterwards the server still answers a generation and a range, and no
            # generation is left running.
            after = Client(port, files, stats, random.Random(1), time.monotonic() + 60)
            for kind in ("complete", "chat", "range"):
                t = time.monotonic()
                status = getattr(after, kind)()
                stats.done(kind + "-after", status, time.monotonic() - t)
                if status != 200 and status != 206:
                    stats.error("after", f"{kind} after the soak: {status}")
            after.drop()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/health")
            health = json.loads(c.getresponse().read())
            c.close()
            if health["generations"]["active"] != 0:
                stats.error("after", f"generations still active: {health['generations']}")
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    lat = {
        k: {"n": len(v), "p50_ms": round(pct(v, 0.5) * 1e3, 2), "p99_ms": round(pct(v, 0.99) * 1e3, 2)}
        for k, v in sorted(stats.lat.items())
    }
    total = sum(stats.count.values())
    half = [kib for t, kib in samples if t >= elapsed / 2]
    growth_mib = (rss_end - half[0]) / 1024 if half and rss_end else float("inf")
    record = {
        "command": " ".join(sys.argv),
        "clients": a.clients,
        "seconds": round(elapsed, 1),
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "by_kind": stats.count,
        "statuses": dict(sorted(stats.status.items())),
        "errors": stats.n_errors,
        "first_errors": stats.errors,
        "bytes_checked": stats.bytes_checked,
        "wrong_bytes": stats.wrong_bytes,
        "stream_disconnects": stats.disconnects,
        "stream_events": stats.tokens,
        "latency": lat,
        "rss_kib": {
            "start": rss_start,
            "end": rss_end,
            "peak": rss_peak,
            "growth_second_half_mib": round(growth_mib, 1),
            "samples": samples[:: max(1, len(samples) // 20)],
        },
        "server_alive": alive,
        "health_at_end": health,
        "load_avg_at_start": load_start,
        "load_avg_at_end": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(record, indent=1))
    print()
    print(f"| kind | requests | p50 | p99 |")
    print(f"| --- | --- | --- | --- |")
    for k, v in lat.items():
        print(f"| {k} | {v['n']} | {v['p50_ms']} ms | {v['p99_ms']} ms |")
    print(
        f"\n{total} requests in {elapsed:.0f} s, {stats.n_errors} errors, {stats.wrong_bytes} wrong bytes of "
        f"{stats.bytes_checked} checked, RSS {rss_start / 1024:.1f} -> {rss_end / 1024:.1f} MiB (peak {rss_peak / 1024:.1f}; "
        f"{growth_mib:+.1f} MiB over the second half)"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    shutil.rmtree(scratch, ignore_errors=True)
    ok = alive and stats.n_errors == 0 and stats.wrong_bytes == 0 and growth_mib <= a.rss_growth_mib
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
