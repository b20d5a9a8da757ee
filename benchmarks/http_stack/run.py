"""HTTP stack benchmark for modelhost: uvicorn+raw ASGI, uvicorn+starlette, aiohttp, granian.

Every stack serves the same trivial KServe-V2-shaped app (see common.py):
  GET  /v2/health/live       -> 200, empty body
  POST /v2/models/tiny/infer -> read whole body, orjson.loads if it starts with '{', answer ~90 B JSON

Run (from anywhere; needs /usr/bin/wrk, uvicorn[standard], starlette, aiohttp, granian, orjson, uvloop):
  python benchmarks/http_stack/run.py                     # full matrix, 2 runs (~8 min)
  python benchmarks/http_stack/run.py --runs 1 --duration 2 --stacks granian uvicorn_raw   # quick look

Each server is started as a subprocess on 127.0.0.1:<free port>, polled until it answers, loaded with
wrk (1 s warm-up, then --duration s with --latency), and killed. Run 2 visits the stacks in reverse
order. Prints a markdown table (median of runs per cell; † = runs differ by >25 % in req/s) and the
body-chunking probe (how a 2 MB body reaches the handler), and writes raw numbers to results/*.json.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STACKS = {  # name -> server script (takes PORT as argv[1])
    "uvicorn_raw": "srv_uvicorn_raw.py",
    "starlette": "srv_starlette.py",
    "aiohttp": "srv_aiohttp.py",
    "granian": "srv_granian.py",
}
INFER = "/v2/models/tiny/infer"
# (label, path, lua script or None, connections)
CELLS = [("GET health", "/v2/health/live", None, c) for c in (1, 8, 32)] \
    + [("POST json 119B", INFER, "post_small.lua", c) for c in (1, 8, 32)] \
    + [("POST bin 2MB", INFER, "post_large.lua", c) for c in (1, 4)]
LARGE = 2_000_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=10.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def start(stack):
    port = free_port()
    proc = subprocess.Popen([sys.executable, STACKS[stack], str(port)], cwd=HERE, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{stack} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if request(port, "GET", "/v2/health/live", timeout=1)[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{stack} did not answer within 20 s")


def stop(proc):
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)  # our own session: server + any worker processes it spawned
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def to_ms(txt):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", txt)
    return float(m.group(1)) * UNIT[m.group(2)]


def wrk(port, path, script, conns, duration, env):
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{duration}s", "--timeout", "5s", "--latency"]
    if script:
        cmd += ["-s", os.path.join(HERE, script)]
    cmd.append(f"http://127.0.0.1:{port}{path}")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=duration + 30).stdout
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": to_ms(pct["50"]), "p99_ms": to_ms(pct["99"]),
        "errors": (sum(map(int, errs.groups())) if errs else 0) + (int(non2xx.group(1)) if non2xx else 0),
    }


def probe_chunks(port, body, tries=3):
    """POST the 2 MB body to /debug/chunks a few times; the split depends on socket timing."""
    reps = [json.loads(request(port, "POST", "/debug/chunks", body)[1]) for _ in range(tries)]
    assert all(r["total"] == len(body) for r in reps), reps
    return {"chunks": [r["chunks"] for r in reps], "first_sizes": reps[0]["sizes"], "types": reps[0]["types"]}


def fmt(cells):
    rps = [c["rps"] for c in cells]
    flag = "†" if len(rps) > 1 and max(rps) > 1.25 * min(rps) else ""
    err = sum(c["errors"] for c in cells)
    med = lambda k: statistics.median(c[k] for c in cells)  # noqa: E731
    return (f"{med('rps'):,.0f}{flag} / {med('p50_ms'):.2f} / {med('p99_ms'):.2f}"
            + (f" ({err} err)" if err else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", nargs="+", default=list(STACKS), choices=list(STACKS))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()

    body = os.urandom(LARGE)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(body)
        f.flush()
        env = dict(os.environ, BODY_FILE=f.name)
        results = {s: {i: [] for i in range(len(CELLS))} for s in args.stacks}
        probes = {}
        for run in range(args.runs):
            order = args.stacks if run % 2 == 0 else args.stacks[::-1]
            for stack in order:
                proc, port = start(stack)
                try:
                    assert request(port, "POST", INFER, b'{"inputs":[]}')[0] == 200
                    if stack not in probes:
                        probes[stack] = probe_chunks(port, body)
                    for i, (label, path, script, conns) in enumerate(CELLS):
                        wrk(port, path, script, conns, args.warmup, env)
                        r = wrk(port, path, script, conns, args.duration, env)
                        results[stack][i].append(r)
                        print(f"run {run + 1} {stack:12s} {label:15s} c={conns:<3d} {r['rps']:>10,.0f} req/s "
                              f"p50 {r['p50_ms']:.3f} ms p99 {r['p99_ms']:.3f} ms err {r['errors']}", flush=True)
                finally:
                    stop(proc)

    print(f"\nreq/s / p50 ms / p99 ms (median of {args.runs} run(s), {args.duration} s each; † = runs differ >25 %)\n")
    print("| scenario | c | " + " | ".join(args.stacks) + " |")
    print("|---|---|" + "---|" * len(args.stacks))
    for i, (label, _, _, conns) in enumerate(CELLS):
        print(f"| {label} | {conns} | " + " | ".join(fmt(results[s][i]) for s in args.stacks) + " |")
    print("\n2 MB body arrival (chunks per request over 3 probes; first chunk sizes; chunk type):")
    for s, p in probes.items():
        print(f"  {s:12s} chunks={p['chunks']} first_sizes={p['first_sizes']} types={p['types']}")

    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as fh:
        json.dump({"cells": [c[:2] + (c[3],) for c in CELLS], "results": results, "probes": probes,
                   "args": vars(args), "nproc": os.cpu_count()}, fh, indent=1)
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()
