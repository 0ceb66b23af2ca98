#!/usr/bin/env python3
"""A loopback stand-in for the Hugging Face Hub's file API, to try
`agentd serve owner/name` on a machine without network access.

    agentd make-model --config models/qwen3-tiny.json --out /tmp/m
    scripts/mock-hub.py --repo demo/qwen3-tiny=/tmp/m --port 8765 &
    HF_ENDPOINT=http://127.0.0.1:8765 HF_HOME=/tmp/hf agentd serve demo/qwen3-tiny

It answers the two calls a download makes, as the Hub does: the listing
(`GET /api/models/{owner}/{name}/revision/{rev}`, 404 with
`X-Error-Code: RevisionNotFound` for an unknown revision) and
`GET /{owner}/{name}/resolve/{commit}/{file}` with `Range` for resumed
downloads. Standard library only. The project's own test of this path is
tests/serve_hub.rs (a Rust mock with private repos and cut connections).
"""

import argparse
import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def load_repo(directory):
    files = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                files[name] = f.read()
    return files


class Hub(BaseHTTPRequestHandler):
    repos = {}

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.startswith("/api/models/"):
            parts = path[len("/api/models/"):].split("/", 3)
            if len(parts) != 4 or parts[2] != "revision":
                return self.reply(400, b"{}")
            repo, rev = f"{parts[0]}/{parts[1]}", parts[3]
            files = self.repos.get(repo)
            if files is None:
                return self.reply(404, b"{}", [("X-Error-Code", "RepoNotFound")])
            if rev not in ("main", COMMIT):
                return self.reply(404, b"{}", [("X-Error-Code", "RevisionNotFound")])
            siblings = []
            for name, data in files.items():
                sha = hashlib.sha256(data).hexdigest()
                s = {"rfilename": name, "size": len(data), "blobId": sha[:40]}
                if name.endswith(".safetensors"):
                    s["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
                siblings.append(s)
            body = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings})
            return self.reply(200, body.encode(), [("Content-Type", "application/json")])
        parts = path.lstrip("/").split("/", 4)
        if len(parts) != 5 or parts[2] != "resolve":
            return self.reply(404)
        files = self.repos.get(f"{parts[0]}/{parts[1]}")
        data = None if files is None or parts[3] != COMMIT else files.get(parts[4])
        if data is None:
            return self.reply(404, b"", [("X-Error-Code", "EntryNotFound")])
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes="):
            try:
                start = int(rng[len("bytes="):].split("-")[0])
            except ValueError:
                start = 0
        if 0 < start < len(data):
            end = len(data) - 1
            return self.reply(206, data[start:], [("Content-Range", f"bytes {start}-{end}/{len(data)}")])
        return self.reply(200, data)

    def log_message(self, fmt, *args):
        print(f"mock-hub: {self.command} {self.path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", action="append", required=True,
                    help="owner/name=DIRECTORY (repeatable)")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    for spec in args.repo:
        repo, _, directory = spec.partition("=")
        Hub.repos[repo] = load_repo(directory)
        print(f"mock-hub: {repo} <- {directory} ({len(Hub.repos[repo])} files)", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Hub).serve_forever()


if __name__ == "__main__":
    main()
