"""A stand-in of the Hugging Face hub's HTTP API on 127.0.0.1, for the real ``huggingface_hub`` client.

``tests/engine/test_hub.py`` points ``huggingface_hub`` at it (``HF_ENDPOINT``) and serves folders of real config
files and sparse safetensors files (``sparse_safetensors.py``: a header and a hole). It answers what the client
asks, as the hub does:

* ``HEAD``/``GET /{owner}/{name}/resolve/{revision}/{file}``: ``ETag``, ``X-Repo-Commit``, ``Content-Length``,
  ``Accept-Ranges``; a ``Range: bytes=a-b`` GET is a 206 with ``Content-Range``. A file over 10 MiB is an LFS file,
  as on the hub: the ``resolve`` URL answers 302 to a CDN URL (``/cdn/...``, here on the same server) with
  ``X-Linked-Size``, ``X-Linked-Etag`` and ``X-Repo-Commit``, and the CDN serves the bytes and ranges;
* ``GET /api/models/{owner}/{name}[/revision/{revision}]``: the model info (``sha``, ``siblings``);
* errors with the hub's ``X-Error-Code``: ``RepoNotFound`` (404), ``RevisionNotFound`` (404), ``EntryNotFound``
  (404), ``GatedRepo`` (401 without a token that has access, 403 with a token that has none).

Every request is logged (method, path, range, status, body bytes sent), so that a test can assert which bytes of
which file were read.

A file can be served as a hostile mirror would serve it (:class:`Hostile`, ``StubRepo.hostile[file]``): an ETag or
``X-Repo-Commit`` that is a path, a redirect to a non-http target, a body that never ends (with or without a
``Content-Length`` on its ``HEAD``), a body trickled a byte at a time. ``tests/engine/test_hub_hostile.py`` uses
them.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["Hostile", "HubStub", "Request", "StubRepo", "point_at"]

GOOD_TOKEN = "hf_stub_has_access"
NO_ACCESS_TOKEN = "hf_stub_without_access"


@dataclass
class Hostile:
    """How a hostile mirror serves one file (each field None: as the hub does).

    ``etag``/``commit``: sent as the ``ETag`` (quoted) and ``X-Repo-Commit``; ``location``: the ``resolve`` URL
    answers 302 to it; ``endless``: the ``GET`` sends spaces until the client hangs up, without a length, and
    the ``HEAD`` announces ``endless`` bytes (-1: no length); ``trickle``: seconds between the body's bytes
    (``GET`` and range requests: the file's own bytes, one at a time).
    """

    etag: str | None = None
    commit: str | None = None
    location: str | None = None
    endless: int | None = None
    trickle: float | None = None


@dataclass
class StubRepo:
    """A repo: its files (served from ``folder``), its commit, and whether it is gated."""

    repo_id: str
    folder: Path
    sha: str
    gated: bool = False
    ignore_range: bool = False  # answer a Range request with the whole file (200), as some servers do
    hostile: dict[str, Hostile] = field(default_factory=dict)  # file name -> how it is served

    def file(self, name: str) -> Path | None:
        path = (self.folder / name).resolve()
        return path if path.is_file() and path.is_relative_to(self.folder.resolve()) else None

    def siblings(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


@dataclass
class Request:
    """One request as served: ``range`` is the ``Range`` header (None without), ``sent`` the body bytes written."""

    method: str
    path: str
    range: str | None
    status: int
    sent: int = 0
    file: str | None = None


@dataclass
class HubStub:
    """The server: ``add`` repos, ``start`` (a free port, a daemon thread), ``url``, ``log``, ``stop``."""

    repos: dict[str, StubRepo] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)
    _server: Any = None
    _thread: threading.Thread | None = None

    def add(self, repo_id: str, folder: Path, *, gated: bool = False, ignore_range: bool = False) -> StubRepo:
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = StubRepo(repo_id, Path(folder), sha, gated, ignore_range)
        return self.repos[repo_id]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubStub:
        stub = self

        class Handler(_Handler):
            hub = stub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)  # type: ignore[union-attr]
            self._server = None

    def __enter__(self) -> HubStub:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def sent(self) -> int:
        """The body bytes sent so far, all requests together."""
        return sum(r.sent for r in self.log)

    def requests(self, file_suffix: str = "") -> list[Request]:
        """The logged requests for files ending in ``file_suffix``."""
        return [r for r in self.log if r.file is not None and r.file.endswith(file_suffix)]

    def served(self, file_suffix: str = "") -> list[Request]:
        """The GETs that sent bytes of files ending in ``file_suffix`` (200 or 206: a redirect sends none)."""
        return [r for r in self.requests(file_suffix) if r.method == "GET" and r.status in (200, 206)]


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")
_CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{40})/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
LFS_SIZE = 10 * 2**20


def _etag(repo: StubRepo, file: Path) -> str:
    return hashlib.sha256(f"{repo.sha}/{file.name}/{file.stat().st_size}".encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: the hub's own log is self.hub.log
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    # ------------------------------------------------------------------ answers
    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        entry = Request(self.command, path, self.headers.get("Range"), 0)
        self.hub.log.append(entry)
        cdn = _CDN.match(path)
        if cdn is not None:  # a signed CDN URL: no token needed, the commit in the path
            repo = self.hub.repos.get(cdn.group("repo"))
            entry.file = cdn.group("file")
            file = repo.file(cdn.group("file")) if repo is not None and repo.sha == cdn.group("sha") else None
            if file is None:
                return self._error(entry, 404, "", "Not found")
            return self._file(entry, repo, file, body)
        m = _RESOLVE.match(path)
        info = _INFO.match(path)
        repo = self.hub.repos.get((m or info).group("repo")) if (m or info) else None
        if m is None and info is None:
            return self._error(entry, 404, "", "Not found")
        if repo is None:
            return self._error(entry, 404, "RepoNotFound", "Repository not found")
        if repo.gated:
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            if token != GOOD_TOKEN:
                status = 403 if token == NO_ACCESS_TOKEN else 401
                return self._error(entry, status, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
        rev = (m or info).group("rev")
        if rev not in (None, "main", repo.sha):
            return self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if info is not None:
            return self._json(entry, {
                "_id": repo.sha[:24], "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha,
                "private": False, "gated": "manual" if repo.gated else False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "siblings": [{"rfilename": f} for f in repo.siblings()],
                "lastModified": "2024-01-01T00:00:00.000Z", "createdAt": "2024-01-01T00:00:00.000Z",
            }, body)  # fmt: skip
        file = repo.file(m.group("file"))
        entry.file = m.group("file")
        hostile = repo.hostile.get(m.group("file"))
        if hostile is not None and hostile.location is not None:
            return self._redirect(entry, repo, file, m.group("file"), hostile.location)
        if hostile is not None and hostile.endless is not None:
            return self._endless(entry, repo, hostile.endless, body)
        if file is None:
            return self._error(entry, 404, "EntryNotFound", f"{m.group('file')} does not exist")
        if file.stat().st_size > LFS_SIZE:
            return self._redirect(entry, repo, file, m.group("file"))
        self._file(entry, repo, file, body)

    def _redirect(self, entry: Request, repo: StubRepo, file: Path | None, name: str, to: str | None = None) -> None:
        size = file.stat().st_size if file is not None else 300
        entry.status = 302
        self.send_response(302)
        self.send_header("Location", to or f"{self.hub.url}/cdn/{repo.repo_id}/{repo.sha}/{name}")
        self.send_header("X-Repo-Commit", repo.sha)
        self.send_header("X-Linked-Size", str(size))
        etag = _etag(repo, file) if file is not None else hashlib.sha256(name.encode()).hexdigest()
        self.send_header("X-Linked-Etag", f'"{etag}"')
        self.send_header("ETag", '"pointer"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _endless(self, entry: Request, repo: StubRepo, announced: int, body: bool) -> None:
        """A body that never ends: sent without a length (the connection closes it), until the client hangs up or
        the stub stops; the ``HEAD`` announces ``announced`` bytes (-1: no length)."""
        entry.status = 200
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.sha1(repo.sha.encode()).hexdigest()}"')
        self.send_header("X-Repo-Commit", repo.sha)
        if not body:
            if announced >= 0:
                self.send_header("Content-Length", str(announced))
            self.end_headers()
            return
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = b" " * (1 << 16)
        try:
            while self.hub._server is not None:
                self.wfile.write(chunk)
                entry.sent += len(chunk)
        except OSError:  # the client hung up
            pass

    def _file(self, entry: Request, repo: StubRepo, file: Path, body: bool) -> None:
        size = file.stat().st_size
        hostile = repo.hostile.get(entry.file or "") or Hostile()
        etag = hostile.etag if hostile.etag is not None else _etag(repo, file)
        start, end, status = 0, size - 1, 200
        m = _RANGE.match(entry.range or "") if body else None
        if entry.range and body and not repo.ignore_range:
            if m is None or int(m.group(1)) >= size:
                return self._error(entry, 416, "", "Range not satisfiable")
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            status = 206
        entry.status = status
        self.send_response(status)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", hostile.commit if hostile.commit is not None else repo.sha)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1 if body else size))
        self.end_headers()
        if not body:
            return
        try:
            with open(file, "rb") as f:
                f.seek(start)
                left = end - start + 1
                step = 1 if hostile.trickle else 1 << 16
                while left > 0 and self.hub._server is not None:
                    chunk = f.read(min(left, step))
                    if not chunk:
                        break
                    if hostile.trickle:
                        time.sleep(hostile.trickle)
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    entry.sent += len(chunk)
                    left -= len(chunk)
        except OSError:  # the client read what it wanted and hung up
            self.close_connection = True

    def _json(self, entry: Request, data: dict, body: bool) -> None:
        raw = json.dumps(data).encode()
        entry.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if body:
            self.wfile.write(raw)
            entry.sent = len(raw)

    def _error(self, entry: Request, status: int, code: str, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        entry.status = status
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)
            entry.sent = len(raw)


def point_at(stub: HubStub, monkeypatch: Any, home: Path) -> None:
    """``huggingface_hub`` pointed at ``stub``, with its hub cache in ``home / "hub"`` and a token store of its own.

    ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` into
    ``huggingface_hub.constants`` when it is imported (the URL template too), so an in-process test sets those
    constants (a fresh process reads its environment instead).
    """
    import transformers.dynamic_module_utils as dyn
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", stub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", stub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "FAKEVIZ_HUB_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dyn, "HF_MODULES_CACHE", str(home / "modules"))
    stub.log.clear()
