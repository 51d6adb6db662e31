"""Start N processes joined in one gloo process group, run a function on each, always end them (lesson 14).

    results = run_on_ranks(fn, world_size=2, args=(batch,), timeout=30)   # [fn(0, 2, batch), fn(1, 2, batch)]

``fn(rank, world_size, *args)`` runs in ``world_size`` new processes, each with
``torch.distributed`` initialised (backend gloo, CPU) and one thread, and returns what each rank
returned, in rank order (anything ``torch.save`` can store: tensors, numbers, lists, dicts).

What the house rule asks (whatever starts processes ends them, even when something fails):

- **No port for the rendezvous.** The ranks find each other through a ``FileStore``, a file in a
  temporary folder, instead of a TCP store on a port. (Gloo's own connections between the ranks are
  sockets of the worker processes; they close when the processes end.)
- **Every process ends.** The parent waits at most ``timeout`` seconds; when a rank fails, the others
  get at most ``SETTLE_SECONDS`` (5 s) to end too (a rank waiting for the failed one in a collective
  fails within milliseconds), then are stopped rather than left waiting in a collective that will
  never complete; and a ``finally`` terminates (then kills) every child still alive, whatever
  happened: an error, a time limit, the learner pressing stop. The temporary folder is removed.
- **A crashed rank cannot hang the others.** Every collective has a deadline (``init_process_group``'s
  ``timeout``), and the parent's own deadline stops everything in any case.
- **The cause is reported, whatever order the ranks die in.** When rank 1 raises, rank 0, waiting
  for it in an ``all_reduce``, fails too ("Connection closed by peer"), and either may end first.
  The parent waits for every rank's outcome (the bounded wait above), then names a rank that raised
  an error of its own (or crashed) before a rank that failed only because a peer was gone; among
  equals, the lowest rank.

**Notebooks.** A function defined in a notebook cannot be pickled, so the ``spawn`` start method
(a fresh interpreter) cannot import it. On Linux (JupyterLab, Colab) the children are *forked*: they
start as copies of the kernel and see every name the notebook defined, and gloo on CPU is safe to
use from a forked child because the parent never initialises a process group itself. Elsewhere
(macOS, Windows) the ``spawn`` method is used, and a function that lives in ``__main__`` (a notebook
cell) is written with its source into a temporary module that the children import; it may then use
only the names of ``PRELUDE`` and its own imports.
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["run_on_ranks", "run_command", "RankFailed", "RanksTimedOut", "default_start_method", "PRELUDE"]

# After the first rank fails: how long the others get to end and report their own outcome before
# they are stopped (they usually end within milliseconds: a collective with a dead peer fails).
SETTLE_SECONDS = 5.0

# What a notebook function sees when it is written to a module (the spawn start method).
PRELUDE = ("import math\nimport torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\n"
           "from torch import nn\n")


class RankFailed(RuntimeError):
    """A rank raised an error (its type, message and traceback are in the message) or died."""


class RanksTimedOut(RuntimeError):
    """The ranks did not all finish in time; every one of them was stopped."""


def default_start_method() -> str:
    """``fork`` where it is safe and available (Linux), else ``spawn``."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


def _worker(fn: Callable[..., Any], rank: int, world_size: int, args: Sequence[Any], folder: str,
            collective_timeout: float, threads: int, module_file: str | None) -> None:
    """One rank: join the group through the FileStore, run ``fn``, store its result or its error."""
    out = os.path.join(folder, f"rank{rank}.pt")
    try:
        torch.set_num_threads(threads)
        if module_file is not None:  # spawn: import the notebook's functions from their source
            import importlib.util

            spec = importlib.util.spec_from_file_location("_course_rank_function", module_file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            fn = getattr(module, fn.name) if isinstance(fn, _FromSource) else fn
            args = [getattr(module, a.name) if isinstance(a, _FromSource) else a for a in args]
        store = dist.FileStore(os.path.join(folder, "store"), world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout))
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        _save_record({"ok": True, "result": result}, out)
    except BaseException as err:  # noqa: BLE001 (report every failure to the parent)
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        try:
            _save_record({"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": text}, out)
        finally:
            os._exit(1)


# What a rank's error says when it failed only because a peer had ended: gloo's transport errors
# ("[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer", "Read error ...: Connection
# reset by peer", "Broken pipe", "Timed out waiting ... for recv operation"), its connectFullMesh
# during init_process_group, and the store's time-out when a rank never joined.
_PEER_GONE = ("by peer", "gloo/transport", "gloo\\transport", "connectfullmesh", "broken pipe",
              "connection refused", "timed out", "socket timeout")


def _peer_gone(error: str) -> bool:
    """The rank failed only because a peer had ended (its connection closed, a collective or the
    rendezvous timed out), not with an error of its own (a learner's ValueError, or gloo refusing
    an operation it does not support)."""
    low = error.lower()
    return any(words in low for words in _PEER_GONE)


def _without_record(exitcode: int) -> str:
    """What a rank that wrote no record did: a crash, a signal, ``os._exit``."""
    if exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (a crash, the out-of-memory killer, a C++ abort)"
    return f"ended with exit code {exitcode} and no Python error (a crash, os._exit, sys.exit)"


class _FromSource:
    """Stands for a notebook function (or class) that the children import from the written module."""

    def __init__(self, name: str) -> None:
        self.name = name


def _in_main(obj: Any) -> bool:
    return callable(obj) and getattr(obj, "__module__", None) == "__main__"


def _module_for(objects: Sequence[Any], folder: str) -> str:
    """Write the sources of notebook functions and classes below ``PRELUDE`` into a module; return
    its path (the ``spawn`` start method: a notebook's names cannot be pickled)."""
    sources = []
    for obj in objects:
        try:
            sources.append(textwrap.dedent(inspect.getsource(obj)))
        except (OSError, TypeError) as err:
            raise RankFailed(f"run_on_ranks: the source of {obj.__name__} cannot be read ({err}); "
                             "define it in a module, or run on Linux (fork)") from err
    path = os.path.join(folder, "_course_rank_function.py")
    with open(path, "w", encoding="utf-8") as file:
        file.write(PRELUDE + "\n\n" + "\n\n".join(sources))
    return path


def _save_record(record: dict[str, Any], out: str) -> None:
    """Write a rank's result or error whole, then rename it into place: the parent may read the
    folder while a rank that is still running writes (a peer's failure reaches it in a collective)."""
    torch.save(record, out + ".part")
    os.replace(out + ".part", out)


def _load_record(out: str) -> dict[str, Any] | None:
    """A rank's record, or None if it wrote none (yet)."""
    if not os.path.exists(out):
        return None
    try:
        return torch.load(out, weights_only=False)
    except Exception:  # noqa: BLE001 (a rank killed while it wrote: no record)
        return None


def run_on_ranks(fn: Callable[..., Any], world_size: int = 2, args: Sequence[Any] = (), *,
                 timeout: float = 60.0, threads: int = 1, start_method: str | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; return their results.

    Raises ``RankFailed`` (naming the rank and its error) if a rank raised or died, and
    ``RanksTimedOut`` if they did not all finish within ``timeout`` seconds. After a failure the
    others get at most ``SETTLE_SECONDS`` to end; the message's first line names a rank that raised
    an error of its own (or crashed) before one that failed only because a peer was gone. In every
    case, every process started here has ended when this function returns or raises.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run_on_ranks: world_size must be an int >= 1, got {world_size!r}")
    if not callable(fn):
        raise TypeError(f"run_on_ranks: fn must be a function fn(rank, world_size, ...), got {fn!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"run_on_ranks: timeout must be a number of seconds > 0, got {timeout!r}")
    method = start_method or default_start_method()
    ctx = mp.get_context(method)
    folder = tempfile.mkdtemp(prefix="course_ranks_")
    processes: list[Any] = []
    try:
        target: Any = fn
        module_file = None
        if method != "fork" and any(_in_main(o) for o in (fn, *args)):
            module_file = _module_for([o for o in (fn, *args) if _in_main(o)], folder)
            target = _FromSource(fn.__name__) if _in_main(fn) else fn
            args = [_FromSource(a.__name__) if _in_main(a) else a for a in args]
        for rank in range(world_size):
            p = ctx.Process(target=_worker, name=f"rank{rank}", daemon=True,
                            args=(target, rank, world_size, tuple(args), folder, timeout, threads,
                                  module_file))
            p.start()
            processes.append(p)
        deadline = time.monotonic() + timeout
        settled = None  # after the first failure: until when the others may still report
        while any(p.is_alive() for p in processes):
            now = time.monotonic()
            if settled is None and any(p.exitcode not in (None, 0) for p in processes):
                # The others may be failing because of it (a collective with a dead peer), or on
                # their own: wait for their outcomes (bounded), so that the cause is named, not the
                # rank that happened to end first.
                settled = now + SETTLE_SECONDS
            if settled is not None:
                if now > settled:
                    break  # still running: they are stopped in the finally below
            elif now > deadline:
                waiting = [r for r, p in enumerate(processes) if p.is_alive()]
                raise RanksTimedOut(
                    f"rank(s) {waiting} of {world_size} did not finish within {timeout:g} s and were "
                    "stopped. Does every rank call the same collectives (all_reduce, broadcast, ...) in "
                    "the same order, and does every loop end?")
            time.sleep(0.005)
        results, errors = [], []
        for rank, p in enumerate(processes):
            out = os.path.join(folder, f"rank{rank}.pt")
            record = _load_record(out)
            if record is not None and record["ok"] and p.exitcode in (None, 0):
                results.append(record["result"])
            elif record is not None and not record["ok"]:
                errors.append((rank, record["error"], record["traceback"], f"raised {record['error']}"))
            elif p.exitcode not in (None, 0):
                errors.append((rank, "", "", _without_record(p.exitcode)))
        if errors:
            # A rank whose peer died reports a broken connection: name the rank that caused it first
            # (its own error, or a crash), then the lowest rank.
            errors.sort(key=lambda e: (_peer_gone(e[1]), e[0]))
            rank, error, text, what = errors[0]
            if _peer_gone(error):
                done = [r for r in range(world_size) if r not in {e[0] for e in errors}]
                raise RankFailed(
                    f"rank {rank} waited in a collective (all_reduce, broadcast, ...) that rank(s) "
                    f"{done or 'the others'} never reached: they finished or stopped first. Every rank "
                    "must call the same collectives in the same order.")
            last = "\n".join(text.strip().splitlines()[-12:])
            others = "".join(f"\nrank {r} {w}" for r, e, _, w in errors[1:] if not _peer_gone(e))
            raise RankFailed(f"rank {rank} {what}{others}\n{last}".rstrip())
        if len(results) != world_size:
            raise RankFailed("a rank stopped without a result; the others were stopped")
        return results
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
            p.close() if not p.is_alive() else None
        shutil.rmtree(folder, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux: read from /proc; elsewhere psutil if it is installed)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # no psutil, or the process is gone
        pass
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as file:
                    ppid = int(file.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _end_tree(process: "subprocess.Popen[str]") -> None:
    """End ``process`` and every process below it: torchrun starts its workers in sessions of their
    own, so killing torchrun's process group alone would leave them running. SIGTERM first (torchrun
    then stops its workers itself), SIGKILL for whatever is left after 5 s."""
    import signal

    tree = _descendants(process.pid)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except Exception:  # noqa: BLE001 (still running: killed below)
            pass
    for pid in tree + [process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(5)


def run_command(command: Sequence[str], timeout: float = 600.0) -> "subprocess.CompletedProcess[str]":
    """Run ``command`` (e.g. ``torchrun ...``) in a session of its own and return its output; raise
    ``RankFailed`` with the end of its error output if it fails. Every process of that session
    (torchrun and its workers) is ended in a ``finally``, also on a time-out or an interrupt:
    killing torchrun alone would leave its workers running."""
    import subprocess

    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RanksTimedOut(f"{' '.join(command[:3])} ... did not finish within {timeout:g} s and was "
                            "stopped") from None
    finally:
        _end_tree(process)
    if process.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise RankFailed(f"the command ended with exit code {process.returncode}:\n{tail}")
    return subprocess.CompletedProcess(list(command), process.returncode, out, err)
