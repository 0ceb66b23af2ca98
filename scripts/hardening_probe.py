"""Issue 15's findings, probed against a real `agentd serve` binary (stdlib
only): run it on the binary before the hardening and on today's to show
each finding failing before and passing now.

Usage: python3 scripts/hardening_probe.py AGENTD_BINARY [--port P]

Each probe starts its own server (default tiny model, a temp sandbox root),
does what a hostile client did, and prints PASS (the finding is fixed) or
FAIL (it reproduces), with what it saw. Exit status: the number of FAILs.
The server runs as this user (root on the build machine), which is what
made the findings dangerous.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN = sys.argv[1]
PORT = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 18471
BASE = f"http://127.0.0.1:{PORT}"
results = []


class Server:
    """`agentd serve` on a port of its own (a server that is slow to go away
    never answers for the next probe)."""

    def __init__(self, *args, nofile=None):
        global PORT, BASE
        PORT += 1
        BASE = f"http://127.0.0.1:{PORT}"
        self.root = tempfile.mkdtemp(prefix="agentd-probe-")
        self.log = open(os.path.join(self.root, "serve.log"), "w")
        limit = (lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        self.p = subprocess.Popen([BIN, "serve", "--port", str(PORT), "--sandbox-root", self.root,
                                   *args], stdout=self.log, stderr=subprocess.STDOUT,
                                  preexec_fn=limit)
        for _ in range(600):
            if self.p.poll() is not None:
                self.started = False
                return
            try:
                urllib.request.urlopen(BASE + "/health", timeout=1)
                self.started = True
                return
            except Exception:
                time.sleep(0.1)
        self.started = False

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.log.close()


def call(method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(BASE + path, data, h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(errors="replace"), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), e.headers.get("content-type", "")


def model(headers=None):
    return json.loads(call("GET", "/v1/models", None, headers)[1])["data"][0]["id"]


def make_program(pid, headers=None):
    """A program exists once it made a request; tool resources attach to it."""
    return call("POST", "/v1/completions", {"model": model(headers), "prompt": "hi",
                                            "max_tokens": 2, "program_id": pid}, headers)[0]


def is_json_error(body, ctype):
    try:
        return ctype.startswith("application/json") and "message" in json.loads(body)["error"]
    except Exception:
        return False


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def report(name, ok, seen):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {seen}", flush=True)


def foreign_pid():
    # Another user's process in its own session: nothing agentd started.
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    s = Server()
    make_program("p1")
    code, body, _ = call("POST", "/programs/p1/resources", {"pids": [victim.pid]})
    call("POST", "/programs/release", {"program_id": "p1"})
    time.sleep(3)
    ok = alive(victim.pid)
    report("a declared foreign pid is not killed on release", ok,
           f"declare -> {code}; the unrelated process is {'alive' if ok else 'killed'}")
    victim.kill()
    victim.wait()
    s.stop()


def tenants():
    s = Server("--api-key", "key-a", "--api-key", "key-b")
    if not s.started:
        report("another tenant's program is 404 to list and release", False,
               "the server does not start with two --api-key (no tenants)")
        return
    a, b = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}
    make_program("mine", a)
    _, listed, _ = call("GET", "/programs", None, b)
    code, _, _ = call("POST", "/programs/release", {"program_id": "mine"}, b)
    ok = "mine" not in listed and code == 404
    report("another tenant's program is 404 to list and release", ok,
           f"tenant b lists it: {'mine' in listed}; releases it: {code}")
    s.stop()


def environment_opt_in():
    s = Server()
    make_program("e1")
    code, body, _ = call("POST", "/programs/e1/environment", {"local": {"command": "id -u"}})
    time.sleep(1)
    _, env, _ = call("GET", "/programs/e1/environment?wait=5")
    ran = code < 300
    report("environment commands are off unless enabled", not ran,
           f"POST environment -> {code} {body[:110]!r}; then {env[:80]!r}")
    s.stop()


def setsid_child():
    s = Server("--allow-environment-commands", "--sandbox-user", "nobody")
    if not s.started:  # the binary before had no such flag: commands ran anyway
        s.stop()
        s = Server()
    marker = f"sleep 3{os.getpid() % 1000}.{time.time_ns() % 1000}"
    cmd = f"setsid {marker} >/dev/null 2>&1 & sleep 0.5"
    make_program("e2")
    code, body, _ = call("POST", "/programs/e2/environment", {"local": {"command": cmd}})
    call("GET", "/programs/e2/environment?wait=10")
    time.sleep(1)
    call("POST", "/programs/release", {"program_id": "e2"})
    time.sleep(4)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    report("a setsid child of an environment command dies with its program", code < 300 and not left,
           f"environment -> {code}; survivors after release: {len(left)}")
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    s.stop()


def half_open():
    s = Server(nofile=1024)
    socks, failed = [], 0
    for _ in range(1500):
        try:
            c = socket.create_connection(("127.0.0.1", PORT), timeout=2)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            socks.append(c)
        except OSError:
            failed += 1
            if failed >= 20:  # the server stopped taking connections
                break
    time.sleep(1)
    try:
        code = urllib.request.urlopen(BASE + "/health", timeout=15).status
    except Exception as e:
        code = repr(e)[:60]
    report("/health answers under 1500 half-open connections (fd limit 1024)", code == 200,
           f"opened {len(socks)} ({failed} refused or timed out); /health -> {code}")
    for c in socks:
        c.close()
    s.stop()


def tool_paths():
    s = Server()
    make_program("q")
    with open(os.path.join(s.root, "file"), "w") as f:
        f.write("x")
    seen = []
    for d in ["file/sub", "a\u0000b", "x" * 300]:
        code, body, ctype = call("POST", "/programs/q/resources", {"dirs": [os.path.join(s.root, d)]})
        seen.append((code, is_json_error(body, ctype)))
    ok = all(c == 400 and j for c, j in seen)
    report("tool-resource path errors are 400 JSON errors", ok, f"(status, json) {seen}")
    s.stop()


def oversized_body():
    """A 3 MB body (over axum's 2 MB default limit), sent whole."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    try:
        c.request("POST", "/v1/completions", b" " * (3 << 20), {"Content-Type": "application/json"})
        r = c.getresponse()
        out = (r.status, r.read().decode(errors="replace"), r.getheader("content-type", ""))
    except OSError as e:
        out = (0, repr(e), "")
    c.close()
    return out


def error_shapes():
    s = Server()
    cases = {
        "body over the limit": oversized_body(),
        "unknown route": call("GET", "/no/such/route"),
        "wrong method": call("DELETE", "/v1/completions"),
        "max_tokens 2^64-1": call("POST", "/v1/completions",
                                  {"model": model(), "prompt": "hi", "max_tokens": 2**64 - 1}),
    }
    bad = {k: v[0] for k, v in cases.items() if not (400 <= v[0] < 500 and is_json_error(v[1], v[2]))}
    report("every refusal is a 4xx OpenAI JSON error", not bad, f"not JSON 4xx: {bad or 'none'}")
    s.stop()
    s = Server("--api-key", "k")
    code, _, _ = call("GET", "/v1/models", None, {"authorization": "bearer k"})
    report("the Bearer scheme is case-insensitive", code == 200, f"'bearer k' -> {code}")
    s.stop()
    s = Server()
    call("POST", "/programs/release", {"program_id": "early"})
    make_program("early")
    _, listed, _ = call("GET", "/programs")
    report("a release before the first request is not undone by it", "early" not in listed,
           f"program listed after: {'early' in listed}")
    s.stop()


for probe in (foreign_pid, tenants, environment_opt_in, setsid_child, half_open, tool_paths,
              error_shapes):
    try:
        probe()
    except Exception as e:  # a probe that cannot run is a failure to show
        report(probe.__name__, False, f"probe error {e!r}")
print(f"{results.count(True)} PASS, {results.count(False)} FAIL")
sys.exit(results.count(False))
