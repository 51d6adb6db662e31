"""Grade a class's notebooks: ``python -m course_lib.grading --out DIR SUBMISSION.ipynb [...]``.

    python -m course_lib.grading --out build/grades submissions/*.ipynb
    python -m course_lib.grading --out build/grades --timeout 60 --workers 2 submissions/
    python -m course_lib.grading --out build/grades --sandbox none submissions/   (no bubblewrap)
    python -m course_lib.grading --out build/grades --roster roster.csv --points 00.gradient=2 submissions/
    python -m course_lib.grading --out build/shard2 --shard 2/3 submissions/   (then course_lib.grading.merge)

Each submission (a notebook, or every file of a folder) runs in its own fresh kernel, in a scratch
copy of its lesson's folder, with a time limit per cell and per notebook and a memory limit, and
(``--sandbox auto``, the default, where bubblewrap works) in a bwrap sandbox; then the grader re-runs
every checker itself on the learner's objects. The first line printed says whether a sandbox is
used. The file name's stem is the learner's id; the lesson is recognised from the notebook's content.
Writes DIR/grades.csv, DIR/grades_NN.csv per lesson, DIR/report.html, DIR/feedback/<student>.html
and DIR/rows.json (for merging shards); with --roster (or --canvas-assignment) DIR/grades_canvas_NN.csv,
with --moodle-id DIR/grades_moodle_NN.csv (only the latter for a Moodle roster, which has none of
Canvas's columns). While it runs, DIR/journal.jsonl holds every finished row: a run killed midway
(without the sandbox, a kernel can kill it) is finished by the same command again (journal.py).
See docs/instructors.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from . import platforms
from .journal import (
    STOPPED,
    Journal,
    claim_scratch_root,
    record_finished,
    remove_stale,
    resume,
    settings_key,
    stopped_row,
    submission_digest,
)
from .integrity import COURSE_CHANGED, NOT_GRADED, RESTORE, course_digest, not_graded_row, refusal
from .lessons import Lesson, read_lessons
from .report import write_all
from .roster import match
from .runner import (
    MAX_NOTEBOOK_MB,
    RECHECK_SECONDS,
    Graded,
    Settings,
    become_subreaper,
    configure_worker,
    descendants,
    end_processes,
    grade_submission,
    needed_under_tmp,
    read_notebook,
    socket_root,
)
from .shards import parse_shard, shard_of, write_rows

__all__ = ["main", "grade_all", "write_outputs", "cores", "choose_sandbox"]


def _submissions(args: list[str]) -> list[Path]:
    paths: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            paths += sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            paths.append(path)
        else:
            raise SystemExit(f"grade: {arg} does not exist")
    stems: dict[str, Path] = {}
    for p in paths:
        if p.stem in stems:
            raise SystemExit(f"grade: two submissions have the learner id {p.stem!r}: {stems[p.stem]} and "
                             f"{p}. A file's stem is the learner's id; rename one.")
        stems[p.stem] = p
    if not paths:
        raise SystemExit("grade: no submissions given")
    return paths


def cores() -> int:
    """The cores this process may run on (its affinity), the default number of workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def choose_sandbox(choice: str) -> tuple[str, str]:
    """("bwrap" or "none", the line that says so)."""
    found = shutil.which("bwrap")
    works = False
    if found and sys.platform.startswith("linux"):
        try:
            # the kernel's own start, as the sandbox will run it: this Python, importing course_lib
            binds = [arg for path in needed_under_tmp() for arg in ("--ro-bind", path, path)]
            probe = [found, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                     *binds, "--unshare-net", "--unshare-pid", "--die-with-parent",
                     sys.executable, "-c", "import course_lib"]
            works = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            works = False
    if choice == "bwrap" and not works:
        raise SystemExit("grade: --sandbox bwrap, but bubblewrap (bwrap) is missing or cannot run here "
                         "(Debian/Ubuntu: apt-get install bubblewrap)")
    if choice == "none" or not works:
        why = "--sandbox none" if choice == "none" else "bubblewrap (bwrap) is not available here"
        return "none", (f"grade: NO SANDBOX ({why}): each kernel runs as you, with your files and network, "
                        "and can kill the grader: then run the same command again, it resumes (nothing is "
                        "lost or left running); see docs/instructors.md")
    return "bwrap", ("grade: sandbox bwrap: each kernel sees the file system read-only, its own scratch "
                     "folder, a private /tmp, no network, no other process")


def grade_all(paths: list[Path], settings: Settings, workers: int,
              contents: dict[Path, str] | None = None, sizes: dict[Path, int] | None = None) -> list[Graded]:
    """Grade every submission, ``workers`` at a time, each worker in its own process. A worker lost
    on the way (killed from a kernel) costs only the rows it was grading: they are tried once more,
    one at a time, then get the status "grader error". ``contents``: the files' texts, read before
    any kernel started; ``sizes``: the sizes of those too large to read. Each row is written to
    ``settings.journal`` as it comes in. The workers die with this process (``die_with_parent``).

    If course_lib changes on disk (``settings.course_digest``, integrity.py), the batch stops: what
    has not started is not run, and every row not finished before the change has the status
    "course changed" (0: the kernel that ran while it changed; in the journal only if it ran alone,
    else it is graded again, alone, by the next run) or "not graded" (not in the journal)."""
    rows: dict[Path, Graded] = {}
    start = time.monotonic()
    stopped: list[str] = []  # the stop's one line, once

    def done(path: Path, row: Graded, record: bool = True) -> None:
        rows[path] = row
        if record:
            record_finished(settings.journal, row,
                            submission_digest((contents or {}).get(path), (sizes or {}).get(path)))
        marks = row.marks()
        left = len(paths) - len(rows)
        spent = time.monotonic() - start
        eta = f", about {spent / len(rows) * left:.0f} s left" if left and not stopped else ""
        print(f"[{len(rows)}/{len(paths)}{eta}] {row.student}: lesson {row.lesson or '?'}, "
              f"{sum(marks.values())} of {len(marks)} passed, {row.status} ({row.seconds:.0f} s)", flush=True)

    def stop(row: Graded) -> None:
        if not stopped:
            last = [r.student for r in rows.values() if r.status not in (COURSE_CHANGED, NOT_GRADED)]
            when = (f"while {row.student} was graded" if row.status == COURSE_CHANGED else
                    f"before {row.student} started" + (f", after {last[-1]} finished" if last else ""))
            stopped.append(when)
            print(f"grade: STOPPED: course_lib's files changed on disk {when}; nothing more is run", flush=True)

    def run(batch: list[Path], n: int) -> list[Path]:
        lost = []
        alone = dataclasses.replace(settings, alone=n == 1 or len(batch) == 1)
        with ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=configure_worker,
                                 initargs=(settings.threads, os.getpid())) as pool:
            futures = {pool.submit(grade_submission, p, alone, None, (contents or {}).get(p),
                                   (sizes or {}).get(p)): p for p in batch}
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                try:
                    row = future.result()
                except Exception:  # noqa: BLE001 (a worker killed under a submission: BrokenProcessPool)
                    lost.append(futures[future])
                    continue
                if row.status in (COURSE_CHANGED, NOT_GRADED):
                    stop(row)
                    for other in futures:  # those not started yet are not run
                        other.cancel()
                # a suspect's 0 is kept only if it ran alone; one not run is graded by the next run
                done(futures[future], row, record=row.status != NOT_GRADED
                     and (row.status != COURSE_CHANGED or alone.alone))
        end_processes(set())  # what a killed worker's kernels left behind was re-parented to us
        return lost

    lost = run(paths, workers)
    for path in lost:  # alone, so that one submission's sabotage cannot cost another its row
        for again in ([] if stopped else run([path], 1)):
            row = Graded(student=again.stem, status="grader error",
                         notes=["the grader's worker was killed while grading it, twice"])
            done(again, row)
    lessons = read_lessons() if len(rows) < len(paths) else {}
    for path in paths:  # not run: course_lib changed
        if path not in rows:
            done(path, not_graded_row(Graded(student=path.stem), _lesson_of((contents or {}).get(path), lessons),
                                      stopped[0]), record=False)
    return [rows[p] for p in paths]


def _lesson_of(content: str | None, lessons: dict[str, Lesson]) -> Lesson | None:
    """The lesson a notebook's text is, found without running it (None: not a notebook of the course)."""
    import nbformat

    from .lessons import match_lesson

    try:
        lid = match_lesson(nbformat.reads(content or "", as_version=4), lessons)
    except Exception:  # noqa: BLE001
        return None
    return lessons.get(lid) if lid else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for grades.csv, report.html, feedback/")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--notebook-timeout", type=float, default=3600,
                        help="seconds per notebook: no cell starts later (default 3600)")
    parser.add_argument("--workers", type=int, default=cores(), help="notebooks at a time (default: one per core)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="address-space limit per kernel (default: the machine's RAM / workers)")
    parser.add_argument("--recheck-timeout", type=float, default=RECHECK_SECONDS,
                        help="seconds for the grader's re-check of a notebook, all its exercises together (or "
                             "--timeout times their number, if less); each exercise gets at most --timeout "
                             f"(default {RECHECK_SECONDS:g})")
    parser.add_argument("--max-notebook-mb", type=float, default=MAX_NOTEBOOK_MB,
                        help="a larger notebook is not read: status 'too large', 0 marks "
                             f"(default {MAX_NOTEBOOK_MB:g})")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto",
                        help="run each kernel in a bubblewrap sandbox (auto: where bwrap works)")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="grade only the K-th of N shares of the class (decided by the learner ids); "
                             "merge the N output folders with python -m course_lib.grading.merge")
    platforms.add_arguments(parser)
    parser.add_argument("submissions", nargs="+", help="notebooks, or folders of them")
    args = parser.parse_args(argv)
    for option, value in (("--max-notebook-mb", args.max_notebook_mb), ("--recheck-timeout", args.recheck_timeout)):
        if not value > 0:
            parser.error(f"{option} {value:g}: give a number above 0")
    lessons = read_lessons()
    try:  # bad options stop here, before any kernel starts, with what to fix (exit code 2)
        shard = parse_shard(args.shard) if args.shard else None
        platform = platforms.from_arguments(args, lessons)
    except ValueError as err:
        parser.error(str(err))
    try:
        everyone = _submissions(args.submissions)
        if platform.roster is not None:
            match(platform.roster, [p.stem for p in everyone])  # two files for one roster learner: stop now
    except SystemExit as err:  # a missing file, two files with one learner id: what to fix, exit code 2
        parser.exit(2, f"{err}\n")
    except ValueError as err:
        parser.error(str(err))
    mode, line = choose_sandbox(args.sandbox)
    print(line, flush=True)
    paths = everyone
    if shard:
        mine = shard_of([p.stem for p in everyone], *shard)
        paths = [p for p in everyone if p.stem in mine]
        print(f"grade: shard {shard[0]}/{shard[1]}: {len(paths)} of the class's {len(everyone)} submissions",
              flush=True)
    # every submission is read now, before any learner's code runs: a kernel cannot swap another's;
    # one larger than --max-notebook-mb is not read at all (its row says "too large")
    max_bytes = int(args.max_notebook_mb * 2**20)
    contents, sizes = {}, {}
    for path in paths:
        try:
            text, size = read_notebook(path, max_bytes)
        except OSError as err:
            text, size = f"unreadable: {err}", 0
        if text is None:
            sizes[path] = size
        else:
            contents[path] = text
    workers = max(1, min(args.workers, max(1, len(paths))))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = int(args.memory_gb * 2**30) if args.memory_gb else max(4 * 2**30, ram // workers)
    hidden = sorted({str(p.resolve().parent) for p in paths if not _holds_course(p.resolve().parent)}
                    | {str(p.resolve()) for p in paths} | {str(args.out.resolve())})
    settings = Settings(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                        recheck_timeout=args.recheck_timeout,
                        memory_bytes=memory, threads=max(1, cores() // workers), sandbox=mode,
                        hidden=hidden, max_notebook_bytes=max_bytes,
                        seed=secrets.randbits(30))  # the re-check's seeds: one fresh draw per batch
    # course_lib as this run found it: checked before and after each submission (integrity.py)
    settings.course_digest = course_digest()
    # The journal (journal.py): what an earlier run of these settings finished is not graded again
    key = settings_key(settings, lessons)
    journal = Journal(args.out, key)
    digests = {p.stem: submission_digest(contents.get(p), sizes.get(p)) for p in paths}
    try:
        entries = journal.open()
        refused = refusal(entries, settings.course_digest, journal.path)
        if refused:
            journal.close(remove=False)
            parser.exit(2, f"grade: {refused}\n")
        earlier = resume(entries, key, digests)
    except (RuntimeError, OSError) as err:
        parser.exit(2, f"grade: {err}\n")
    settings.journal = journal.for_workers()
    rows_of: dict[str, Graded] = dict(earlier.rows)
    for stem, row in earlier.stopped.items():
        path = next(p for p in paths if p.stem == stem)
        rows_of[stem] = stopped_row(row, contents.get(path), lessons)
        record_finished(settings.journal, rows_of[stem], digests[stem])
    note = ""
    if earlier.rows or earlier.stopped or earlier.alone:
        note = (f"resumed: {len(earlier.rows)} row(s) taken from the journal of an earlier run that stopped "
                "(not graded again)"
                + (f"; {len(earlier.stopped)} not run again, status '{STOPPED}' (the grader stopped while "
                   f"grading it): {', '.join(sorted(earlier.stopped))}" if earlier.stopped else "")
                + (f"; {len(earlier.alone)} graded again, alone first (in flight when it stopped): "
                   f"{', '.join(earlier.alone)}" if earlier.alone else ""))
        print(f"grade: {note}", flush=True)
    if earlier.ignored:
        print(f"grade: {earlier.ignored} line(s) of an earlier run's journal were for other settings (limits, "
              "sandbox, the course's code) or other files: not used, those are graded afresh", flush=True)
    todo = [p for p in paths if p.stem not in rows_of]
    alone = [p for p in todo if p.stem in earlier.alone]
    rest = [p for p in todo if p.stem not in earlier.alone]
    removed = remove_stale()  # the scratch folders of grading runs that died (never a live run's)
    if removed:
        print(f"grade: removed {len(removed)} scratch or socket folder(s) of grading runs that died", flush=True)
    scratch_root = tempfile.mkdtemp(prefix="grade-run-")
    os.chmod(scratch_root, 0o700)
    claim_scratch_root(scratch_root)  # whose it is: the next run removes it if this one is killed
    sockets = socket_root(scratch_root)  # None unless TMPDIR is too long for a socket's address
    settings.scratch_root, settings.socket_root = scratch_root, sockets
    start = time.monotonic()
    already = set(descendants(os.getpid()))  # (a caller's own processes, e.g. a test runner's)
    become_subreaper()
    # the command line's Ctrl-C, SIGTERM, SIGHUP: say so in the journal, end everything, exit
    handlers = _stop_on_signals(journal, already, [scratch_root, sockets]) if argv is None else {}
    try:
        for batch, n in ((alone, 1), (rest, workers)):  # the suspects of a run that stopped: one at a time
            halted = [r for r in rows_of.values()
                      if r.status in (COURSE_CHANGED, NOT_GRADED) and r.student not in earlier.rows]
            if batch and halted:  # course_lib changed in the first batch: the second is not run
                after = (f"while {halted[0].student} was graded" if halted[0].status == COURSE_CHANGED
                         else "before the rest started")
                rows_of.update((p.stem, not_graded_row(Graded(student=p.stem), _lesson_of(contents.get(p), lessons),
                                                       after)) for p in batch)
            elif batch:
                rows_of.update((r.student, r) for r in grade_all(batch, settings, n, contents, sizes))
    except BaseException:
        journal.close(remove=False)  # kept: the same command again resumes
        raise
    finally:  # here, not in the workers: a worker killed mid-run removes nothing
        _restore(handlers)
        # a worker's leftovers (bwrap around a kernel) are this process's now: end and reap them,
        # or they stay as zombies of whoever called main()
        end_processes(already)
        shutil.rmtree(scratch_root, ignore_errors=True)
        if sockets:
            shutil.rmtree(sockets, ignore_errors=True)
    rows = [rows_of[p.stem] for p in paths]
    changed = [r.student for r in rows if r.status == COURSE_CHANGED and r.student not in earlier.rows]
    stopped = bool(changed) or any(r.status == NOT_GRADED for r in rows)
    if stopped:  # the same command refuses to resume until course_lib is as this run found it
        journal.write({"event": COURSE_CHANGED, "expected": settings.course_digest,
                       "after": changed or ["between two submissions"]})
        during = f"while {', '.join(changed)} {'was' if len(changed) == 1 else 'were'} graded" if changed \
            else "between two submissions"
        halt = (f"STOPPED: course_lib's files changed on disk during this run ({during}); the rows graded "
                f"before are kept, the rest are 'not graded': {RESTORE}")
        note = "; ".join(filter(None, [note, halt]))
    graded = sum(r.status == "graded" for r in rows)
    print(f"grade: {len(rows)} submissions ({graded} graded cleanly) in {time.monotonic() - start:.0f} s on "
          f"{workers} worker(s), sandbox {mode}")
    for written in write_outputs(args.out, rows, lessons, line, platform, shard, [p.stem for p in everyone],
                                 note):
        print(f"grade: {written}", flush=True)
    if stopped:
        journal.close(remove=False)
        print(f"grade: {halt}", flush=True)
        return 3
    journal.close(remove=True)  # every file is written: nothing to resume
    return 0


_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _stop_on_signals(journal: Journal, keep: set[int], folders: list[str | None]) -> dict[int, object]:
    """On SIGINT, SIGTERM or SIGHUP: say so in the journal (what was in flight is then graded again by
    the next run, not given 0), end the workers and kernels, remove ``folders`` and exit now (unwinding
    through the worker pool would wait for the submissions in flight). Returns the handlers to put
    back (none off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: object) -> None:
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # once: the clean-up below is not interrupted
        name = signal.Signals(signum).name
        try:
            journal.write({"event": "caught", "signal": name})
        except OSError:
            pass
        end_processes(keep)
        for folder in folders:
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        journal.close(remove=False)
        print(f"grade: stopped by {name}; run the same command again to finish (what was graded is kept in "
              f"{journal.path})", flush=True)
        os._exit(128 + signum)

    return {sig: signal.signal(sig, stop) for sig in _SIGNALS}


def _restore(handlers: dict[int, object]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def write_outputs(out: Path, rows: list[Graded], lessons: dict, sandbox: str, platform: platforms.Platform,
                  shard: tuple[int, int] | None, class_stems: list[str], note: str = "") -> list[str]:
    """Every file of a run (a shard writes no platform files and no roster lists: it holds only
    part of the class; the merge writes them); returns the log's lines. ``merge`` calls it too.
    ``note``: a line for the top of report.html (rows resumed from a journal)."""
    write_rows(out, rows, class_stems, shard, sandbox, platform.record())
    matched = None if shard else platforms.roster_match(platform, rows)
    key = platform.roster.key if platform.roster else ""
    write_all(out, rows, lessons, sandbox=sandbox, points=platform.points, matched=matched, key=key, note=note)
    lines = platforms.roster_lines(matched, key)
    written = ["grades.csv", "grades_NN.csv", "report.html", "feedback/", "rows.json"]
    if shard:
        lines.append(f"shard {shard[0]}/{shard[1]}: platform files and roster lists are written by "
                     "python -m course_lib.grading.merge --out DIR SHARD_DIR...")
    else:
        written += platforms.write_platform(out, rows, lessons, platform, matched)
    lines.append(f"wrote {out}/: " + ", ".join(written))
    return lines


def _holds_course(folder: Path) -> bool:
    """True if hiding ``folder`` would hide the course or Python itself from the kernel."""
    needed = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(), Path(sys.executable).resolve()]
    return any(folder == p or folder in p.parents for p in needed)
