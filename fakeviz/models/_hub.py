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
    no retries) before ``hf_hub_download`` puts them in the hub cache, and read with a bounded read. Up to 8 threads
    fetch shard headers ahead (at most 8 raw headers in memory); each is parsed in the caller's thread, in order,
    so the limits on tensors and header bytes stop the reading as they stop a local folder's.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import CheckpointError, HubError, UnknownModelError
from .._engine import checkpoint as ck
from ._catalog import suggest

__all__ = ["HubConfig", "fetch_config", "is_hub_id", "read_hub_checkpoint", "remote_code"]

# huggingface_hub's REPO_ID_REGEX with the namespace required: owner/name, each [\w.-]{1,96}, no "--" or "..".
_REPO_ID = re.compile(r"^[\w.-]{1,96}/[\w.-]{1,96}$")
_SINGLE, _INDEX = "model.safetensors", "model.safetensors.index.json"
_WORKERS = 8


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


def _fetch_file(
    repo: str, revision: str | None, file: str, limit: int, weights: bool
) -> tuple[bytes, str | None, Path]:
    """A small file of the repo (``config.json``, the index) through the hub cache: sized with one ``HEAD`` first
    (refused over ``limit`` before any download), then read with a bounded read. Returns its bytes, the commit it
    came from (None when read from the cache without asking the hub), and the cached path.

    Offline (``HF_HUB_OFFLINE``), or when the hub cannot be reached, the cache's copy is read if there is one, as
    ``hf_hub_download`` does; but the first request is made once (``get_hf_file_metadata``, no retries), where
    ``hf_hub_download`` retries a connection error five times with backoff (about 30 s) before it gives up.
    """
    from huggingface_hub import errors as he
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    where = f"{_name(repo, revision)}:{file}"
    try:
        if _offline():
            raise he.OfflineModeIsEnabled(f"HF_HUB_OFFLINE is set: {file} of {repo} is read from the cache only")
        meta = get_hf_file_metadata(hf_hub_url(repo, file, revision=revision))
        if meta.size is not None and meta.size > limit:
            raise CheckpointError(f"{where}: {meta.size:,} bytes, over the {limit // 2**20} MiB fakeviz reads "
                                  "from a config or index: not a model's file")  # fmt: skip
        # at the revision asked, so that the cache records the commit it names (refs/main) for offline use
        path, commit = Path(hf_hub_download(repo, file, revision=revision)), meta.commit_hash
    except CheckpointError:
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
    from huggingface_hub import errors as he
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    def exists(name: str) -> bool:
        try:
            get_hf_file_metadata(hf_hub_url(repo, name, revision=rev))
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
    try:
        with get_session().stream("GET", url, headers=want, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
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
                if len(buf) >= skip + count:
                    break
    except (CheckpointError, HubError, UnknownModelError):
        raise
    except _hub_errors() as e:
        raise _explain(e, repo, asked, file, weights=True) from e
    return bytes(buf[skip : skip + count]), size


def _http_error(status: int, headers: Any, repo: str, asked: str | None, file: str) -> Exception:
    """The error of a failed range request, from its status and the hub's ``X-Error-Code`` (the body unread)."""
    code = headers.get("X-Error-Code", "")
    if code == "GatedRepo" or status in (401, 403):
        return _gated(repo, asked, file, status)
    return CheckpointError(f"{_name(repo, asked)}:{file}: HTTP {status} ({code or 'no error code'}) for a range of "
                           "its header")  # fmt: skip
