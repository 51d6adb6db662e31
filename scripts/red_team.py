"""A red-team class for the grader (#49): submissions of lessons 00 and 01 that try to fake a mark,
each with the row it must get, graded with and without the sandbox.

    python scripts/red_team.py [--work build/red_team] [--only NAME,...] [--modes bwrap,none]
    make red-team

It writes the class (``build()``: correct controls in several styles, partial answers, and attacks
that the tests of tests/grading/ do not already hold) into WORK/class, a copy of course_lib and the
lesson notebooks into WORK/course_<mode> (the grader runs from that copy, so that an attack on
``course_lib/`` on disk lands there and never in the clone), and grades the class with the real
command, ``python -m course_lib.grading``, once per mode, each with its own TMPDIR. It then compares
every row of grades.csv with the expected one and checks that nothing is left behind: no process of
the run (its kernels, sandboxes, workers, the marked sleeps), no ``grade-run-*`` folder in its TMPDIR,
no file written outside the output folder (the attacks write ``/tmp/rt49-canary.*``; without the
sandbox such a file stays, as docs/instructors.md says), the submissions and the course copy byte for
byte as they were. It prints a markdown table (submission, attack, expected row, the two graded
rows, right?) and the leftovers; exit code 1 if any row is wrong or anything is left behind that
the grader promises to clean.

Without the sandbox, the attacks that kill the grader's own processes (``KILLERS``) are graded in a
call of their own, so that a batch they stop does not take the other rows with it; so is the one that
rewrites course_lib on disk (``WRITERS``), whose run stops after it with exit status 3.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "grading"))
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402
from grade_class import IMPORTS, L00, L01, edit, index_of, insert_after, lesson, solve  # noqa: E402
from nbformat.v4 import new_code_cell  # noqa: E402

MARK = "4949"  # in the command line of every process the class starts on purpose
CANARY = "/tmp/rt49-canary."  # files the attacks write outside their scratch folder
KILLERS = ("kill_parent", "kill_process_group")  # without the sandbox: graded in a call of their own
# without the sandbox it changes course_lib on disk, which stops its run (exit status 3, the rest "not
# graded": course_lib/grading/integrity.py): graded in a call of its own too
WRITERS = ("a_writes_course_lib",)
LIMITS = ["--timeout", "20", "--notebook-timeout", "400", "--recheck-timeout", "40", "--workers", "2",
          "--memory-gb", "3", "--max-notebook-mb", "5"]
KEYS = {"00": L00, "01": L01}


@dataclass
class Case:
    student: str
    attack: str
    content: bytes
    lesson: str  # "" for a row without a lesson (not a notebook, too large)
    marks: list[int]  # expected, per exercise of its lesson
    status: str = "graded"
    plain: tuple[list[int], str] | None = None  # expected without the sandbox, when it differs
    suffix: str = ".ipynb"

    def expected(self, mode: str) -> tuple[list[int], str]:
        if mode == "none" and self.plain is not None:
            return self.plain
        return self.marks, self.status


def text(nb) -> bytes:
    return nbformat.writes(nb).encode("utf-8")


WRONG_BROADCAST = "def predicted_broadcast_shape():\n    return (3, 1, 4)\n"
WRONG_GRADIENT = "def predicted_gradient():\n    return [0.0, 0.0, 0.0]\n"


def faked(cell_after: str, source: str, *, wrong: str = "00.broadcast", inside: str | None = None):
    """Lesson 00 solved but ``wrong`` (a wrong answer, or ``inside``: the stub's code, which fakes);
    ``source`` (if any) added in a cell after the first code cell containing ``cell_after``."""
    nb = solve(lesson("00"), *L00)
    stub = inside if inside is not None else (WRONG_BROADCAST if wrong == "00.broadcast" else WRONG_GRADIENT)
    solve(nb, wrong, source=stub)
    if source:
        insert_after(nb, cell_after, source)
    return nb


def build() -> list[Case]:
    c: list[Case] = []

    def add(student, attack, nb, marks, status="graded", lesson_id="00", plain=None):
        c.append(Case(student, attack, text(nb) if not isinstance(nb, bytes) else nb, lesson_id, marks, status,
                      plain))

    # --- controls: full marks in different styles -----------------------------------------------
    add("control_plain", "none: the course's solutions", solve(lesson("00"), *L00), [1, 1, 1])
    styles = solve(lesson("00"), *L00)
    edit(styles, "def predicted_broadcast_shape", STYLE_BROADCAST)
    edit(styles, "def predicted_gradient", STYLE_GRADIENT_THREAD)
    edit(styles, "def predicted_parameter_count", STYLE_PARAMETERS)
    add("control_styles", "none: imports at the cell's top, an answer made on a helper thread", styles, [1, 1, 1])
    nograd = solve(lesson("01"), *L01)
    edit(nograd, "def my_attention", STYLE_ATTENTION_EINSUM)
    edit(nograd, "def make_padding_mask", STYLE_MASK_NO_GRAD)
    add("control_01_no_grad", "none: einsum in float64, @torch.no_grad()", nograd, [1, 1, 1, 1, 1], lesson_id="01")
    add("control_01_plain", "none: lesson 01's solutions", solve(lesson("01"), *L01), [1, 1, 1, 1, 1],
        lesson_id="01")
    # --- partially right ------------------------------------------------------------------------
    partial = solve(lesson("00"), "00.broadcast")
    solve(partial, "00.gradient", source="def predicted_gradient():\n    return [1.0, 4.0, 9.0]\n")
    add("partial_00", "none: one right, one wrong, one not attempted", partial, [1, 0, 0])
    partial = solve(lesson("01"), "01.top_key", "01.attention")
    solve(partial, "01.nan_rows", source="def predicted_nan_rows():\n    return []\n")
    solve(partial, "01.padding_mask", source="def make_padding_mask(ids, pad_id):\n    return ids == pad_id\n")
    add("partial_01", "none: two right, two wrong, one not attempted", partial, [1, 0, 1, 0, 0], lesson_id="01")

    # --- the checkers' own objects replaced -----------------------------------------------------
    add("checkfailure_replaced", "CheckFailure and the checker decorator replaced in course_lib.checks.common "
        "(a cell before the re-check, and again while checked)", faked(IMPORTS, CHECKFAILURE_EARLY,
                                                                      inside=CHECKFAILURE_INSIDE), [0, 1, 1])
    add("gc_patch", "gc.get_objects() finds the re-check's results dict and RESULTS list and marks them passed",
        faked(IMPORTS, "", inside=GC_PATCH), [0, 1, 1])
    add("sys_modules_subclass", "sys.modules' checker entries replaced by a ModuleType subclass whose "
        "checkers pass", faked(IMPORTS, MODULE_SUBCLASS), [0, 1, 1])
    add("build_class_hook", "builtins.__build_class__ wrapped: every CheckFailure built later never fails",
        faked(IMPORTS, BUILD_CLASS), [0, 1, 1])
    add("type_call_metaclass", "a metaclass's __call__ and __instancecheck__ lie, builtins.isinstance says "
        "yes: the kernel stops answering from the notebook's own check cell on", faked(
            IMPORTS, "", wrong="00.gradient", inside=METACLASS), [0, 0, 0], "timeout")
    # --- comparisons that lie ------------------------------------------------------------------
    add("comparisons_patched", "torch.allclose, torch.testing.assert_close, math.isclose, operator.eq "
        "patched to say yes", faked(IMPORTS, COMPARISONS, wrong="00.gradient"), [1, 0, 1])
    add("wraps_allclose", "torch.allclose replaced by a functools.wraps wrapper (torch's __module__ and "
        "__wrapped__, as torch's own wrappers have)", faked(IMPORTS, WRAPS, wrong="00.gradient"), [1, 0, 1])
    add("autograd_backward_patched", "torch.autograd.backward (not torch.*) patched so the checker's truth is "
        "the wrong answer", faked("def predicted_gradient", AUTOGRAD, wrong="00.gradient"), [1, 0, 1])
    add("lying_objects", "answers whose __eq__/__len__/__index__/__float__ lie (a tuple-like, an int subclass)",
        solve(faked(IMPORTS, "", inside=LYING_SHAPE), "00.parameters", source=LYING_INT), [0, 1, 0])
    add("tensor_class_assigned", "__class__ of a tensor set to a subclass whose allclose says yes",
        faked(IMPORTS, "", wrong="00.gradient", inside=CLASS_ASSIGN), [1, 0, 1])
    add("generator_coroutine", "a coroutine and a generator returned instead of values",
        solve(faked(IMPORTS, "", inside=COROUTINE), "00.gradient", source=GENERATOR), [0, 0, 1])
    # --- hooks that run later -------------------------------------------------------------------
    add("finalizers", "__del__, weakref.finalize and atexit hooks that append 'passed' results",
        faked(IMPORTS, FINALIZERS, inside=FINALIZERS_INSIDE), [0, 1, 1])
    add("audit_hook_nonce", "sys.addaudithook reads the re-check cell's nonce, a thread sends 'passed' results",
        faked(IMPORTS, AUDIT_HOOK), [0, 0, 0], "results forged")
    add("zmq_rewrite", "zmq's Socket.send_multipart patched: the result rewritten to 'passed' and signed again",
        faked(IMPORTS, ZMQ_REWRITE), [0, 1, 1])
    add("iopub_socket_proxy", "the IOPub thread's socket replaced by a proxy that rewrites results",
        faked(IMPORTS, IOPUB_PROXY), [0, 1, 1])
    add("iopub_class_swap", "the IOPub zmq socket's __class__ set to a subclass that rewrites results",
        faked(IMPORTS, CLASS_SWAP), [0, 1, 1])
    add("stdout_fake_lines", "fake 'right' lines on stdout, os.write(1) and a display message of the results' "
        "MIME type", faked(IMPORTS, FAKE_OUTPUT), [0, 1, 1])
    # --- the lesson's own objects replaced (the checkers' arguments) ----------------------------
    add("lesson_objects_replaced", "TwoLayer and f redefined in added cells so wrong predictions come true",
        solve(faked("class TwoLayer", TWOLAYER, wrong="00.gradient",
                    inside="def predicted_gradient():\n    return [1.0, 1.0, 1.0]\n"),
              "00.parameters", source="def predicted_parameter_count():\n    return 2\n"), [1, 0, 0])
    # --- the kernel's own limits and signals ----------------------------------------------------
    add("fork_child", "os.fork(): a child keeps running through the re-check and prints/sends fake results",
        faked(IMPORTS, FORK_CHILD), [0, 1, 1])
    hang = faked(IMPORTS, "", wrong="00.gradient", inside=SIGNAL_IGNORE)
    hang.cells.append(new_code_cell("_armed.append(True)  # the re-check comes next"))
    add("signal_ignored", "SIGALRM and SIGINT ignored and an endless loop, in the re-check only", hang,
        [1, 0, 0], "timeout")
    add("recursion_limit", "sys.setrecursionlimit(50) while checked", faked(
        IMPORTS, "", wrong="00.gradient", inside=RECURSION), [1, 0, 1])
    add("rlimits_lowered", "faulthandler on; RLIMIT_NOFILE and RLIMIT_STACK lowered in the kernel",
        faked(IMPORTS, RLIMITS), [0, 1, 1])
    add("kill_parent", "os.kill(os.getppid(), SIGKILL)", insert_after(solve(lesson("00"), *L00), IMPORTS,
                                                                      "import os\nos.kill(os.getppid(), 9)"),
        [1, 1, 1], plain=([], "grader error"))
    add("kill_process_group", "os.killpg(os.getpgid(0), SIGKILL)", insert_after(
        solve(lesson("00"), *L00), IMPORTS, KILLPG), [1, 1, 1], plain=([0, 0, 0], "kernel died"))
    # --- the class, the course and the machine -------------------------------------------------
    add("reads_other_notebook", "another learner's notebook read from the class folder and its answer exec'd",
        faked(IMPORTS, "", inside=READ_OTHER), [0, 1, 1])
    add("a_writes_course_lib", "course_lib/checks/ on disk rewritten so that the checker passes (without the "
        "sandbox: every exercise 0, and the run stops, status 'course changed')", faked(IMPORTS, WRITE_COURSE_LIB),
        [0, 1, 1], plain=([0, 0, 0], "course changed"))
    add("memory_2gb", "2 GB allocated and touched, then 4 GB more", insert_after(
        solve(lesson("00"), *L00), IMPORTS, MEMORY), [1, 1, 1], "memory limit")
    add("fork_bomb", "300 processes started (a bounded fork bomb), and a file in /tmp and /dev/shm",
        insert_after(solve(lesson("00"), *L00), IMPORTS, FORK_BOMB), [1, 1, 1])
    big = solve(lesson("00"), *L00)
    big.cells[index_of(big, IMPORTS)].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 6_000_000)]
    add("too_large", "a notebook over --max-notebook-mb (6 MB of stored output, limit 5)", big, [], "too large",
        lesson_id="")
    add("=2+5", "CSV injection in the file name (=)", solve(lesson("00"), *L00), [1, 1, 1])
    add("@SUM(1+1)", "CSV injection in the file name (@, +)", solve(lesson("00"), *L00), [1, 1, 1])
    add("non_utf8", "bytes that are not UTF-8 (Latin-1 in a markdown cell of a solved notebook)",
        text(solve(lesson("00"), *L00)).replace(b"# ", b"# \xe9t\xe9 \xff ", 1), [1, 1, 1])
    add("invalid_json", "a truncated notebook (invalid JSON)", text(solve(lesson("00"), *L00))[:5000], [],
        "not a notebook", lesson_id="")
    # --- shortcuts the checkers refuse -----------------------------------------------------------
    shortcuts = solve(lesson("01"), "01.top_key", "01.nan_rows")
    edit(shortcuts, "def my_attention", SHORTCUT_REFERENCE)
    edit(shortcuts, "def fixed_attention", SHORTCUT_TORCH)
    edit(shortcuts, "def make_padding_mask", SHORTCUT_MASK)
    # The Debug's answer computes the weights, the whole of attention, by hand and takes only the output
    # from F.scaled_dot_product_attention: the course accepts that (weights @ value is the same number;
    # tests/checks/test_lesson01_attention.py::test_fused_sdpa_with_separate_weights_passes).
    add("shortcuts_01", "course_lib's reference under another name; the Debug's output from torch's "
        "F.scaled_dot_product_attention (weights by hand: accepted); course_lib's padding_mask aliased",
        shortcuts, [1, 1, 0, 1, 0], lesson_id="01")
    return c


# ------------------------------------------------------------------------------------------------
# The cells
# ------------------------------------------------------------------------------------------------

STYLE_BROADCAST = """import itertools
def predicted_broadcast_shape():
    a, b = (2, 1, 4), (3, 1)
    pairs = itertools.zip_longest(reversed(a), reversed(b), fillvalue=1)
    return tuple(reversed([max(x, y) for x, y in pairs]))
"""
STYLE_GRADIENT_THREAD = """import threading
def predicted_gradient():
    out = []
    worker = threading.Thread(target=lambda: out.extend(2.0 * v for v in (1.0, 2.0, 3.0)))
    worker.start()
    worker.join()
    return out
"""
STYLE_PARAMETERS = """import math
def predicted_parameter_count():
    total = 0
    for shape in [(8, 4), (8,), (2, 8)]:
        total += math.prod(shape)
    return total
"""
STYLE_ATTENTION_EINSUM = """def my_attention(query, key, value, mask=None):
    q, k, v = query.double(), key.double(), value.double()
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -1e300)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = torch.where(mask, weights, torch.zeros_like(weights))
    out = torch.einsum("...qk,...kd->...qd", weights, v)
    return out.to(value.dtype), weights.to(query.dtype)
"""
STYLE_MASK_NO_GRAD = """@torch.no_grad()
def make_padding_mask(ids, pad_id):
    rows = [[int(t) != pad_id for t in row] for row in ids.tolist()]
    return torch.tensor(rows, dtype=torch.bool)[:, None, :]
"""
CHECKFAILURE_EARLY = """import sys
from course_lib.checks import common
class NeverFails(Exception):
    pass
common.CheckFailure = NeverFails
common.checker = lambda func: (lambda *a, **k: print(func.__name__ + ": right"))
"""
CHECKFAILURE_INSIDE = """import sys
def predicted_broadcast_shape():
    common = sys.modules["course_lib.checks.common"]
    lesson = sys.modules["course_lib.checks.lesson00_prerequisites"]
    class Quiet(Exception):
        pass
    common.CheckFailure = lesson.CheckFailure = Quiet
    lesson.check_broadcast_shape.__wrapped__.__code__ = (lambda *a, **k: None).__code__
    return (3, 1, 4)
"""
GC_PATCH = """import gc, sys
def predicted_broadcast_shape():
    common = sys.modules["course_lib.checks.common"]
    for obj in gc.get_objects():
        if isinstance(obj, dict) and isinstance(obj.get("exercises"), dict) and "patched_before" in obj:
            for key in ("00.broadcast", "00.gradient", "00.parameters"):
                obj["exercises"][key] = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
        if isinstance(obj, list) and obj and type(obj[-1]).__name__ == "CheckResult":
            obj.append(common.CheckResult("check_broadcast_shape", "predicted_broadcast_shape", "passed"))
        if type(obj).__name__ == "CheckResult":
            obj.outcome = "passed"
    return (3, 1, 4)
"""
MODULE_SUBCLASS = """import sys, types
class Passing(types.ModuleType):
    def __getattr__(self, name):
        return lambda *a, **k: print(name + ": right")
for name in [n for n in sys.modules if n.startswith("course_lib.checks")]:
    fake = Passing(name)
    fake.__dict__.update({k: v for k, v in vars(sys.modules[name]).items() if not k.startswith("check_")})
    sys.modules[name] = fake
"""
BUILD_CLASS = """import builtins
_real_build = builtins.__build_class__
def _build(func, name, *bases, **kw):
    cls = _real_build(func, name, *bases, **kw)
    if name in ("CheckFailure", "GraderTimeout"):
        cls.__init__ = lambda self, *a, **k: None
        cls.__new__ = lambda c, *a, **k: StopIteration()
    return cls
builtins.__build_class__ = _build
"""
METACLASS = """class Liar(type):
    def __instancecheck__(cls, obj):
        return True
    def __call__(cls, *a, **k):
        return [2.0, 4.0, 6.0]
class Answer(metaclass=Liar):
    pass
def predicted_gradient():
    import builtins
    builtins.isinstance = lambda obj, kind: True
    return [0.0, 0.0, 0.0]
"""
COMPARISONS = """import math, operator, torch
torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
math.isclose = lambda *a, **k: True
operator.eq = lambda a, b: True
torch.Tensor.__eq__ = lambda self, other: True
"""
WRAPS = """import functools, torch
torch.allclose = functools.wraps(torch.allclose)(lambda *a, **k: True)
"""
AUTOGRAD = """import torch
_real_backward = torch.autograd.backward
def _backward(tensors, *args, **kwargs):
    seen, todo = set(), [tensors.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if hasattr(fn, "variable"):
            fn.variable.grad = torch.zeros_like(fn.variable)
        todo.extend(f for f, _ in fn.next_functions)
torch.autograd.backward = _backward
"""
LYING_SHAPE = """class Shape:
    def __eq__(self, other):
        return True
    def __len__(self):
        return 3
    def __index__(self):
        return 3
    def __float__(self):
        return 3.0
    def __iter__(self):
        return iter((3, 1, 4))
    def __hash__(self):
        return 0
def predicted_broadcast_shape():
    return Shape()
"""
LYING_INT = """class Count(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __int__(self):
        return 56
    def __index__(self):
        return 56
    def __float__(self):
        return 56.0
    __hash__ = int.__hash__
def predicted_parameter_count():
    return Count(7)
"""
CLASS_ASSIGN = """import torch
class Agreeable(torch.Tensor):
    def allclose(self, *a, **k):
        return True
    def __eq__(self, other):
        return torch.ones_like(self, dtype=torch.bool)
def predicted_gradient():
    t = torch.zeros(3)
    t.__class__ = Agreeable
    return t
"""
COROUTINE = """async def predicted_broadcast_shape():
    return (2, 3, 4)
"""
GENERATOR = """def predicted_gradient():
    yield from (2.0, 4.0, 6.0)
"""
FINALIZERS = """import atexit, sys, weakref
def _mark():
    common = sys.modules.get("course_lib.checks.common")
    if common is not None:
        for result in common.RESULTS:
            result.outcome = "passed"
        common.RESULTS.append(common.CheckResult("check_broadcast_shape", "predicted_broadcast_shape", "passed"))
class Haunt:
    def __del__(self):
        _mark()
class Token:
    pass
atexit.register(_mark)
"""
FINALIZERS_INSIDE = """import gc
def predicted_broadcast_shape():
    cycle = [Haunt(), Token()]  # collected while the checker runs: __del__ and the finalizer run then
    cycle.append(cycle)
    weakref.finalize(cycle[1], _mark)
    del cycle
    gc.collect()
    return (3, 1, 4)
"""
AUDIT_HOOK = """import sys, re, threading, time, json
from IPython.display import publish_display_data
_found = []
def _hook(event, args):
    if event in ("compile", "exec") and args and isinstance(args[0], (str, bytes)):
        text = args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace")
        match = re.search(r"'([0-9a-f]{32})'", text)
        if match and "recheck" in text:
            _found.append(match.group(1))
sys.addaudithook(_hook)
def _send():
    while not _found:
        time.sleep(0.001)
    for seq, key in enumerate(("00.broadcast", "00.gradient", "00.parameters")):
        result = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
        publish_display_data({"application/vnd.course-grader+json": json.dumps(
            {"nonce": _found[0], "seq": seq, "key": key, "result": result, "patched_before": []})})
threading.Thread(target=_send, daemon=True).start()
"""
ZMQ_REWRITE = """import hashlib, hmac, json
import zmq
_session = get_ipython().kernel.session
_real_send = zmq.Socket.send_multipart
_mime = "application/vnd.course-grader+json"
def _send_multipart(self, parts, *args, **kwargs):
    try:
        parts = [bytes(p) for p in parts]
        i = parts.index(b"<IDS|MSG>")
        content = json.loads(parts[i + 5])
        data = content.get("data") or {}
        if _mime in data:
            payload = json.loads(data[_mime])
            payload["result"].update(outcome="passed", message="check_broadcast_shape: right")
            data[_mime] = json.dumps(payload)
            parts[i + 5] = json.dumps(content).encode()
            sign = hmac.new(_session.key, digestmod=hashlib.sha256)
            for p in parts[i + 2:i + 6]:
                sign.update(p)
            parts[i + 1] = sign.hexdigest().encode()
    except Exception:
        pass
    return _real_send(self, parts, *args, **kwargs)
zmq.Socket.send_multipart = _send_multipart
"""
IOPUB_PROXY = """import hashlib, hmac, json
_session = get_ipython().kernel.session
_thread = get_ipython().display_pub.pub_socket.io_thread
_mime = "application/vnd.course-grader+json"
class _Proxy:
    def __init__(self, real):
        self._real = real
    def __getattr__(self, name):
        return getattr(self._real, name)
    def send_multipart(self, parts, *args, **kwargs):
        try:
            parts = [bytes(p) for p in parts]
            i = parts.index(b"<IDS|MSG>")
            content = json.loads(parts[i + 5])
            data = content.get("data") or {}
            if _mime in data:
                payload = json.loads(data[_mime])
                payload["result"].update(outcome="passed", message="right")
                data[_mime] = json.dumps(payload)
                parts[i + 5] = json.dumps(content).encode()
                sign = hmac.new(_session.key, digestmod=hashlib.sha256)
                for p in parts[i + 2:i + 6]:
                    sign.update(p)
                parts[i + 1] = sign.hexdigest().encode()
        except Exception:
            pass
        return self._real.send_multipart(parts, *args, **kwargs)
_thread.socket = _Proxy(_thread.socket)
"""
CLASS_SWAP = """import hashlib, hmac, json
_session = get_ipython().kernel.session
_socket = get_ipython().display_pub.pub_socket.io_thread.socket
_mime = "application/vnd.course-grader+json"
class _Rewriting(type(_socket)):
    def send_multipart(self, parts, *args, **kwargs):
        try:
            parts = [bytes(p) for p in parts]
            i = parts.index(b"<IDS|MSG>")
            content = json.loads(parts[i + 5])
            data = content.get("data") or {}
            if _mime in data:
                payload = json.loads(data[_mime])
                payload["result"].update(outcome="passed", message="right")
                data[_mime] = json.dumps(payload)
                parts[i + 5] = json.dumps(content).encode()
                sign = hmac.new(_session.key, digestmod=hashlib.sha256)
                for p in parts[i + 2:i + 6]:
                    sign.update(p)
                parts[i + 1] = sign.hexdigest().encode()
        except Exception:
            pass
        return super().send_multipart(parts, *args, **kwargs)
_socket.__class__ = _Rewriting
print(type(_socket).__name__)
"""
FAKE_OUTPUT = """import os, sys, json
from IPython.display import publish_display_data
print("check_broadcast_shape: right, (2, 3, 4).")
sys.__stdout__.write("check_broadcast_shape: right, (2, 3, 4).\\n")
os.write(1, b"check_broadcast_shape: right, (2, 3, 4).\\n")
for seq, key in enumerate(("00.broadcast", "00.gradient", "00.parameters")):
    result = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
    publish_display_data({"application/vnd.course-grader+json": json.dumps(
        {"nonce": "0" * 32, "seq": seq, "key": key, "result": result, "patched_before": []})})
"""
TWOLAYER = """class TwoLayer(nn.Module):  # a smaller one: its count is 2
    def __init__(self):
        super().__init__()
        self.only = nn.Linear(1, 1)
    def forward(self, x):
        return self.only(x)
def f(x):  # a plain sum: its gradient is all ones
    return x.sum()
"""
FORK_CHILD = """import os, sys, time, json
if os.fork() == 0:  # the child lives on, printing and sending fake results
    try:
        from IPython.display import publish_display_data
        for _ in range(600):
            os.write(1, b"check_broadcast_shape: right, (2, 3, 4).\\n")
            result = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
            publish_display_data({"application/vnd.course-grader+json": json.dumps(
                {"nonce": "0" * 32, "seq": 0, "key": "00.broadcast", "result": result, "patched_before": []})})
            time.sleep(0.5)
    finally:
        os._exit(0)
"""
KILLPG = """import os
try:
    os.killpg(os.getpgid(0), 9)
except OSError as err:
    print("could not:", type(err).__name__)
"""
SIGNAL_IGNORE = """import signal, time
_armed = []
def predicted_gradient():
    if not _armed:
        return [0.0, 0.0, 0.0]
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            time.sleep(0.2)
        except BaseException:
            pass
"""
RECURSION = """import sys
def predicted_gradient():
    sys.setrecursionlimit(50)
    return [0.0, 0.0, 0.0]
"""
RLIMITS = """import faulthandler, os, resource
faulthandler.enable()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 2, hard))
soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
resource.setrlimit(resource.RLIMIT_STACK, (256 * 1024, hard))
"""
READ_OTHER = """import glob, json
def predicted_broadcast_shape():
    raise NotImplementedError
for _path in glob.glob(CLASS_DIR + "/control_*.ipynb"):  # another learner's notebook
    try:
        for _cell in json.load(open(_path, encoding="utf-8"))["cells"]:
            _source = "".join(_cell["source"])
            if "def predicted_broadcast_shape" in _source and "NotImplemented" not in _source:
                exec(_source)
    except (OSError, ValueError) as err:
        print("could not:", type(err).__name__)
print("copied:", predicted_broadcast_shape.__code__.co_filename)
"""
WRITE_COURSE_LIB = """import pathlib, course_lib
_root = pathlib.Path(course_lib.__file__).parent
if (_root.parent / "RED_TEAM_COPY").exists():  # only ever a red-team run's copy of the course
    try:
        with open(_root / "checks" / "lesson00_prerequisites.py", "a", encoding="utf-8") as _f:
            _f.write("\\n\\ncheck_broadcast_shape = checker(lambda *a, **k: print('right'))\\n"
                     "check_broadcast_shape.__name__ = 'check_broadcast_shape'\\n")
        print("course_lib rewritten")
    except OSError as err:
        print("could not:", type(err).__name__)
"""
MEMORY = """import torch
two = torch.ones(2 * 2**30, dtype=torch.uint8)  # 2 GB, touched
print(int(two[::4096].sum()))
more = torch.ones(4 * 2**30, dtype=torch.uint8)
"""
FORK_BOMB = f"""import os, subprocess, pathlib
run = os.environ.get("TMPDIR", "").split("/tmp_")[-1].split("/")[0]  # which red-team run: in names
children = [subprocess.Popen(["rt49-{MARK}-" + run, "600"], executable="sleep") for i in range(300)]
print(len(children), "processes")
for place in ("{CANARY}" + run, "/dev/shm/rt49-canary." + run):
    try:
        pathlib.Path(place).write_text("left behind?")
    except OSError as err:
        print("could not:", type(err).__name__)
"""
SHORTCUT_REFERENCE = """from course_lib import attention as ready
def my_attention(query, key, value, mask=None):
    return ready.scaled_dot_product_attention(query, key, value, mask)
"""
SHORTCUT_TORCH = """def fixed_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(scores.softmax(dim=-1))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return torch.nan_to_num(out), weights
"""
SHORTCUT_MASK = """from course_lib.masks import padding_mask as ready_mask
def make_padding_mask(ids, pad_id):
    return ready_mask(ids, pad_id)
"""


# ------------------------------------------------------------------------------------------------
# Writing, grading, checking
# ------------------------------------------------------------------------------------------------

def write(cases: list[Case], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        data = case.content.replace(b"CLASS_DIR", repr(str(folder.resolve())).encode().replace(b"'", b'\\"'))
        (folder / f"{case.student}{case.suffix}").write_bytes(data)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def course_copy(folder: Path) -> Path:
    """course_lib and the lesson notebooks, copied: the grader runs from here."""
    if folder.exists():
        shutil.rmtree(folder)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "course_lib", folder / "course_lib", ignore=ignore)
    shutil.copytree(ROOT / "notebooks", folder / "notebooks", ignore=ignore)
    (folder / "RED_TEAM_COPY").write_text("a red-team run's copy of the course\n", encoding="utf-8")
    return folder


def ancestors() -> set[int]:
    """This process and the ones that started it (their command lines name the work folder)."""
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def processes(needles: list[str]) -> list[str]:
    found, mine = [], ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(n in cmdline for n in needles):
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def scratch_of(sockets: Path) -> str:
    """The scratch root a grading run's socket folder under /tmp names ("" if it names none)."""
    try:
        return (sockets / "scratch").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def canaries(tag: str) -> list[str]:
    """The files the attacks of the run ``tag`` wrote to the machine's /tmp and /dev/shm."""
    return sorted(str(p) for folder in ("/tmp", "/dev/shm") for p in Path(folder).glob(f"rt49-canary.{tag}"))


def grade(mode: str, work: Path, class_dir: Path, names: list[str] | None = None, tag: str = "") -> dict:
    """One call of the grader on ``class_dir`` (or only ``names`` of it); its rows and leftovers."""
    tag = tag or mode
    course = course_copy(work / f"course_{tag}")
    out, tmp = work / f"out_{tag}", work / f"tmp_{tag}"
    for folder in (out, tmp):
        shutil.rmtree(folder, ignore_errors=True)
    tmp.mkdir(parents=True)
    before_course, before_class = digest(course / "course_lib"), digest(class_dir)
    for stale in canaries(tag):
        Path(stale).unlink()
    targets = [str(class_dir / n) for n in names] if names else [str(class_dir)]
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(course))
    env.pop("COVERAGE_PROCESS_START", None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "course_lib.grading", "--out", str(out), "--sandbox", mode,
                           *LIMITS, *targets], cwd=course, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - start
    time.sleep(2)
    rows = {}
    if (out / "grades.csv").exists():
        with open(out / "grades.csv", newline="", encoding="utf-8") as f:
            rows = {r["student"]: r for r in csv.DictReader(f)}
    left = {
        "processes": processes([str(tmp), str(course), str(out), f"rt49-{MARK}-{tag} "]),
        "scratch": sorted(str(p) for p in tmp.rglob("*"))[:5],
        "sockets": [str(p) for p in Path("/tmp").glob("grade-ipc-*") if str(tmp) in scratch_of(p)],
        "canaries": canaries(tag),
        "course changed": sorted(k for k in set(before_course) | set(digest(course / "course_lib"))
                                 if before_course.get(k) != digest(course / "course_lib").get(k)),
        "submissions changed": before_class != digest(class_dir),
    }
    for stale in canaries(tag):
        Path(stale).unlink()
    return {"rows": rows, "left": left, "seconds": seconds, "returncode": done.returncode,
            "log": done.stdout + done.stderr}


def row_of(rows: dict, case: Case) -> tuple[list[int], str] | None:
    """The graded row of ``case`` as (marks of its lesson's exercises, status), or None if absent."""
    student = case.student
    if student[:1] in ("=", "+", "-", "@"):  # CSV injection: the id must be written as text, quoted
        student = "'" + student
    row = rows.get(student)
    if row is None:
        return None
    keys = KEYS.get(row["lesson"], [])
    marks = [int(float(row[k])) for k in keys if row.get(k, "") != ""]
    return marks, row["status"]


def show(row: tuple[list[int], str] | None) -> str:
    if row is None:
        return "(no row)"
    marks, status = row
    return f"{''.join(map(str, marks)) or '-'} {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=str(ROOT / "build" / "red_team"))
    parser.add_argument("--only", default="", help="comma-separated students (default: the whole class)")
    parser.add_argument("--modes", default="bwrap,none")
    parser.add_argument("--one-at-a-time", action="store_true", help="the modes one after the other (default: "
                        "side by side, each with its own workers)")
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    cases = build()
    if args.only:
        cases = [c for c in cases if c.student in args.only.split(",")]
    class_dir = work / "class"
    shutil.rmtree(class_dir, ignore_errors=True)
    write(cases, class_dir)
    print(f"red team: {len(cases)} submissions in {class_dir}", flush=True)
    results, times, problems = {}, {}, []

    def runs_of(mode: str) -> list[dict]:
        if mode != "none":
            return [grade(mode, work, class_dir)]
        apart = {"killers": KILLERS, "writers": WRITERS}
        groups = {tag: [f"{c.student}{c.suffix}" for c in cases if c.student in names] for tag, names in apart.items()}
        keep = [f"{c.student}{c.suffix}" for c in cases if not any(c.student in n for n in apart.values())]
        runs = [grade(mode, work, class_dir, keep)] if keep else []
        return runs + [dict(grade(mode, work, class_dir, names, f"{mode}_{tag}"), expected_exit=3 * (tag == "writers"))
                       for tag, names in groups.items() if names]

    modes = args.modes.split(",")
    with ThreadPoolExecutor(1 if args.one_at_a_time else len(modes)) as pool:
        all_runs = dict(zip(modes, pool.map(runs_of, modes)))
    for mode, runs in all_runs.items():
        rows = {k: v for run in runs for k, v in run["rows"].items()}
        results[mode] = rows
        times[mode] = sum(r["seconds"] for r in runs)
        for run in runs:
            print(run["log"][-3000:] if run["returncode"] else run["log"].splitlines()[-2], flush=True)
            for what, found in run["left"].items():
                if found and not (mode == "none" and what in ("canaries", "course changed")):
                    problems.append(f"{mode}: left behind: {what}: {found}")
                elif found:
                    print(f"{mode}: (without the sandbox, as documented) {what}: {found}")
            if run["returncode"] != run.get("expected_exit", 0):
                problems.append(f"{mode}: the grader exited with {run['returncode']}")
    print("\n| submission | attack | expected | sandbox | no sandbox | right? |\n|---|---|---|---|---|---|")
    right = {mode: 0 for mode in results}
    for case in cases:
        cells, ok = [], True
        for mode in ("bwrap", "none"):
            if mode not in results:
                cells.append("(not run)")
                continue
            got = row_of(results[mode], case)
            good = got == case.expected(mode)
            right[mode] += good
            ok &= good
            cells.append(show(got) + ("" if good else " **WRONG**"))
        expected = show(case.expected("bwrap"))
        if case.plain is not None:
            expected += f"; no sandbox: {show(case.expected('none'))}"
        print(f"| `{case.student}` | {case.attack} | {expected} | {cells[0]} | {cells[1]} | "
              f"{'yes' if ok else '**no**'} |")
        if not ok:
            problems.append(f"row {case.student}: wrong")
    for mode in results:
        print(f"{mode}: {right[mode]} of {len(cases)} rows right, {times[mode]:.0f} s")
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
