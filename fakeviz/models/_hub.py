"""Models by hub id (``owner/name``): ``config.json`` and safetensors headers through ``huggingface_hub``.

``build(id)`` fetches ``config.json`` with ``hf_hub_download`` (the hub cache, ``HF_TOKEN``, ``HF_HUB_OFFLINE``,
``HF_ENDPOINT``, all as ``huggingface_hub`` reads them); ``from_pretrained(id)`` also reads each safetensors
file's header with two HTTP range requests and never a weight byte (Note: [hub headers by range]).

Note: [hub headers by range]
    ``huggingface_hub.get_safetensors_metadata`` reads a header the same way (a range request on the file's
    ``resolve`` URL, which the hub redirects to its CDN), but it asks for the first 100 kB whatever the header's
    length, accepts headers up to 25 MB, reads the index with an unbounded ``json.load`` and checks no byte range
    against the file's size. Here each file costs ``bytes=0-7`` (the header length, and the file's size from
    ``Content-Range``), checked against :data:`~fakeviz._engine.checkpoint.MAX_HEADER_BYTES` before the header is
    asked for, then ``bytes=8-(7+n)``: the bytes received are the headers, and the same parser and limits as a
    local folder's check them (:func:`~fakeviz._engine.checkpoint.parse_safetensors_header`, ``gather``). A
    response is read as a stream and cut at the bytes asked for, so a server that ignores ``Range`` and sends the
    whole file costs no more. The index and ``config.json`` are sized with one ``HEAD`` (``get_hf_file_metadata``,
    no retries), then fetched with one bounded ``GET`` and put in the hub cache (Note: [a hub is a stranger]). Up
    to 8 threads fetch shard headers ahead (at most 8 raw headers in memory); each is parsed in the caller's
    thread, in order, so the limits on tensors and header bytes stop the reading as they stop a local folder's.

Note: [a hub is a stranger]
    ``HF_ENDPOINT`` may name a mirror nobody vetted, so what a server sends is data, never a path or a promise.
    ``hf_hub_download`` names cache files by the server's ETag and ``X-Repo-Commit`` and by ``revision`` unchecked
    (an ETag ``"../../../../tmp/evil.pth"`` wrote that file outside ``HF_HOME``), and reads a body to its end
    however long it runs or however slowly (a config.json announced as 300 bytes wrote 1 GiB). So fakeviz does
    not call it: ``revision`` is checked first (:func:`check_revision`, git's rules for a ref name); the ``HEAD``'s
    ETag must be 40 or 64 hex digits, its commit 40, its location an http(s) URL; the ``GET`` is read as a stream
    and cut past the size the ``HEAD`` announced or :data:`~fakeviz._engine.checkpoint.MAX_INDEX_BYTES`; and the
    bytes are written into the hub cache, laid out as ``hf_hub_download`` lays it out (``blobs/<etag>``,
    ``snapshots/<commit>/<file>``, ``refs/<revision>``), only when whole, each under a temporary name renamed into
    place, so offline use reads them as it reads ``hf_hub_download``'s. Every request (the ``HEAD``, the ``GET``,
    each header range) has a deadline of :data:`DEADLINE_S` (``FAKEVIZ_HUB_DEADLINE``) from its start, checked
    after each chunk, with each read's timeout cut to what is left: a trickle ends within the deadline plus one
    read. An index naming more than :data:`MAX_SHARDS` files is refused before any header is asked for, and its
    file names are checked as text (:func:`~fakeviz._engine.checkpoint.index_shards`); they only ever name URLs.
    Not covered: a ``HEAD`` whose headers themselves trickle (httpx times each read, and h11 caps headers at
    16 KiB), and ``trust_remote_code=True``, where transformers downloads the repo's code with ``hf_hub_download``
    (the repo's code then runs anyway).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import CheckpointError, HubError, UnknownModelError
from .._engine import checkpoint as ck
from ._catalog import suggest

__all__ = ["DEADLINE_S", "MAX_SHARDS", "HubConfig", "check_revision", "fetch_config", "is_hub_id",
           "read_hub_checkpoint", "remote_code"]

# huggingface_hub's REPO_ID_REGEX with the namespace required: owner/name, each [\w.-]{1,96}, no "--" or "..".
_REPO_ID = re.compile(r"^[\w.-]{1,96}/[\w.-]{1,96}$", re.ASCII)  # as the hub's: full-width letters are no id
_SINGLE, _INDEX = "model.safetensors", "model.safetensors.index.json"
_WORKERS = 8
#: The seconds one request to the hub may take, from its first byte asked to its last byte read (not per read):
#: ``FAKEVIZ_HUB_DEADLINE`` sets it (Note: [a hub is a stranger]).
DEADLINE_S = 60.0
#: The most safetensors files an index may name: each costs two requests (the largest published checkpoints,
#: such as DeepSeek-V3 and Llama-3.1-405B, have under 200).
MAX_SHARDS = 10_000
# What the hub sends as names (Note: [a hub is a stranger]): a file's ETag is its git blob sha1 (40 hex digits)
# or, for an LFS file, its sha256 (64); a commit is a git sha1. hf_hub_download writes blobs/<etag> and
# snapshots/<commit>/, so anything else could name a path outside the cache.
_ETAG = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# git check-ref-format's rules for a branch or tag name: no control characters, space, ~ ^ : ? * [ \ or "..",
# no "@{", no component that starts with "." or ends with ".lock", no empty component.
_REF_BAD = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{")


def is_hub_id(name: Any) -> bool:
    """``name`` is written as a hub repo id, ``owner/name`` (not a path: no leading ``.``/``/``/``~``, one ``/``)."""
    return (
        isinstance(name, str) and bool(_REPO_ID.match(name)) and ".." not in name and "--" not in name
        and not name.startswith((".", "-")) and not name.endswith((".", "-"))
    )  # fmt: skip


@dataclass(frozen=True)
class HubConfig:
    """A repo's ``config.json`` as fetched: the id, the revision asked for, the commit it resolved to (None
    offline from the cache), the values, and the cached file."""

    repo: str
    revision: str | None
    commit: str | None
    raw: dict[str, Any]
    path: Path

    @property
    def pinned(self) -> str | None:
        """The revision later requests use: the commit when known, so that every file comes from one commit."""
        return self.commit or self.revision


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _name(repo: str, revision: str | None) -> str:
    return repo if revision in (None, "main") else f"{repo}@{revision}"


_LOCAL = ("Or pass a local folder instead: download it once (`hf download {repo}{files}`) and give "
          "fakeviz.models.{fn}('/path/to/folder').")  # fmt: skip


def _local(repo: str, weights: bool) -> str:
    files = "" if weights else " config.json"
    return _LOCAL.format(repo=repo, files=files, fn="from_pretrained" if weights else "build")


def _explain(exc: BaseException, repo: str, revision: str | None, file: str, weights: bool = False) -> Exception:
    """One short fakeviz error for a ``huggingface_hub`` error reading ``file`` of ``repo`` (chained by the caller)."""
    from huggingface_hub import constants
    from huggingface_hub import errors as he

    name, endpoint = _name(repo, revision), _endpoint()
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, he.GatedRepoError) or (isinstance(exc, he.HfHubHTTPError) and status in (401, 403)
                                              and not isinstance(exc, he.RepositoryNotFoundError)):  # fmt: skip
        return _gated(repo, revision, file, status)
    if isinstance(exc, he.RepositoryNotFoundError):
        near = suggest(repo)
        hint = f"Did you mean {' or '.join(repr(n) for n in near)} (in fakeviz's catalog)?\n" if near else ""
        return UnknownModelError(
            f"unknown model {repo!r}: not in fakeviz's catalog, not a local folder, and unknown on the hub at "
            f"{endpoint} (or private: then set HF_TOKEN)\n{hint}See fakeviz.models.catalog() for the names, or pass "
            "a folder / config.json / transformers config.",
            name=repo, suggestions=near,
        )  # fmt: skip
    if isinstance(exc, he.RevisionNotFoundError):
        return HubError(f"{repo}: the hub at {endpoint} has no revision {revision!r}\nGive a branch, tag or commit "
                        f"of {repo} as revision=, or leave it out for 'main'.", repo=repo, endpoint=endpoint)  # fmt: skip
    if isinstance(exc, he.RemoteEntryNotFoundError):
        return CheckpointError(f"{name}: the repo has no {file}\n" + (
            "from_pretrained reads config.json and safetensors headers; " if weights else
            "fakeviz builds a model from its config.json; ") + _local(repo, weights))  # fmt: skip
    offline = _offline() or isinstance(exc, he.OfflineModeIsEnabled)
    if offline:
        tried = f"HF_HUB_OFFLINE is set and {file} of {name} is not in the hub cache ({constants.HF_HUB_CACHE})"
        fix = f"Unset HF_HUB_OFFLINE to fetch it from {endpoint}."
    else:
        what = f"answered HTTP {status}" if status else "could not be reached"  # a server error; no answer
        tried = (f"{endpoint} {what} for {file} of {name} ({_cause(exc)}), and it is not in the hub cache "
                 f"({constants.HF_HUB_CACHE})")  # fmt: skip
        fix = "Check the network and HF_ENDPOINT."
    return HubError(f"{name}: {tried}\n{fix} {_local(repo, weights)}", repo=repo, endpoint=endpoint,
                    offline=offline)  # fmt: skip


def _gated(repo: str, revision: str | None, file: str, status: int | None) -> HubError:
    endpoint = _endpoint()
    why = "your token has no access" if status == 403 else "no token was sent, or it has no access"
    return HubError(
        f"{_name(repo, revision)}: the hub at {endpoint} refuses {file} (HTTP {status or 401}: a gated repo, {why})\n"
        f"Accept the license on {endpoint}/{repo}, then set HF_TOKEN to a token of that account "
        "(or run `hf auth login`).",
        repo=repo, endpoint=endpoint,
    )  # fmt: skip


def _cause(exc: BaseException) -> str:
    """The innermost cause of a connection failure, in a few words (``ConnectError: [Errno 111] ...``)."""
    seen = exc
    while True:
        inner = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
        if inner is None or isinstance(inner, (UnknownModelError, CheckpointError)):
            break
        seen = inner
    text = str(seen).splitlines()[0][:120] if str(seen) else ""
    return f"{type(seen).__name__}: {text}" if text else type(seen).__name__


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What ``huggingface_hub`` raises for a failed request (its HTTP errors, offline, a connection failure)."""
    import httpx2
    from huggingface_hub import errors as he

    return (he.HfHubHTTPError, he.OfflineModeIsEnabled, he.LocalEntryNotFoundError, he.EntryNotFoundError,
            he.FileMetadataError, httpx2.HTTPError, ConnectionError, TimeoutError)  # fmt: skip


def check_revision(repo: str, revision: Any) -> None:
    """Refuse a ``revision`` that is not a branch, tag or commit name (git's rules for a ref name), before any
    request: ``huggingface_hub`` quotes it in URLs but writes ``refs/<revision>`` in the hub cache unchecked.

    Raises:
        HubError: ``revision`` is not a string, or not a name git would give a branch or tag.
    """
    if revision is None:
        return
    why = None
    if not isinstance(revision, str):
        why = f"a {type(revision).__name__}, not a branch, tag or commit name"
    elif not revision or len(revision) > 255:
        why = "not 1 to 255 characters long"
    elif _REF_BAD.search(revision) or not revision.isprintable():
        why = "holds '..', '@{', a space, a control character or one of ~ ^ : ? * [ \\, which no git ref has"
    elif any(not part or part.startswith(".") or part.endswith((".lock", ".")) for part in revision.split("/")):
        why = "has an empty part, or a part that starts with '.' or ends with '.' or '.lock', which no git ref has"
    if why is not None:
        shown = repr(revision) if isinstance(revision, str) else type(revision).__name__
        raise HubError(f"revision={shown[:120]}: {why}\nGive a branch, tag or commit of {repo} as revision=, or "
                       "leave it out for 'main'.", repo=repo, endpoint=_endpoint())  # fmt: skip


def deadline_s() -> float:
    """The seconds one hub request may take (``FAKEVIZ_HUB_DEADLINE``, read at each request; else
    :data:`DEADLINE_S`).

    Raises:
        HubError: ``FAKEVIZ_HUB_DEADLINE`` is not a number of seconds in (0, 86400].
    """
    text = os.environ.get("FAKEVIZ_HUB_DEADLINE", "").strip()
    if not text:
        return DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86400:
        raise HubError(f"FAKEVIZ_HUB_DEADLINE={text[:40]!r}: not a number of seconds from 0 to 86400\nSet it to "
                       f"the seconds one request to the hub may take (default {DEADLINE_S:g}), or unset it.")  # fmt: skip
    return value


class _Deadline:
    """One request's deadline: :meth:`timeout` is the timeout of each read (the hub's own, within what is left),
    :meth:`check` raises a :class:`HubError` once it has passed (Note: [a hub is a stranger])."""

    def __init__(self, repo: str, asked: str | None, file: str) -> None:
        self.seconds = deadline_s()
        self.end = time.monotonic() + self.seconds
        self.repo, self.asked, self.file = repo, asked, file

    def timeout(self, per_read: float | None) -> float:
        left = max(self.end - time.monotonic(), 0.01)
        return min(per_read, left) if per_read else left

    def check(self, got: int) -> None:
        if time.monotonic() > self.end:
            raise HubError(
                f"{_name(self.repo, self.asked)}:{self.file}: {_endpoint()} took more than {self.seconds:g} s to "
                f"send it ({got:,} bytes by then): refused\nCheck the network and HF_ENDPOINT; a slow mirror can be "
                "given longer with FAKEVIZ_HUB_DEADLINE=<seconds>.",
                repo=self.repo, endpoint=_endpoint(),
            )  # fmt: skip


def _check_meta(meta: Any, repo: str, asked: str | None, file: str) -> None:
    """Refuse a ``HEAD`` answer whose names would become paths (ETag, commit) or whose file is elsewhere than an
    http(s) URL, before ``huggingface_hub`` or fakeviz writes anything (Note: [a hub is a stranger])."""
    from urllib.parse import urlsplit

    problem = None
    if not isinstance(meta.etag, str) or not _ETAG.match(meta.etag):
        problem = f"an ETag {_shown(meta.etag)}, not a file hash (40 or 64 hex digits)"
    elif not isinstance(meta.commit_hash, str) or not _COMMIT.match(meta.commit_hash):
        problem = f"a commit {_shown(meta.commit_hash)} (X-Repo-Commit), not 40 hex digits"
    else:
        where = urlsplit(str(meta.location))
        if where.scheme not in ("http", "https") or not where.netloc:
            problem = f"a redirect to {_shown(meta.location)}, not an http(s) URL"
    if problem is not None:
        raise HubError(
            f"{_name(repo, asked)}:{file}: {_endpoint()} answered with {problem}: refused, as the hub cache would "
            "name a file by it\nCheck HF_ENDPOINT: the hub sends hashes; a mirror that does not is not one to trust.",
            repo=repo, endpoint=_endpoint(),
        )  # fmt: skip


def _shown(value: Any) -> str:
    return repr(value)[:80] if value is not None else "missing"


def _fetch_file(
    repo: str, revision: str | None, file: str, limit: int, weights: bool
) -> tuple[bytes, str | None, Path]:
    """A small file of the repo (``config.json``, the index) through the hub cache: one ``HEAD`` first (its
    names checked, its size refused over ``limit``), then, unless the cache holds that commit's copy, one
    ``GET`` read as a stream within ``limit`` bytes, the size the ``HEAD`` announced and the deadline, written
    into the hub cache only once whole (Note: [a hub is a stranger]). Returns its bytes, the commit it came from
    (None when read from the cache without asking the hub), and the cached path.

    Offline (``HF_HUB_OFFLINE``), or when the hub cannot be reached, the cache's copy is read if there is one, as
    ``hf_hub_download`` does; but the first request is made once (``get_hf_file_metadata``, no retries), where
    ``hf_hub_download`` retries a connection error five times with backoff (about 30 s) before it gives up.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub import errors as he

    check_revision(repo, revision)
    where = f"{_name(repo, revision)}:{file}"
    try:
        if _offline():
            raise he.OfflineModeIsEnabled(f"HF_HUB_OFFLINE is set: {file} of {repo} is read from the cache only")
        clock = _Deadline(repo, revision, file)
        meta = get_hf_file_metadata(hf_hub_url(repo, file, revision=revision),
                                    timeout=clock.timeout(constants.HF_HUB_ETAG_TIMEOUT))  # fmt: skip
        clock.check(0)
        _check_meta(meta, repo, revision, file)
        if meta.size is not None and meta.size > limit:
            raise CheckpointError(f"{where}: {meta.size:,} bytes, over the {limit // 2**20} MiB fakeviz reads "
                                  "from a config or index: not a model's file")  # fmt: skip
        commit = meta.commit_hash
        path = _snapshot(repo, commit, file)
        if path.is_file():  # this commit's copy: no download (as hf_hub_download)
            _store_ref(repo, revision, commit)
        else:
            data = _get(hf_hub_url(repo, file, revision=commit), limit, meta.size, clock, repo, revision, file)
            path = _store(repo, revision, commit, meta.etag, file, data)
            return data, commit, path
    except (CheckpointError, HubError):
        raise
    except _hub_errors() as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        refused = isinstance(e, he.HfHubHTTPError) and status is not None and status < 500  # the hub's answer
        cached = None if refused else _cached(repo, revision, file)
        if cached is None:
            raise _explain(e, repo, revision, file, weights) from e
        path, commit = cached, None
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"{where}: the cached copy {path} is not readable ({e.strerror or e})") from e
    if len(data) > limit:
        raise CheckpointError(f"{where}: over the {limit // 2**20} MiB fakeviz reads from a config or index")
    return data, commit, path


def _get(url: str, limit: int, size: int | None, clock: _Deadline, repo: str, asked: str | None, file: str) -> bytes:
    """The body at ``url`` (the file at the commit the ``HEAD`` named: the bytes are that commit's, and the token
    does not follow a redirect off the hub), read as a stream and cut past ``limit`` bytes or past the ``size``
    the ``HEAD`` announced, within the request's deadline; nothing is written here."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session

    where = f"{_name(repo, asked)}:{file}"
    cap = limit if size is None else min(limit, size)
    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
    buf = bytearray()
    with get_session().stream("GET", url, headers=headers,
                              timeout=clock.timeout(constants.HF_HUB_DOWNLOAD_TIMEOUT)) as r:  # fmt: skip
        if r.status_code >= 400:
            raise _http_error(r.status_code, r.headers, repo, asked, file, "a GET of the file")
        for chunk in r.iter_bytes():
            buf += chunk
            clock.check(len(buf))
            if len(buf) > cap:
                break
    if len(buf) > limit:
        raise CheckpointError(f"{where}: more than the {limit // 2**20} MiB fakeviz reads from a config or index "
                              "(the server's HEAD gave no size): not a model's file")  # fmt: skip
    if size is not None and len(buf) != size:
        raise CheckpointError(f"{where}: the server sent {'more' if len(buf) > size else 'fewer'} bytes than the "
                              f"{size:,} its HEAD announced ({len(buf):,}{'+' if len(buf) > size else ''}): refused, "
                              "nothing cached")  # fmt: skip
    return bytes(buf)


def _storage(repo: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def _snapshot(repo: str, commit: str, file: str) -> Path:
    return _storage(repo) / "snapshots" / commit / file


def _store(repo: str, revision: str | None, commit: str, etag: str, file: str, data: bytes) -> Path:
    """``data`` written into the hub cache as ``hf_hub_download`` lays it out (``blobs/<etag>``,
    ``snapshots/<commit>/<file>`` linking to it, ``refs/<revision>``), each file written whole under a name of
    its own and renamed into place; the names are checked hashes and a checked revision."""
    blob = _storage(repo) / "blobs" / etag
    if not blob.is_file():
        _atomic(blob, lambda tmp: tmp.write_bytes(data))
    pointer = _snapshot(repo, commit, file)

    def link(tmp: Path) -> None:
        try:
            tmp.symlink_to(os.path.relpath(blob, pointer.parent))
        except OSError:  # no symlinks here (as huggingface_hub does then: a copy)
            tmp.write_bytes(data)

    _atomic(pointer, link)
    _store_ref(repo, revision, commit)
    return pointer


def _store_ref(repo: str, revision: str | None, commit: str) -> None:
    """``refs/<revision>`` -> ``commit``, so that the cache answers for the revision offline."""
    rev = revision or "main"
    if rev == commit:
        return
    ref = _storage(repo) / "refs" / rev
    try:
        if ref.is_file() and ref.read_text() == commit:
            return
        _atomic(ref, lambda tmp: tmp.write_text(commit))
    except OSError:  # a read-only cache: the file was read; offline use then needs the commit
        pass


def _atomic(target: Path, write: Any) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.incomplete")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()


def _cached(repo: str, revision: str | None, file: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, revision=revision)
    return Path(found) if isinstance(found, str) else None


def fetch_config(repo: str, revision: str | None = None) -> HubConfig:
    """The ``config.json`` of a hub repo, through the hub cache (bounded: a config over
    :data:`~fakeviz._engine.checkpoint.MAX_INDEX_BYTES` is refused).

    Raises:
        UnknownModelError: the hub has no such repo (near catalog names suggested).
        HubError: offline and not cached, the endpoint unreachable, a gated repo without access, no such revision.
        CheckpointError: no ``config.json`` in the repo, or one that is not a JSON object.
    """
    data, commit, path = _fetch_file(repo, revision, "config.json", ck.MAX_INDEX_BYTES, weights=False)
    where = f"{_name(repo, revision)}:config.json"
    try:
        raw = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{where}: not readable as JSON ({str(e)[:200]})") from e
    except RecursionError:  # brackets nested thousands deep: no config is
        raise CheckpointError(f"{where}: JSON nested too deep to be a model config") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: not a config (a JSON object)")
    return HubConfig(repo, revision, commit, raw, path)


def remote_code(hub: HubConfig, trust_remote_code: bool) -> tuple[Any, type] | None:
    """The config and model class of a repo whose ``config.json`` needs its own code (``auto_map``), as
    transformers loads them with ``trust_remote_code=True``; None when transformers' own classes serve.

    Raises:
        HubError: the config needs the repo's code and ``trust_remote_code`` is False.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    auto_map = hub.raw.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        return None
    model_type = hub.raw.get("model_type")
    known = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    if not trust_remote_code:
        if known:  # transformers, too, uses its own classes then
            return None
        shown = ", ".join(f"{k} -> {v}" for k, v in list(auto_map.items())[:3])[:240]  # the repo's text: bounded
        raise HubError(
            f"{_name(hub.repo, hub.revision)}: its config.json needs the repo's own Python code (auto_map: {shown}), "
            "which fakeviz runs only when asked\nPass trust_remote_code=True if you trust this repo (its code then "
            "runs on this machine, as in transformers).",
            repo=hub.repo, endpoint=_endpoint(),
        )  # fmt: skip
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    try:
        cfg = transformers.AutoConfig.from_pretrained(hub.repo, revision=hub.pinned, trust_remote_code=True)
        arch = (hub.raw.get("architectures") or [None])[0]
        refs = {k: v for k, v in auto_map.items() if k.startswith("AutoModel")}
        ref = next((v for v in refs.values() if isinstance(v, str) and v.rsplit(".", 1)[-1] == arch), None)
        ref = ref or refs.get("AutoModelForCausalLM") or refs.get("AutoModel")
        if not isinstance(ref, str):
            raise HubError(f"{hub.repo}: auto_map names no model class (AutoModel...) to build",
                           repo=hub.repo, endpoint=_endpoint())  # fmt: skip
        cls = get_class_from_dynamic_module(ref, hub.repo, revision=hub.pinned)
    except (*_hub_errors(), OSError) as e:  # transformers words the hub's errors as OSError
        raise _explain(e, hub.repo, hub.revision, "the repo's code") from e
    return cfg, cls


def read_hub_checkpoint(hub: HubConfig) -> ck.Checkpoint:
    """The tensors of a hub repo's safetensors weights (``model.safetensors`` or a sharded index), from their
    headers only (Note: [hub headers by range]); offline, the hub cache's copy of the weights, if complete.

    Raises:
        HubError: offline without the weights cached, the endpoint unreachable, a gated repo without access.
        CheckpointError: no safetensors weights in the repo, or a malformed, oversized or truncated header.
    """
    repo, rev = hub.repo, hub.pinned
    if _offline():
        for name in (_INDEX, _SINGLE):
            found = _cached(repo, rev, name)
            if found is not None:
                return ck.read_checkpoint(found)
        raise HubError(
            f"{_name(repo, hub.revision)}: HF_HUB_OFFLINE is set and its safetensors weights are not in the hub cache, "
            "so their headers cannot be read\nUnset HF_HUB_OFFLINE (fakeviz then reads only the headers), or use "
            f"fakeviz.models.build({repo!r}) for the config alone. {_local(repo, True)}",
            repo=repo, endpoint=_endpoint(), offline=True,
        )  # fmt: skip
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub import errors as he

    check_revision(repo, rev)

    def exists(name: str) -> bool:
        try:
            get_hf_file_metadata(hf_hub_url(repo, name, revision=rev), timeout=_Deadline(repo, rev, name).timeout(
                constants.HF_HUB_ETAG_TIMEOUT))  # fmt: skip
        except he.RemoteEntryNotFoundError:
            return False
        except _hub_errors() as e:
            raise _explain(e, repo, hub.revision, name, weights=True) from e
        return True

    if exists(_SINGLE):  # as transformers and get_safetensors_metadata look: one file first, then the index
        files, weight_map, where = [_SINGLE], None, f"{_name(repo, hub.revision)}:{_SINGLE}"
    elif exists(_INDEX):
        data, _, _ = _fetch_file(repo, rev, _INDEX, ck.MAX_INDEX_BYTES, weights=True)
        where = f"{_name(repo, hub.revision)}:{_INDEX}"
        weight_map = ck.parse_index(data, where)
        files = ck.index_shards(weight_map, where)
        if len(files) > MAX_SHARDS:  # before any header is asked for: each costs two requests
            raise CheckpointError(
                f"{where}: names {len(files):,} safetensors files, more than the {MAX_SHARDS:,} fakeviz reads "
                "headers of (two requests each; the largest published checkpoints have under 200)\nNot a model's "
                "index: check the repo and HF_ENDPOINT."
            )  # fmt: skip
    else:
        raise CheckpointError(
            f"{_name(repo, hub.revision)}: no {_SINGLE} or {_INDEX} in the repo, so no safetensors headers to read "
            f"(fakeviz does not download weights)\nfakeviz.models.build({repo!r}) builds from config.json alone. "
            + _local(repo, True)
        )  # fmt: skip
    tensors, nbytes = ck.gather(where, _headers(repo, rev, hub.revision, files), weight_map)
    return ck.Checkpoint(tensors, [Path(f) for f in files], "safetensors", nbytes)


def _headers(repo: str, rev: str | None, asked: str | None, files: list[str]) -> Iterator[tuple[dict, int]]:
    """``(tensors, header bytes)`` of each file, in order. Up to 8 threads fetch headers ahead (at most 8 raw
    headers in memory, each within ``MAX_HEADER_BYTES``); each is parsed here, one at a time, as a local folder's
    are, so that :func:`~fakeviz._engine.checkpoint.gather` stops at a limit before more is parsed or fetched."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()  # HF_TOKEN / the saved token, and huggingface_hub's user agent

    def fetch(file: str) -> tuple[bytes, int]:
        return _fetch_header(hf_hub_url(repo, file, revision=rev), headers, repo, asked, file)

    pool = ThreadPoolExecutor(max_workers=min(_WORKERS, len(files)), thread_name_prefix="fakeviz-hub")
    ahead: deque[Future[tuple[bytes, int]]] = deque()
    todo = iter(files)
    try:
        for file in files:
            while len(ahead) < _WORKERS and (nxt := next(todo, None)) is not None:
                ahead.append(pool.submit(fetch, nxt))
            raw, size = ahead.popleft().result()
            found, _, nbytes = ck.parse_safetensors_header(raw, size, f"{_name(repo, asked)}:{file}", Path(file).name)
            yield found, nbytes
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fetch_header(url: str, headers: dict[str, str], repo: str, asked: str | None, file: str) -> tuple[bytes, int]:
    """A safetensors file's header (the bytes after its 8-byte length) and the file's size, by two range requests:
    the length is checked (:func:`~fakeviz._engine.checkpoint.safetensors_header_length`) before the header is
    asked for."""
    where = f"{_name(repo, asked)}:{file}"
    first, size = _range(url, headers, 0, 8, repo, asked, file)
    n = ck.safetensors_header_length(first, size, where)
    raw, again = _range(url, headers, 8, n, repo, asked, file) if n else (b"", size)
    if again != size:
        raise CheckpointError(f"{where}: the file changed size between two requests ({size:,}, then {again:,} bytes)")
    if len(raw) != n:
        raise CheckpointError(f"{where}: the response ended inside the {n:,}-byte header: truncated")
    return raw, size


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


def _range(url: str, headers: dict[str, str], start: int, count: int, repo: str, asked: str | None,
           file: str) -> tuple[bytes, int]:  # fmt: skip
    """``count`` bytes of the file at ``url`` from ``start`` (one range request, read as a stream and cut there),
    and the file's size (from ``Content-Range``; from ``Content-Length`` when the server ignores ``Range``)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    where = f"{_name(repo, asked)}:{file}"
    want = {**headers, "Range": f"bytes={start}-{start + count - 1}", "Accept-Encoding": "identity"}
    clock = _Deadline(repo, asked, file)
    try:
        with get_session().stream("GET", url, headers=want,
                                  timeout=clock.timeout(constants.HF_HUB_DOWNLOAD_TIMEOUT)) as r:  # fmt: skip
            if r.status_code >= 400:
                raise _http_error(r.status_code, r.headers, repo, asked, file)
            whole = r.status_code == 200  # Range ignored: the file from byte 0
            skip = start if whole else 0
            if whole:
                size = int(r.headers.get("Content-Length") or -1)
            else:
                m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
                if r.status_code != 206 or m is None or int(m.group(1)) != start:
                    raise CheckpointError(f"{where}: the server answered a range request with HTTP {r.status_code} "
                                          f"and Content-Range {r.headers.get('Content-Range')!r}")  # fmt: skip
                size = int(m.group(3))
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                clock.check(len(buf))
                if len(buf) >= skip + count:
                    break
    except (CheckpointError, HubError, UnknownModelError):
        raise
    except _hub_errors() as e:
        raise _explain(e, repo, asked, file, weights=True) from e
    return bytes(buf[skip : skip + count]), size


def _http_error(status: int, headers: Any, repo: str, asked: str | None, file: str,
                what: str = "a range of its header") -> Exception:  # fmt: skip
    """The error of a failed GET, from its status and the hub's ``X-Error-Code`` (the body unread)."""
    code = headers.get("X-Error-Code", "")
    if code == "GatedRepo" or status in (401, 403):
        return _gated(repo, asked, file, status)
    return CheckpointError(f"{_name(repo, asked)}:{file}: HTTP {status} ({code or 'no error code'}) for {what}")
