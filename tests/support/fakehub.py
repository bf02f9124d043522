"""A loopback fake of the Hub endpoints that huggingface_hub 2.4 calls to create repos and push.

Serves: ``POST /api/repos/create``, ``POST /api/validate-yaml``, ``POST /api/models/{id}/branch/{b}``,
``POST /api/models/{id}/preupload/{rev}``, the LFS batch API ``POST /{id}.git/info/lfs/objects/batch``
with single-part ``PUT`` uploads, and ``POST /api/models/{id}/commit/{rev}`` (NDJSON). The state
(repos, branches, files) lives in memory for the test to inspect. Every request must carry
``Authorization: Bearer <token>``. Used with ``HF_ENDPOINT=hub.url`` and the Xet transfer disabled.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    pulls: list[dict[str, bytes]] = field(default_factory=list)


class FakeHub:
    """Start with ``with FakeHub(token) as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self, token: str):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.upload_secret = secrets.token_hex(8)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id].branches[branch]


TOKEN = "hf_fakeTokenForLoopbackTests0123456789"


def hub_env(hub: FakeHub, tmp_path: Path, token: str | None = TOKEN) -> dict[str, str]:
    """The environment of a surgery subprocess that pushes to ``hub`` (no other HF_ setting leaks in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_XET="1",
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_COLOR="1",
        COLUMNS="200",
    )
    if token:
        env["HF_TOKEN"] = token
    return env


def run_surgery(args: list, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m surgery ARGS`` in the repository root with ``env``."""
    from tests.support.paths import REPO

    return subprocess.run(
        [sys.executable, "-m", "surgery", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=180,
    )


def card_front_matter(text: str) -> dict:
    """The YAML front matter of a model card, which must start the text."""
    assert text.startswith("---\n")
    return yaml.safe_load(text[4 : text.index("\n---", 4)])


def _front_matter(text: str) -> Any:
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4 : text.index("\n---", 4)])


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = b""
                while (size := int(self.rfile.readline().strip(), 16)) > 0:
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return data
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reply(self, status: int, payload: Any = None) -> None:
            data = json.dumps(payload if payload is not None else {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            path = urlparse(self.path).path
            hub.requests.append(f"{method} {path}")
            body = self._body()
            # LFS uploads go to a pre-signed URL (as on the real Hub): its secret replaces the token.
            presigned = method == "PUT" and path.startswith(f"/_lfs/{hub.upload_secret}/")
            if not presigned and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._reply(401, {"error": "Invalid credentials in Authorization header"})
            parts = [unquote(p) for p in path.strip("/").split("/")]
            try:
                self._dispatch(method, parts, body, urlparse(self.path).query)
            except KeyError as exc:
                self._reply(404, {"error": f"not found: {exc}"})

        def _dispatch(self, method: str, parts: list[str], body: bytes, query: str) -> None:
            if method == "PUT" and parts[0] == "_lfs":
                if hashlib.sha256(body).hexdigest() != parts[2]:
                    return self._reply(400, {"error": "sha256 mismatch"})
                hub.lfs[parts[2]] = body
                return self._reply(200)
            if parts[:2] == ["api", "repos"] and parts[2] == "create":
                req = json.loads(body)
                repo_id = f"{req.get('organization') or 'user'}/{req['name']}"
                if repo_id in hub.repos:
                    return self._reply(
                        409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}
                    )
                hub.repos[repo_id] = Repo(private=req.get("private") or req.get("visibility") == "private")
                return self._reply(200, {"url": f"{hub.url}/{repo_id}"})
            if parts[:2] == ["api", "validate-yaml"]:
                try:
                    meta = _front_matter(json.loads(body)["content"])
                    assert isinstance(meta, dict)
                except Exception as exc:  # any parse failure is the client's error, as on the Hub
                    return self._reply(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
                return self._reply(200, {"errors": [], "warnings": []})
            if len(parts) >= 2 and parts[1].endswith(".git"):  # LFS batch
                req = json.loads(body)
                objects = [
                    {
                        "oid": o["oid"],
                        "size": o["size"],
                        "actions": {"upload": {"href": f"{hub.url}/_lfs/{hub.upload_secret}/{o['oid']}"}},
                    }
                    for o in req["objects"]
                ]
                return self._reply(200, {"transfer": "basic", "objects": objects})
            if parts[:2] == ["api", "models"] and len(parts) == 6:
                repo_id, action, rev = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
                repo = hub.repos[repo_id]
                if action == "branch":
                    if rev in repo.branches:
                        return self._reply(409, {"error": "Branch already exists"})
                    repo.branches[rev] = dict(repo.branches["main"])
                    return self._reply(200)
                if action == "preupload":
                    files = [
                        {
                            "path": f["path"],
                            "shouldIgnore": False,
                            "oid": None,
                            "uploadMode": "lfs" if f["path"].endswith((".safetensors", ".undo")) else "regular",
                        }
                        for f in json.loads(body)["files"]
                    ]
                    return self._reply(200, {"files": files})
                if action == "commit":
                    return self._commit(repo_id, repo, rev, body, "create_pr=1" in query)
            self._reply(404, {"error": f"unknown endpoint {'/'.join(parts)}"})

        def _commit(self, repo_id: str, repo: Repo, rev: str, body: bytes, create_pr: bool) -> None:
            if create_pr:
                tree = dict(repo.branches["main"])
                repo.pulls.append(tree)
            else:
                tree = repo.branches[rev]
            for line in body.decode().splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "file":
                    tree[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] == "lfsFile":
                    tree[value["path"]] = hub.lfs[value["oid"]]
            oid = hashlib.sha1(json.dumps(sorted(tree)).encode() + body).hexdigest()
            pr = f"{hub.url}/{repo_id}/discussions/{len(repo.pulls)}" if create_pr else None
            self._reply(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": pr})

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_GET(self) -> None:
            self._route("GET")

    return Handler
