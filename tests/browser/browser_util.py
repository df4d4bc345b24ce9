"""Helpers for the real-browser tests and the explorer benchmark: Chromium via Playwright, JupyterLab.

The browser is Debian's ``chromium`` (``apt-get install chromium``; ``scripts/setup.sh``
installs it when it can), driven by the ``playwright`` Python package. Playwright never
downloads a browser of its own here: set ``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1`` when
installing it, and :func:`launch` always passes ``executable_path``.

Everything talks only to files, ``blob:``/``data:`` URLs and a JupyterLab server on
127.0.0.1 that :class:`JupyterServer` starts with a token, in a temporary root folder,
with its news, update checks and announcements off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def built_bundle() -> Path | None:
    """The explorer's ES module, rebuilt from js/ when npm is here and a source changed (``npm ci`` first if its
    tools are missing; ``tests/js_bundle.py``: one build per run, under a lock); None when npm is not installed and
    it was never built (the caller skips)."""
    from js_bundle import ensure_bundle  # tests/ is on sys.path (tests/conftest.py, benchmarks/explorer.py)

    return ensure_bundle()


def chromium_path() -> str | None:
    """Debian's Chromium, or None; ``FAKEVIZ_CHROMIUM`` names another binary (and only that one)."""
    override = os.environ.get("FAKEVIZ_CHROMIUM")
    for cand in (override,) if override else ("/usr/bin/chromium", shutil.which("chromium")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if chromium_path() is None:
        where = os.environ.get("FAKEVIZ_CHROMIUM") or "/usr/bin/chromium"
        return (
            f"Chromium is not installed ({where}): run `apt-get install -y chromium` as root, "
            "or `bash scripts/setup.sh` as root, which installs it"
        )
    if importlib.util.find_spec("playwright") is None:
        return "the Python package playwright is not installed: pip install -e '.[test]'"
    return None


def jupyter_missing() -> str | None:
    """Why the JupyterLab tests cannot run here (None when they can)."""
    missing = [m for m in ("jupyterlab", "notebook", "ipykernel", "anywidget") if importlib.util.find_spec(m) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (pip install -e '.[test]')"
    return None


def launch(playwright: Any) -> Any:
    """Chromium, headless, with no network of its own (no sync, updates, QUIC or first-run pings)."""
    path = chromium_path()
    if path is None:
        raise RuntimeError(browser_missing())
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)


def local_only(page_or_context: Any, allowed_origin: str | None = None) -> list[str]:
    """Abort every request that is not a file:, blob: or data: URL (or to ``allowed_origin``).

    Returns the list the blocked URLs are appended to.
    """
    blocked: list[str] = []

    def handle(route: Any) -> None:
        url = route.request.url
        if url.startswith(("file:", "blob:", "data:")) or (allowed_origin and url.startswith(allowed_origin)):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    page_or_context.route("**/*", handle)
    return blocked


class PageProblems:
    """Collects console errors, uncaught page errors and dialogs of a page.

    ``ignore`` holds ``(message, where)`` pairs for errors that are not the explorer's and
    are known to be harmless: a console error or page error is ignored when its text
    contains ``message`` and its source URL or stack contains ``where`` (each pair with
    its reason next to it where it is passed). Ignored ones are kept in ``ignored``.
    """

    def __init__(self, page: Any, ignore: tuple[tuple[str, str], ...] = ()) -> None:
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.dialogs: list[str] = []
        self.ignored: list[str] = []
        self._ignore = ignore
        page.on("console", self._console)
        page.on("pageerror", self._page_error)
        page.on("dialog", self._dialog)

    def _skip(self, text: str, where: str) -> bool:
        if any(msg in text and loc in where for msg, loc in self._ignore):
            self.ignored.append(f"{text} {where}".strip())
            return True
        return False

    def _page_error(self, exc: Any) -> None:
        text = getattr(exc, "message", None) or str(exc)
        stack = getattr(exc, "stack", None) or ""
        if not self._skip(text, stack):
            self.page_errors.append(f"{text}\n{stack}".strip())

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        text = msg.text
        loc = msg.location or {}
        where = f" ({loc.get('url', '')}:{loc.get('lineNumber', '')})" if loc.get("url") else ""
        if not self._skip(text, where):
            self.console_errors.append(text + where)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        with contextlib.suppress(Exception):
            dialog.dismiss()

    def check(self) -> None:
        if self.ignored:  # shown by pytest when the test fails anyway
            print("ignored as known and not the explorer's:\n" + "\n".join(self.ignored))
        problems = [f"console error: {e}" for e in self.console_errors]
        problems += [f"page error: {e}" for e in self.page_errors]
        problems += [f"dialog: {d}" for d in self.dialogs]
        assert not problems, "the page reported problems:\n" + "\n".join(problems)


# ------------------------------------------------------------------------ JupyterLab
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """``jupyter lab`` on 127.0.0.1 with a token in ``root``; a context manager that always stops it.

    Settings, workspaces and config live under ``root/.jupyter-*`` (nothing of the user's
    is read or written); notebooks render every cell (``windowingMode: none``), and
    JupyterLab's news, update check and announcements are off, so it makes no request
    beyond this machine.
    """

    def __init__(self, root: Path, *, timeout: float = 90.0) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.log_path = self.root / ".jupyter-server.log"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.origin}/{path.lstrip('/')}{sep}token={self.token}"

    def _env(self) -> dict[str, str]:
        cfg = self.root / ".jupyter-config"
        settings = self.root / ".jupyter-settings"
        (cfg / "labconfig").mkdir(parents=True, exist_ok=True)
        (cfg / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
        )
        tracker = settings / "@jupyterlab" / "notebook-extension"
        tracker.mkdir(parents=True, exist_ok=True)
        (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        # no news feed, no update check, no PyPI extension manager: nothing leaves this machine
        (cfg / "jupyter_server_config.json").write_text(
            json.dumps(
                {
                    "LabApp": {
                        "news_url": None,
                        "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                        "extension_manager": "readonly",
                    }
                }
            )
        )
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(cfg),
            JUPYTERLAB_SETTINGS_DIR=str(settings),
            JUPYTERLAB_WORKSPACES_DIR=str(self.root / ".jupyter-workspaces"),
            JUPYTER_RUNTIME_DIR=str(self.root / ".jupyter-runtime"),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        )
        return env

    def start(self) -> JupyterServer:
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.open_browser=False",
            "--ServerApp.allow_remote_access=False",
            "--ServerApp.terminals_enabled=False",
        ]  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--ServerApp.allow_root=True")  # CI and the dev machines run as root
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=self.root, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {self.timeout:.0f} s:\n{self.log()}")

    def log(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server and its kernels (its own process group), politely first."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> JupyterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def jupyter_server(root: Path, **kwargs: Any) -> Iterator[JupyterServer]:
    server = JupyterServer(root, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------- notebook driving
# what the notebook page shows, for a wait that gives up: each code cell's prompt and first line, the kernel's
# status, and any dialog over the page
_NOTEBOOK_STATE = """() => ({
    cells: [...document.querySelectorAll('.jp-CodeCell')].map((c) => [
        (c.querySelector('.jp-InputPrompt') || {}).textContent || '',
        ((c.querySelector('.jp-InputArea-editor') || {}).textContent || '').split('\\n')[0].slice(0, 60)]),
    kernel: (document.querySelector('.jp-Notebook-ExecutionIndicator') || {dataset: {}}).dataset.status || 'no indicator',
    dialog: ((document.querySelector('.jp-Dialog') || {}).innerText || '').replace(/\\s+/g, ' ').slice(0, 200),
})"""


def notebook_state(page: Any) -> dict[str, Any]:
    """The notebook page's cells (prompt, first line), the kernel's status and any dialog's text."""
    try:
        return page.evaluate(_NOTEBOOK_STATE)
    except Exception as exc:  # noqa: BLE001 - the page itself is gone: say so
        return {"unreadable": f"{type(exc).__name__}: {exc}"}


def _describe(state: dict[str, Any]) -> str:
    if "unreadable" in state:
        return f"the page could not be read ({state['unreadable']})"
    cells = "; ".join(f"{p.strip() or '[ ]'} {line!r}" for p, line in state["cells"]) or "no code cell"
    dialog = f"; a dialog: {state['dialog']!r}" if state["dialog"] else ""
    return f"kernel {state['kernel']}; cells: {cells}{dialog}"


def wait_kernel_idle(page: Any, timeout: float = 120_000) -> None:
    """Wait until the notebook's kernel has started and is idle (JupyterLab 4 and Notebook 7); one that does not
    within ``timeout`` ms fails with what the page showed."""
    try:
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout, state="attached")
    except Exception as exc:  # playwright's TimeoutError
        raise AssertionError(
            f"the kernel was not idle within {timeout / 1000:.0f} s: {_describe(notebook_state(page))}"
        ) from exc


_STARTED = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .some((p) => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""


def _no_dialog(page: Any, timeout: float = 60_000) -> None:
    """Wait for a JupyterLab dialog over the page to close by itself (a loaded machine saw one cover the notebook
    while the kernel started); one that stays fails the test with its text. A "Select Kernel" dialog is answered
    as a person would, as often as it comes back (fresh-clone CI saw Notebook 7 ask again after the first answer,
    while another notebook's kernel was running)."""
    dialog = page.locator(".jp-Dialog")
    deadline = time.monotonic() + timeout / 1000
    while dialog.count():
        try:
            title = " ".join(dialog.first.inner_text(timeout=1_000).split())
            if title.startswith("Select Kernel"):
                # on a loaded machine JupyterLab may ask which kernel before its sessions answer (fresh-clone CI saw
                # it stay 60 s): pick the Python kernel (its preselection can be "No Kernel"), as a person would
                options = dialog.first.locator("select")
                if options.count():
                    try:
                        options.first.select_option(label="Python 3 (ipykernel)", timeout=5_000)
                    except Exception:  # noqa: BLE001 - another label: keep the preselected one
                        pass
                dialog.first.locator(".jp-Dialog-button.jp-mod-accept").click(timeout=10_000)
            dialog.first.wait_for(state="detached", timeout=10_000)
        except Exception as exc:  # playwright's TimeoutError, or the dialog went away while we read it
            if dialog.count() and time.monotonic() > deadline:
                text = " ".join(dialog.first.inner_text(timeout=1_000).split())
                raise AssertionError(f"a dialog stays over the notebook: {text[:300]!r}") from exc


def run_all_cells(page: Any, tries: int = 3) -> None:
    """Run > Run All Cells, from the menu bar, as a person would; retried if no cell started.

    Right after the page loads the notebook may not be the shell's current widget yet, and the
    menu entry is then disabled: focus the notebook first, and try again if nothing ran.
    """
    for attempt in range(tries):
        _no_dialog(page)
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).first.click()
        item = page.locator(".lm-Menu-item:not(.lm-mod-disabled)").filter(
            has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))
        )
        try:
            item.first.click(timeout=10_000)
            page.wait_for_function(_STARTED, timeout=10_000)
            return
        except Exception:  # playwright's TimeoutError: close the menu, try again
            page.keyboard.press("Escape")
            if attempt == tries - 1:
                raise


def wait_cells_done(page: Any, stall: float = 300_000, limit: float = 900_000) -> None:
    """Wait until no code cell is queued or running (prompt ``[*]``) and the kernel is idle.

    Bounded by progress, not by a guess of the machine's speed: the wait fails when no cell has finished for
    ``stall`` ms (a loaded two-core machine runs each cell slower, not forever) or after ``limit`` ms in all, and
    says what it saw: each cell's prompt and first line, the kernel's status, any dialog."""
    start = last = time.monotonic()
    done_before, again = -1, 0
    while True:
        state = notebook_state(page)
        if "unreadable" not in state:
            prompts = [p for p, _ in state["cells"]]
            done = sum(bool(re.search(r"\[\d+\]", p)) for p in prompts)
            if prompts and done == len(prompts) and state["kernel"] in ("idle", "no indicator"):
                return
            if done != done_before:
                done_before, last = done, time.monotonic()
            started = any(re.search(r"\[(\*|\d+)\]", p) for p in prompts)
            if not started and state["kernel"] == "idle" and time.monotonic() - last > 30 and again < 2:
                # fresh-clone CI: Run All was taken while the kernel (re)started, and no cell ever ran (every prompt
                # "[ ]", the kernel idle): run them again, as a person would
                run_all_cells(page)
                again, last = again + 1, time.monotonic()
        now = time.monotonic()
        if now - last > stall / 1000 or now - start > limit / 1000:
            why = f"no cell finished for {stall / 1000:.0f} s" if now - last > stall / 1000 else (
                f"still running after {limit / 1000:.0f} s")
            raise AssertionError(f"the notebook's cells did not finish ({why}): {_describe(state)}")
        time.sleep(0.5)


FIRST_PAINT_PROBE = """
(() => {
  const mark = () => {
    // in JupyterLab: when the first output panel appeared (before the widget model is built and rendered)
    const out = document.querySelector(".jp-CodeCell .jp-OutputArea-child");
    if (out && window.__fvOutputAt == null) window.__fvOutputAt = performance.now();
    if (window.__fvFirstNode == null && document.querySelector('.fv-tree .fv-node')) {
      window.__fvFirstNode = performance.now();
      requestAnimationFrame(() => requestAnimationFrame(() => { window.__fvFirstPaint = performance.now(); }));
      return true;
    }
    return false;
  };
  const start = () => {
    if (mark()) return;
    const obs = new MutationObserver(() => { if (mark()) obs.disconnect(); });
    obs.observe(document.documentElement, { childList: true, subtree: true });
  };
  if (document.documentElement) start(); else document.addEventListener('DOMContentLoaded', start);
})();
"""
"""An init script: ``window.__fvFirstNode`` = ``performance.now()`` (ms since navigation start) when
the first tree node is in the DOM, ``window.__fvFirstPaint`` two animation frames later (it painted),
and in JupyterLab ``window.__fvOutputAt`` when the first cell output appeared."""
