"""The grader's journal: a run killed midway loses nothing, and leaves nothing behind (#49).

Without the sandbox a learner's kernel runs as the grader's user, so it can kill the grader's main
process (``SIGKILL``: nothing catches it). What holds anyway:

- **Nothing is left running.** The workers and the kernels die with the process that started them
  (Linux ``PR_SET_PDEATHSIG``: ``runner.die_with_parent``), and a run's scratch root (``grade-run-*``)
  records its owner's pid and start time, so the next run removes the folders of dead runs
  (``remove_stale``), never one of a live run.
- **No work is lost.** ``OUT/journal.jsonl`` gets one JSON line per finished submission, written and
  fsync'ed as it finishes, and a "started" line before a submission's kernel starts. The same command
  again resumes (``resume``): finished rows are taken from the journal, not graded again. A submission
  that was being graded when a run was killed, alone, is not run again: its code may have killed the
  grader, and running it again would kill the next run too; its row gets 0 and the status "grader
  stopped". (With several workers, the submissions then in flight are graded again, alone first: one
  that kills again is then alone.) A run stopped by a signal the grader can catch (Ctrl-C, SIGTERM)
  says so in the journal, and what it was grading is graded again, once.
- **Never with a changed course_lib.** A run that found course_lib changed on disk (integrity.py)
  stops and records it ("course changed", with the digest it began with); the same command refuses
  to resume until course_lib is as that run began, then grades what was in flight again, alone.
- **Never mixed.** Every line carries the key of the settings that change marks (``settings_key``:
  the limits, the sandbox, the grader's and the checkers' code, the lessons' exercises) and each
  submission is known by its learner id and the SHA-256 of its text: a journal of other settings or
  other files is ignored. A line that is not whole JSON (torn by a crash) is ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .lessons import Lesson
from .runner import Graded, Settings

try:
    import fcntl
except ImportError:  # Windows: no lock (one run per output folder is then up to you)
    fcntl = None  # type: ignore[assignment]

JOURNAL_FILE = "journal.jsonl"
FORMAT = 1
OWNER_FILE = "owner"  # in a run's scratch root: "pid start-time" of the grader that made it
STOPPED = "grader stopped"
STOPPED_NOTE = ("the grader stopped while this submission was graded (its code may have killed it); "
                "it was not run again. To grade it anyway, grade it alone: python -m course_lib.grading "
                "--out SOMEWHERE_ELSE FILE")
_GRADING = Path(__file__).resolve().parent

__all__ = ["Journal", "Resumed", "settings_key", "submission_digest", "record_started", "record_finished",
           "resume",
           "stopped_row", "claim_scratch_root", "remove_stale", "JOURNAL_FILE", "STOPPED"]


def submission_digest(content: str | None, size: int | None = None) -> str:
    """A submission's identity in the journal: the SHA-256 of its text as the grader read it (for a
    notebook, which is UTF-8, the file's own SHA-256), or its size if it was too large to read."""
    if content is None:
        return f"size:{size}"
    return hashlib.sha256(content.encode("utf-8", "surrogateescape")).hexdigest()


def settings_key(settings: Settings, lessons: dict[str, Lesson]) -> str:
    """The key of what changes a row's marks: the limits, the sandbox, the grader's and the checkers'
    source, and the lessons' exercises and cells. Not the seed, the workers or the paths."""
    h = hashlib.sha256()
    marks = {name: getattr(settings, name) for name in (
        "cell_timeout", "recheck_timeout", "notebook_timeout", "memory_bytes", "output_bytes",
        "max_notebook_bytes", "sandbox", "tmp_bytes", "shm_bytes")}
    h.update(json.dumps(marks, sort_keys=True).encode())
    for folder in (_GRADING, _GRADING.parent / "checks"):
        for path in sorted(folder.rglob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    for lid in sorted(lessons):
        lesson = lessons[lid]
        h.update(json.dumps([lid, [dataclasses.asdict(e) for e in lesson.exercises], lesson.lesson_cells],
                            sort_keys=True).encode())
    return h.hexdigest()[:32]


def _append(path: str | Path, entry: dict[str, Any]) -> None:
    """One whole line, in one write, appended and fsync'ed."""
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def record_started(journal: dict[str, str] | None, student: str, digest: str) -> None:
    """The "started" line, written by a worker just before a submission's kernel starts.
    ``journal``: ``Settings.journal`` ({"path", "run", "settings"}), or None (no journal)."""
    if not journal:
        return
    try:
        _append(journal["path"], {"v": FORMAT, "event": "started", "run": journal["run"],
                                  "settings": journal["settings"], "student": student, "file": digest})
    except OSError:  # the journal is gone (its run is over): nothing to resume
        pass


def record_finished(journal: dict[str, str] | None, row: Graded, digest: str) -> None:
    """The "finished" line of ``row``, written by the grader's main process as the row comes in. A
    journal that cannot be written costs the resume, never the run."""
    if not journal:
        return
    try:
        _append(journal["path"], {"v": FORMAT, "event": "finished", "run": journal["run"],
                                  "settings": journal["settings"], "student": row.student, "file": digest,
                                  "row": dataclasses.asdict(row)})
    except OSError:
        pass


@dataclass
class Resumed:
    """What an earlier run of the same settings left for this one."""

    rows: dict[str, Graded] = field(default_factory=dict)  # finished: learner id -> row
    stopped: dict[str, Graded] = field(default_factory=dict)  # not run again: learner id -> 0 row
    alone: list[str] = field(default_factory=list)  # in flight when a run stopped: graded again, alone first
    ignored: int = 0  # lines of other settings or other files, or not whole JSON


class Journal:
    """``OUT/journal.jsonl`` of one run: locked (one run per output folder at a time), read back, then
    appended to; removed when every output is written."""

    def __init__(self, out: Path, key: str) -> None:
        self.path = Path(out).resolve() / JOURNAL_FILE
        self.key = key
        self.run = secrets.token_hex(6)
        self.fd: int | None = None

    def open(self) -> list[dict[str, Any]]:
        """Lock the journal and return the earlier runs' lines (whole JSON objects only). A torn last
        line is ended, so that no line is appended to it. RuntimeError if another run holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            if fcntl is not None:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise RuntimeError(f"another grading run is writing to {self.path.parent} (its journal is locked); "
                               "wait for it, or give another --out") from None
        with open(self.path, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            os.write(self.fd, b"\n")
        entries = []
        for line in data.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        self.write({"event": "run", "pid": os.getpid()})
        return entries

    def write(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` with this run's id and settings key, fsync'ed."""
        _append(self.path, {"v": FORMAT, **entry, "run": self.run, "settings": self.key})

    def for_workers(self) -> dict[str, str]:
        return {"path": str(self.path), "run": self.run, "settings": self.key}

    def close(self, remove: bool) -> None:
        """Unlock; with ``remove``, delete the journal first (every output was written)."""
        if remove:
            self.path.unlink(missing_ok=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def resume(entries: list[dict[str, Any]], key: str, digests: dict[str, str]) -> Resumed:
    """What earlier runs' ``entries`` give the class ``digests`` (learner id -> submission_digest)
    under the settings ``key``: finished rows, rows not to run again, and rows to grade alone first.

    A submission that was in flight when a run ended without saying why (killed) and was the only one
    in flight is not run again; nor is one that was in flight when two runs ended. One in flight with
    others, or when the run caught a signal (Ctrl-C, SIGTERM), is graded again, alone."""
    found = Resumed()
    fields = {f.name for f in dataclasses.fields(Graded)}
    started: dict[str, set[str]] = {}  # run -> learner ids started and not finished in it
    caught: set[str] = set()  # runs that caught a signal and said so
    for entry in entries:
        student, run = entry.get("student"), entry.get("run")
        if entry.get("v") != FORMAT or entry.get("settings") != key or not isinstance(run, str):
            found.ignored += 1
            continue
        if entry.get("event") in ("caught", "course changed"):  # (course changed: integrity.py)
            caught.add(run)
            continue
        if entry.get("event") not in ("started", "finished") or student not in digests:
            if entry.get("event") != "run":
                found.ignored += 1
            continue
        if entry.get("file") != digests[student]:
            found.ignored += 1  # another file under this learner id: graded afresh
            continue
        if entry["event"] == "started":
            started.setdefault(run, set()).add(student)
            continue
        try:
            row = Graded(**{k: v for k, v in entry["row"].items() if k in fields})
        except (TypeError, KeyError, AttributeError):
            found.ignored += 1
            continue
        if row.student != student:
            found.ignored += 1
            continue
        found.rows[student] = row
        started.get(run, set()).discard(student)
    for student in sorted(digests):
        if student in found.rows:
            continue
        runs = [run for run, flying in started.items() if student in flying]
        if not runs:
            continue
        killed_alone = any(run not in caught and len(started[run]) == 1 for run in runs)
        if killed_alone or len(runs) >= 2:
            found.stopped[student] = Graded(student=student, status=STOPPED, notes=[STOPPED_NOTE])
        else:
            found.alone.append(student)
    return found


def stopped_row(row: Graded, content: str | None, lessons: dict[str, Lesson]) -> Graded:
    """``row`` (status "grader stopped") with its lesson and 0 for each of its exercises, found from
    the notebook's text without running it."""
    import nbformat

    from .lessons import match_lesson

    try:
        lid = match_lesson(nbformat.reads(content or "", as_version=4), lessons)
    except Exception:  # noqa: BLE001 (not a notebook: the row keeps no lesson)
        lid = None
    if lid:
        row.lesson = lid
        message = ("The grader stopped while your notebook ran (its code may have stopped it), so it was not "
                   "checked; it is graded 0.")
        row.results = {key: {"outcome": "not checked", "message": message, "mistake": ""}
                       for key in lessons[lid].keys}
    return row


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22), None if it is
    gone or a zombie: with the pid, it names one process (a pid is reused, not with its start)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else fields[19].decode()


def _runs(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (without /proc: whether
    any process ``pid`` runs)."""
    if os.path.isdir("/proc/self"):
        return bool(started) and _start_time(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def claim_scratch_root(root: str) -> None:
    """Write the run's owner (this pid and its start time) into its scratch root."""
    (Path(root) / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or ''}\n", encoding="utf-8")


def remove_stale(base: str | None = None) -> list[str]:
    """Remove the scratch roots (``grade-run-*`` in ``base``, default TMPDIR) of grading runs that
    died, and their socket folders (``grade-ipc-*`` in /tmp and /dev/shm); return what was removed.
    A root is stale when its owner file names a pid that no longer runs, or runs with another start
    time; a root without an owner file (an older grader's, or one being made) or of another user is
    kept."""
    base = base or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed = []
    for root in sorted(Path(base).glob("grade-run-*")):
        try:
            if (uid is not None and root.stat().st_uid != uid) or not root.is_dir():
                continue
            pid, _, started = (root / OWNER_FILE).read_text(encoding="utf-8").strip().partition(" ")
        except OSError:
            continue
        if pid.isdigit() and _runs(int(pid), started):
            continue
        shutil.rmtree(root, ignore_errors=True)
        removed.append(str(root))
    for socket_base in ("/tmp", "/dev/shm"):
        for folder in Path(socket_base).glob("grade-ipc-*"):
            try:
                if uid is not None and folder.stat().st_uid != uid:
                    continue
                owner = (folder / "scratch").read_text(encoding="utf-8").strip()
            except OSError:
                continue
            if owner in removed or (Path(owner).name.startswith("grade-run-") and not Path(owner).exists()):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(str(folder))
    return removed
