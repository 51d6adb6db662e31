"""Grade one submission: run it in a fresh, limited kernel in a scratch folder, then re-check it.

``grade_submission(path, settings)`` returns a ``Graded`` row. Nothing it meets stops a batch: a file
that is not a notebook, an unknown lesson, an endless loop, a dead kernel or a flood of output each
become a short ``status``. The learner's notebook is read, never written; it runs as a copy in a
scratch folder that holds a copy of the lesson folder's other files, and the folder is removed after.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .lessons import NOTEBOOK_DIR, Lesson, match_lesson, read_lessons

_HERE = Path(__file__).resolve().parent
COURSE_LIB = _HERE.parent
# The most important problem first: a row shows one status.
STATUS_ORDER = ["too large", "not a notebook", "unknown lesson", "not graded", "course changed",
                "grader stopped", "grader error", "results forged", "kernel died", "timeout", "memory limit",
                "output too large", "stub moved", "cells deleted", "cells reordered", "graded"]
_MIME = "application/vnd.course-grader+json"  # kernel_side.MIME
# The grader's code inside a kernel, sent as text and executed in one namespace, in this order:
# the state it keeps and restores, then the re-check (kernel_side.py's docstring).
KERNEL_FILES = ("kernel_side.py", "kernel_recheck.py")
# The largest notebook the grader reads (--max-notebook-mb). The course's largest lesson notebook,
# outputs included, is under 3 MB (02_multi_head_attention.ipynb, 2.9 MB); a learner's adds figures
# and printed output, still a few MB. Reading and parsing a notebook costs the grader several times
# its size (a 150 MB one took it to 1.4 GB), in each worker; 50 MB keeps that bounded, with room
# for any honest notebook.
MAX_NOTEBOOK_MB = 50.0
# The re-check's one budget for all of a notebook's exercises together (--recheck-timeout): it is
# this, or the exercises' cell limits added up if that is less (lesson 00 at --timeout 20: 60 s).
# The kernel gives each exercise at most the cell limit and at most its fair share of what is left
# (kernel_recheck.recheck). The whole re-check of the slowest lesson (10, then 09) took 12 s in-process
# on a busy 2-core machine, more in a fresh kernel that imports transformers first: 300 s leaves an
# exercise of lesson 11 (7 exercises) 43 s at least. The grader waits RECHECK_GRACE s more (the
# re-check's own start: re-importing the checkers, compiling the cells) and then gives a kernel that
# stopped answering up: a submission costs at most its notebook limit (and one cell's limit past
# it) plus RECHECK_SECONDS + RECHECK_GRACE, whatever its number of exercises (before: n x the cell
# limit + 300 s).
RECHECK_SECONDS = 300.0
RECHECK_GRACE = 30.0
# The sandbox's private /tmp and /dev/shm are tmpfs, that is RAM, outside the kernel's RLIMIT_AS:
# unbounded, one kernel wrote 1,920 MiB to /tmp (#49). A write beyond these fails with ENOSPC
# ("No space left on device") in the learner's cell. The lessons write nothing to /tmp (the
# kernel's TMPDIR is its scratch folder, on disk); /dev/shm holds multiprocessing's semaphores and
# torch's tensors shared with DataLoader workers (the lessons use none).
TMP_BYTES = 256 * 2**20
SHM_BYTES = 64 * 2**20


@dataclass
class Settings:
    cell_timeout: float = 120.0  # seconds per cell (and at most per exercise in the re-check)
    recheck_timeout: float = RECHECK_SECONDS  # seconds for the whole re-check, all its exercises together
    notebook_timeout: float = 1800.0  # no cell starts after this many seconds
    memory_bytes: int = 8 * 2**30  # address space of the kernel
    output_bytes: int = 2 * 2**20  # printed output kept per notebook (50 x for all output)
    max_notebook_bytes: int = int(MAX_NOTEBOOK_MB * 2**20)  # a larger file is not read (status "too large")
    threads: int = 1  # torch / OpenMP threads per kernel
    seed: int = -1  # the re-check's seed: -1 draws a fresh one per submission (see _recheck_seed)
    sandbox: str = "none"  # "bwrap": each kernel in a bubblewrap sandbox; "none": as a plain process
    scratch_root: str | None = None  # where the submissions' scratch folders go (default: TMPDIR)
    socket_root: str | None = None  # where their sockets go when scratch paths are too long (socket_root)
    hidden: list[str] = field(default_factory=list)  # paths the sandbox hides (the class, the output)
    tmp_bytes: int = TMP_BYTES  # the sandbox's private /tmp: at most this much (it is RAM)
    shm_bytes: int = SHM_BYTES  # the sandbox's /dev/shm (RAM too): at most this much
    journal: dict[str, str] | None = None  # the run's journal ({"path", "run", "settings"}; journal.py)
    course_digest: str | None = None  # course_lib's files as the run found them (integrity.py; None: not checked)
    alone: bool = False  # no other submission is graded at the same time (who changed course_lib is certain)


@dataclass
class Graded:
    """One submission's row, plus what the report and the feedback page show."""

    student: str
    lesson: str = ""
    status: str = "graded"
    results: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> outcome, message
    peeked: list[str] = field(default_factory=list)  # keys whose solution was shown before passing
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def marks(self) -> dict[str, int]:
        return {k: int(r["outcome"] == "passed") for k, r in self.results.items()}


_SOCKET_PATH_MAX = 107  # a Unix socket's address: sockaddr_un.sun_path less its closing NUL


def kernel_source() -> str:
    """The text the grader executes in each kernel (``KERNEL_FILES`` joined): it defines
    ``snapshot()`` and ``recheck(...)`` in the namespace it is executed in."""
    return "\n\n".join((_HERE / name).read_text(encoding="utf-8") for name in KERNEL_FILES)


def _worse(current: str, new: str) -> str:
    return min(current, new, key=STATUS_ORDER.index)


def needed_under_tmp(roots: tuple[str, ...] = ("/tmp",)) -> list[str]:
    """The folders under ``roots`` (the sandbox's own empty folders: /tmp, and the scratch root)
    that the kernel needs: the Python environment and course_lib's clone. Outermost first, none
    inside another."""
    import course_lib

    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent,
                  Path(sys.executable).resolve().parent, Path(course_lib.__file__).resolve().parents[1]}
    needed = sorted({str(p.resolve()) for p in candidates
                     if any(_within(str(p.resolve()), root) for root in roots)})
    return [p for p in needed if not any(p.startswith(q + "/") for q in needed if q != p)]


def _within(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def socket_root(scratch_root: str) -> str | None:
    """A short folder for a grading run's kernel sockets, made under /tmp (or /dev/shm) when the
    scratch folders' own ``ipc/kernel-N`` paths would not fit a Unix socket's address (107
    characters): a long TMPDIR, such as pytest's temporary folders. None when they fit. Its file
    ``scratch`` names the run's scratch root. The caller removes it with the scratch root, so a
    worker killed mid-run leaves nothing behind."""
    longest = Path(scratch_root) / "grade-xxxxxxxx-xxxxxxxx" / "ipc" / "kernel-99"  # grade_submission's names
    if len(str(longest)) <= _SOCKET_PATH_MAX:
        return None
    for base in ("/tmp", "/dev/shm"):
        try:
            folder = Path(tempfile.mkdtemp(prefix="grade-ipc-", dir=base))
        except OSError:
            continue
        if len(str(folder / "kxxxxxxxx" / "kernel-99")) <= _SOCKET_PATH_MAX:
            (folder / "scratch").write_text(scratch_root, encoding="utf-8")  # whose sockets these are
            return str(folder)
        folder.rmdir()
    raise RuntimeError(f"no folder for the kernels' sockets: {scratch_root} is too long for a Unix socket's "
                       f"{_SOCKET_PATH_MAX} characters and /tmp is not writable; set TMPDIR to a shorter folder")


def socket_folder(scratch: Path, sockets_root: str | None = None) -> Path:
    """Where one kernel's IPC sockets go: ``scratch/ipc`` when their paths fit a Unix socket's
    address, else a folder of its own in ``sockets_root`` (``socket_root``'s), else in a short
    folder made here under /tmp."""
    inside = scratch / "ipc"
    if len(str(inside / "kernel-99")) <= _SOCKET_PATH_MAX:
        inside.mkdir(exist_ok=True)
        return inside
    root = sockets_root or socket_root(str(scratch))
    return Path(tempfile.mkdtemp(prefix="k", dir=root))


def _sandbox_command(scratch: Path, sockets: Path, settings: Settings) -> list[str]:
    """bwrap's arguments: the whole file system read-only, its own scratch folder writable, a
    private /tmp (``tmp_bytes`` of RAM at most), /dev (its /dev/shm ``shm_bytes`` at most) and
    /proc, no network, its own PID namespace (every process in it dies with it), the class's
    folders and the output folder hidden.

    The scratch root (the folder that holds every submission's scratch folder: the run's own under
    TMPDIR) is hidden by an empty, read-only folder wherever TMPDIR is, and only this kernel's own
    scratch folder is put back in it: another kernel's ``ipc/kernel.json`` (its keys), work and
    sockets are out of sight, with TMPDIR under /tmp (the private /tmp hides them) or elsewhere
    (/var/tmp, a cluster's scratch). A folder hidden this way is read-only and holds nothing."""
    def size(limit: int) -> list[str]:
        return ["--size", str(limit)] if _bwrap_sizes() else []

    command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", *size(settings.shm_bytes), "--tmpfs", "/dev/shm",
               "--proc", "/proc", *size(settings.tmp_bytes), "--tmpfs", "/tmp"]
    emptied = ["/tmp", "/dev"]  # folders the sandbox replaces with its own
    read_only = ["/dev"]  # the private /dev's own tmpfs: only its device nodes and /dev/shm are of use
    root = str(scratch.parent)
    if not any(_within(root, e) for e in emptied) and root != "/":
        command += [*size(4096), "--tmpfs", root]  # every submission's scratch folder hidden
        emptied.append(root)
        read_only.append(root)
    # What the kernel runs from may itself live under /tmp (a clone and its .venv there, as on a CI
    # machine), or under the scratch root: the emptied folders would hide Python and course_lib,
    # so they are bound back, read-only.
    shown = needed_under_tmp(tuple(emptied))
    for path in shown:
        command += ["--ro-bind", path, path]
    for hidden in settings.hidden:
        emptied_already = any(_within(hidden, e) for e in emptied)
        if emptied_already and not any(_within(hidden, p) for p in shown):
            continue  # the private /tmp, or the hidden scratch root, hides it already
        if Path(hidden).is_dir():
            command += [*size(4096), "--tmpfs", hidden]
            read_only.append(hidden)
        elif Path(hidden).exists():
            command += ["--ro-bind", "/dev/null", hidden]
    command += ["--bind", str(scratch), str(scratch)]
    if scratch not in sockets.parents:  # the kernel's sockets live outside it (a long scratch path)
        command += ["--bind", str(sockets), str(sockets)]
    for folder in read_only:  # after the binds that made their mount points: not recursive
        command += ["--remount-ro", folder]
    command += ["--chdir", str(scratch / "work"),
                "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--"]
    return command


@functools.lru_cache(maxsize=1)
def _bwrap_sizes() -> bool:
    """Whether this bwrap sizes a tmpfs (``--size``: bubblewrap 0.7.0 and later, not setuid; Ubuntu
    22.04 has 0.6.1): tried once per process on a tiny sandbox. Without it the sandbox's /tmp and
    /dev/shm are not limited (docs/instructors.md); the rest holds."""
    try:
        tried = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--size", "65536", "--tmpfs", "/tmp", "true"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return tried.returncode == 0


def _kernel_manager(scratch: Path, sockets: Path, settings: Settings) -> Any:
    from jupyter_client.manager import AsyncKernelManager

    launcher = str(_HERE / "limits.py")
    sandbox = _sandbox_command(scratch, sockets, settings) if settings.sandbox == "bwrap" else []

    class LimitedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            # no history database: a learner's cells are kept nowhere on disk (another kernel,
            # unsandboxed, could read a scratch folder's files while this one runs)
            command = [*super().format_kernel_cmd(extra_arguments), "--HistoryManager.enabled=False"]
            return [*sandbox, sys.executable, launcher, str(settings.memory_bytes), "--", *command]

    # IPC sockets in a folder of this submission's own: no TCP port (and no "running over TCP"
    # warning), and nothing another submission's kernel can reach. The connection file stays in the
    # scratch folder, so the kernel's command line names it.
    manager = LimitedKernelManager(kernel_name="python3", transport="ipc", ip=str(sockets / "kernel"),
                                   connection_file=str(scratch / "ipc" / "kernel.json"))
    if sandbox:  # a SIGINT to bwrap's process group would end bwrap, not reach the kernel: the kernel
        manager.kernel_spec.interrupt_mode = "message"  # interrupts itself on an interrupt_request
    return manager


def _kernel_env(scratch: Path) -> dict[str, str]:
    """The kernel's environment: every cache and temporary file inside its scratch folder."""
    env = dict(os.environ)
    for name, sub in (("TMPDIR", "tmp"), ("MPLCONFIGDIR", "cache/matplotlib"), ("IPYTHONDIR", "cache/ipython"),
                      ("JUPYTER_RUNTIME_DIR", "ipc"), ("XDG_CACHE_HOME", "cache"),
                      ("TORCHINDUCTOR_CACHE_DIR", "cache/inductor")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / sub)
    env.pop("JPY_PARENT_PID", None)
    return env


def _client(nb: Any, scratch: Path, sockets: Path, settings: Settings) -> Any:
    from nbclient import NotebookClient

    class Client(NotebookClient):
        """nbclient, counting timeouts, keeping at most ``output_bytes`` of output, and taking the
        grader's results out of the re-check cell's display messages."""

        timed_out = False
        output_size = 0  # printed text
        display_size = 0  # everything, figures and HTML views included (lessons show a few MB)
        grader_cell = -1
        payloads: list[str] = []

        async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
            self.timed_out = True
            return await super()._async_handle_timeout(timeout, cell)

        def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int) -> Any:
            data = msg.get("content", {}).get("data") or {}
            if cell_index == self.grader_cell and isinstance(data, dict) and _MIME in data:
                self.payloads.append(data[_MIME])
                return None
            size = len(json.dumps(msg.get("content", {}), default=str))
            if msg["msg_type"] == "stream":
                self.output_size += size
            self.display_size += size
            if self.output_size > settings.output_bytes or self.display_size > 50 * settings.output_bytes:
                return None  # dropped: the grader's memory stays bounded
            return super().output(outs, msg, display_id, cell_index)

    error = {"ename": "TimeoutError", "evalue": f"cell exceeded {settings.cell_timeout:g} s",
             "traceback": []}
    client = Client(nb, timeout=settings.cell_timeout, allow_errors=True, interrupt_on_timeout=True,
                    error_on_timeout=error, km=_kernel_manager(scratch, sockets, settings), record_timing=False,
                    shutdown_kernel="immediate", resources={"metadata": {"path": str(scratch / "work")}})
    client.owns_km = True  # nbclient shuts the kernel down when setup_kernel's block ends
    client.payloads = []
    return client


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def end_processes(keep: set[int]) -> int:
    """Kill every descendant of this process not in ``keep`` and reap it; return how many. The
    worker is a child subreaper (``configure_worker``), so a submission's orphans, double-forked or
    in a session of their own, are its descendants too."""
    killed = 0
    deadline = time.monotonic() + 2  # a shut-down kernel (and bwrap around it) first ends by itself
    while time.monotonic() < deadline and [p for p in descendants(os.getpid()) if p not in keep and _alive(p)]:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    for _ in range(50):
        pids = [p for p in descendants(os.getpid()) if p not in keep]
        if not pids:
            break
        for pid in pids:
            try:
                killed += _alive(pid)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                if not [p for p in descendants(os.getpid()) if p not in keep and _alive(p)]:
                    break
                time.sleep(0.02)
    return killed


def _alive(pid: int) -> bool:
    """False for a zombie or a process gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"


def _structure(nb: Any, lesson: Lesson) -> str:
    """"cells deleted" if a lesson cell (neither stub nor check) is missing or edited,
    "cells reordered" if they are out of order, else "graded"."""
    found = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            found.setdefault(cell.source.strip(), i)
    positions = [found.get(source.strip()) for source in lesson.lesson_cells]
    if any(p is None for p in positions):
        return "cells deleted"
    return "graded" if positions == sorted(positions) else "cells reordered"


def _events(cells: list[Any], lesson: Lesson) -> list[tuple[str, str]]:
    """("shown", key) and ("passed", key) in the order the cells' outputs happened."""
    events = []
    for cell in cells:
        for ex in lesson.exercises:
            if f"{ex.checker}(" in cell.get("source", ""):
                errors = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
                text = "".join(o.get("text", "") for o in cell.get("outputs", []))
                if cell.get("outputs") and not errors and "not implemented yet" not in text:
                    events.append(("passed", ex.key))
        for out in cell.get("outputs", []):
            shown = str(out.get("data", {}).get("text/markdown", "")) + str(out.get("text", ""))
            for ex in lesson.exercises:
                if f"Solution {ex.key}" in shown:
                    events.append(("shown", ex.key))
    return events


def _peeked(graded_cells: list[Any], stored_cells: list[Any], lesson: Lesson, passed: set[str]) -> list[str]:
    """Exercises passed in the re-check whose solution was shown before the notebook's first pass:
    in the grading run (top to bottom), or in the learner's own session (stored outputs, in order
    of their execution counts)."""
    session = sorted((c for c in stored_cells if c.get("execution_count")),
                     key=lambda c: c["execution_count"])
    peeked = set()
    for events in (_events(graded_cells, lesson), _events(session, lesson)):
        done: set[str] = set()
        for kind, key in events:
            if kind == "passed":
                done.add(key)
            elif key not in done:
                peeked.add(key)
    return [k for k in lesson.keys if k in peeked and k in passed]


def _read_payloads(payloads: list[str], nonce: str, row: Graded) -> dict[str, Any]:
    """The re-check's results, one message per exercise, or {} (and the status "results forged") if
    any is not the grader's own: numbered 0, 1, 2, ... with this run's nonce. Anything else means
    that the notebook's code wrote into the re-check's output."""
    checked: dict[str, Any] = {"exercises": {}, "patched_before": []}
    for expected_seq, text in enumerate(payloads):
        try:
            data = json.loads(text)
            result = data["result"]
            ok = (data.get("nonce") == nonce and data.get("seq") == expected_seq and isinstance(data["key"], str)
                  and isinstance(result, dict) and data["key"] not in checked["exercises"]
                  and all(isinstance(result.get(k), str) for k in ("outcome", "message", "mistake", "site")))
        except (ValueError, TypeError, KeyError, RecursionError):
            ok = False
        if not ok:
            row.status = _worse(row.status, "results forged")
            row.notes.append("the re-check's results were not the grader's own (the notebook's code wrote "
                             "into them); every exercise is graded 0")
            return {}
        checked["exercises"][data["key"]] = result
        checked["patched_before"] = data.get("patched_before") or []
    return checked


def _close_sockets(client: Any) -> None:
    """Close every zmq socket of this submission's kernel manager and client now, with linger 0. A
    context left to the garbage collector is terminated later, inside another submission's work
    (seen: while reading the next notebook), and blocks there forever on a socket whose kernel is gone."""
    for owner in (getattr(client, "kc", None), getattr(client, "km", None)):
        context = getattr(owner, "context", None)
        if context is not None:
            try:
                context.destroy(linger=0)
            except Exception:  # noqa: BLE001 (already closed)
                pass


def _run(nb: Any, lesson: Lesson, scratch: Path, sockets: Path, settings: Settings, row: Graded) -> None:
    """Execute the cells in a limited kernel, then the re-check; fill ``row``."""
    from nbclient.exceptions import DeadKernelError
    from nbformat.v4 import new_code_cell

    token = secrets.token_hex(6)
    nonce = secrets.token_hex(16)
    grader = f"_g{token}"
    source = kernel_source()
    setup = (f"def {grader}():\n    ns = {{'__name__': 'grader'}}\n    exec({source!r}, ns)\n"
             f"    ns['restore'] = ns['snapshot']()\n    return ns\n{grader} = {grader}()")
    spec = [{"key": e.key, "name": e.name, "checker": e.checker, "args": e.args} for e in lesson.exercises]
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    budget = recheck_budget(settings, len(spec))
    recheck = (f"{grader}['recheck']({spec!r}, {_recheck_seed(settings.seed)}, {settings.cell_timeout}, "
               f"{grader}['restore'], {nonce!r}, {str(COURSE_LIB / 'solutions')!r}, {cells!r}, "
               f"budget={budget})\nNone")
    client = _client(nb, scratch, sockets, settings)
    start = time.monotonic()
    alive = True
    learner_cells = list(nb.cells)
    try:
        # the kernel's output goes nowhere: no process of the submission holds the grader's stdout.
        # In the sandbox the kernel's parent is the namespace's init (PID 1), which ipykernel's
        # parent poller would take for "the parent exited": bwrap's --die-with-parent does that job.
        # The kernel (or bwrap around it) dies with this worker, even a worker killed by SIGKILL.
        with client.setup_kernel(env=_kernel_env(scratch), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, independent=settings.sandbox == "bwrap",
                                 preexec_fn=_dies_with(os.getpid())):
            nb.cells.append(new_code_cell(setup))  # the grader's cells run last in the list, and
            client.timeout = max(settings.cell_timeout, 300)  # (it imports torch and the checkers)
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)  # leave the learner's indices as they are
            client.timeout = settings.cell_timeout
            for index, cell in enumerate(learner_cells):
                if cell.cell_type != "code":
                    continue
                if time.monotonic() - start > settings.notebook_timeout:
                    row.notes.append(f"stopped after {settings.notebook_timeout:g} s for the notebook")
                    client.timed_out = True
                    break
                client.execute_cell(cell, index)
            nb.cells[-1] = new_code_cell(recheck)
            client.grader_cell = len(nb.cells) - 1
            # one deadline for the whole re-check, however many exercises: the kernel keeps to it
            # itself (kernel_recheck.recheck's budget); a kernel that stops answering is given up
            # RECHECK_GRACE s after it (it was n x cell_timeout + 300 s)
            client.timeout = budget + RECHECK_GRACE
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
    except DeadKernelError:
        alive = False
        row.status = _worse(row.status, "kernel died")
        row.notes.append("the kernel died (os._exit, a crash, or killed for its memory)")
    except Exception as err:  # noqa: BLE001 (the batch goes on; the row says what happened)
        alive = False
        row.status = _worse(row.status, "kernel died")
        row.notes.append(f"the run stopped: {type(err).__name__}: {str(err)[:200]}")
    finally:
        _close_sockets(client)
    del nb.cells[len(learner_cells):]
    if client.timed_out:
        row.status = _worse(row.status, "timeout")
    if client.output_size > settings.output_bytes or client.display_size > 50 * settings.output_bytes:
        row.status = _worse(row.status, "output too large")
        row.notes.append(f"{client.output_size / 2**20:.1f} MB of printed output (limit "
                         f"{settings.output_bytes / 2**20:.0f} MB), {client.display_size / 2**20:.1f} MB "
                         f"in all (limit {50 * settings.output_bytes / 2**20:.0f} MB); the rest was dropped")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and (
                    out.get("ename") == "MemoryError" or "can't allocate memory" in str(out.get("evalue", ""))):
                row.status = _worse(row.status, "memory limit")
    checked = _read_payloads(client.payloads, nonce, row) if alive else {}
    if checked.get("patched_before"):
        row.notes.append("undid the notebook's changes to " + ", ".join(map(str, checked["patched_before"][:5])))
    for ex in lesson.exercises:
        row.results[ex.key] = checked.get("exercises", {}).get(
            ex.key, {"outcome": "not checked", "message": "The grader could not re-check this exercise "
                     f"({row.status}).", "mistake": ""})


def recheck_budget(settings: Settings, exercises: int) -> float:
    """The re-check's seconds for ``exercises`` exercises' checks together: ``recheck_timeout``, or
    the cell limit times their number if that is less."""
    return min(settings.recheck_timeout, settings.cell_timeout * max(1, exercises))


def _recheck_seed(seed: int) -> int:
    """The re-check's seed: drawn afresh for every run, so its inputs are not the notebook's (whose
    cells seed with small fixed numbers) and cannot be recorded in advance; ``seed`` only decides
    which fresh draw (tests that need a fixed draw pass a seed and read it back)."""
    return secrets.randbits(31) if seed < 0 else 10_000 + seed


def read_notebook(path: Path, max_bytes: int) -> tuple[str | None, int]:
    """(the file's text, its size in bytes), or (None, its size) if it is larger than ``max_bytes``:
    then it is not read (its size comes from the file system; a file that grows meanwhile is read
    no further than one byte past the limit). OSError if it cannot be read."""
    size = os.stat(path).st_size
    if size > max_bytes:
        return None, size
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        return None, max(size, len(data))
    return data.decode("utf-8", errors="replace"), len(data)


def too_large(row: Graded, size: int, max_bytes: int) -> Graded:
    """``row`` as a notebook over the size limit leaves it: status "too large", no marks."""
    row.status = "too large"
    row.notes.append(f"too large: {size / 2**20:.1f} MB, the limit is {max_bytes / 2**20:.3g} MB "
                     "(--max-notebook-mb); it was not read")
    return row


def grade_submission(path: Path, settings: Settings, lessons: dict[str, Lesson] | None = None,
                     content: str | None = None, size: int | None = None) -> Graded:
    """Grade one submitted notebook (its text ``content``, read by the grader before any kernel ran,
    else ``path``); never raises for a bad submission. ``size``: the file's size when the grader
    found it larger than ``settings.max_notebook_bytes`` and did not read it. Every process the
    submission started is ended and its scratch folder removed before this returns."""
    import nbformat

    warnings.filterwarnings("ignore", module="nbformat")  # a learner's notebook format is not our news
    began = time.monotonic()
    row = Graded(student=path.stem)
    lessons = lessons or read_lessons()
    if content is None and size is not None and size > settings.max_notebook_bytes:
        return too_large(row, size, settings.max_notebook_bytes)
    try:
        if content is None:
            content, size = read_notebook(path, settings.max_notebook_bytes)
            if content is None:
                return too_large(row, size, settings.max_notebook_bytes)
        text = content
        nb = nbformat.reads(text, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no cells")
        stored = list(nbformat.reads(text, as_version=4).cells)
    except Exception as err:  # noqa: BLE001
        row.status = "not a notebook"
        row.notes.append(f"could not read it as a notebook: {str(err)[:200]}")
        return row
    lesson_id = match_lesson(nb, lessons)
    if lesson_id is None:
        row.status = "unknown lesson"
        row.notes.append("it holds no exercise of this course")
        return row
    lesson = lessons[lesson_id]
    row.lesson = lesson_id
    from . import integrity

    if integrity.changed(settings.course_digest):  # before its kernel starts: the course is not the run's
        return integrity.not_graded_row(row, lesson, "before it started")
    row.status = _structure(nb, lesson)
    moved = _moved_stubs(nb, lesson)
    keep = set(descendants(os.getpid()))
    scratch = Path(tempfile.mkdtemp(prefix=f"grade-{secrets.token_hex(4)}-", dir=settings.scratch_root))
    sockets = scratch / "ipc"
    try:
        sockets = socket_folder(scratch, settings.socket_root)
        # the lesson folder's files, without any notebook: the kernel gets its cells from the
        # grader, and a copy of the learner's notebook on disk is an answer another kernel could read
        shutil.copytree(lesson.path.parent, scratch / "work", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
        from .journal import record_started, submission_digest

        record_started(settings.journal, row.student, submission_digest(text))  # before its kernel starts
        _run(nb, lesson, scratch, sockets, settings, row)
    except Exception as err:  # noqa: BLE001 (the grader's own trouble is this row's, not the batch's)
        row.status = _worse(row.status, "grader error")
        row.notes.append(f"the grader failed on it: {type(err).__name__}: {str(err)[:200]}")
    finally:
        left = end_processes(keep)
        if left:
            row.notes.append(f"ended {left} process(es) the notebook left running")
        shutil.rmtree(scratch, ignore_errors=True)
        if scratch not in sockets.parents:  # a socket folder outside: its own, or its run's one
            shutil.rmtree(sockets if settings.socket_root else sockets.parent, ignore_errors=True)
    if integrity.changed(settings.course_digest):  # after its processes ended: it, or one beside it, wrote
        integrity.mark_changed(row, lesson, settings.alone)  # to course_lib; the run stops (cli.grade_all)
        row.seconds = time.monotonic() - began
        return row
    if moved:
        row.status = _worse(row.status, "stub moved")
        row.notes.append("the stub cell of " + ", ".join(moved) + " is gone and its name is defined after "
                         "its check cell")
        for key in moved:
            name = next(e.name for e in lesson.exercises if e.key == key)
            row.results[key] = {"outcome": "failed", "mistake": "grader: stub moved", "message": (
                f"The exercise's cell was deleted and `{name}` is defined after the cell that checks it, so "
                "the check in your notebook never ran on it; it is graded 0. Write your answer in the "
                "exercise's own cell.")}
    passed = {k for k, r in row.results.items() if r["outcome"] == "passed"}
    row.peeked = _peeked(nb.cells, stored, lesson, passed)
    row.seconds = time.monotonic() - began
    return row


def _moved_stubs(nb: Any, lesson: Lesson) -> list[str]:
    """Exercises whose stub cell (found by its key, or by its text) is gone while a cell defines
    the exercise's name: the learner moved the definition away from the checker's place."""
    from .lessons import DEFINES

    keys = {c.get("metadata", {}).get("exercise") for c in nb.cells}
    sources = {c.source.strip() for c in nb.cells if c.cell_type == "code"}
    defined = {n for c in nb.cells if c.cell_type == "code" for n in DEFINES.findall(c.source)}
    moved = []
    for ex in lesson.exercises:
        if ex.key in keys or ex.stub_source.strip() in sources:
            continue
        stub_first = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                      and re.search(rf"^(?:def|class)\s+{re.escape(ex.name)}\b", c.source, re.M)]
        check_at = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and f"{ex.checker}(" in c.source]
        if ex.name in defined and (not stub_first or not check_at or stub_first[0] > check_at[0]):
            moved.append(ex.key)
    return moved


def become_subreaper() -> None:
    """Linux: orphaned descendants of this process are re-parented to it, not to init, so that
    ``end_processes`` can end them. (The grader's main process is one too: a worker killed under a
    submission leaves its kernel's processes to it.)"""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def die_with_parent(parent: int | None = None) -> None:
    """Linux: this process gets SIGKILL when the thread that started it ends (``PR_SET_PDEATHSIG``),
    however that ends (a SIGKILL too). ``parent``: the pid that started it; if this process has
    another parent already (``parent`` died before this call), it exits now."""
    if sys.platform.startswith("linux"):
        _prctl()(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if parent is not None and os.getppid() != parent:
            os._exit(1)


@functools.lru_cache(maxsize=1)
def _prctl() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _dies_with(parent: int) -> Any:
    """A ``preexec_fn`` for a kernel: ``die_with_parent(parent)`` in the child, before it runs the
    kernel's command (the setting survives exec). None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    _prctl()  # loaded here, in the parent: the child between fork and exec only calls it
    return functools.partial(die_with_parent, parent)


def configure_worker(threads: int, parent: int | None = None) -> None:
    """Environment for the kernels a worker starts: its share of the cores, no GUI backends. The
    worker becomes a child subreaper (Linux): a process a submission starts and abandons, even in
    a new session or double-forked, is re-parented to the worker, which ends it (``end_processes``).
    With ``parent`` (the grader's pid), the worker dies with the grader (``die_with_parent``)."""
    import logging

    if parent is not None:
        die_with_parent(parent)

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # nbclient's "Task exception was never
    # retrieved" when a kernel dies: the row says so; the terminal shows only the grader's lines
    become_subreaper()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"


__all__ = ["Settings", "Graded", "grade_submission", "kernel_source", "KERNEL_FILES", "read_notebook",
           "MAX_NOTEBOOK_MB", "RECHECK_SECONDS", "configure_worker", "become_subreaper", "die_with_parent",
           "descendants", "end_processes", "STATUS_ORDER", "NOTEBOOK_DIR"]
