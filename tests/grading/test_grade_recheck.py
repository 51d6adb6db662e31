"""The re-check (course_lib/grading/kernel_side.py and kernel_recheck.py) in this process, without a kernel (#49).

- "Code from your notebook's cells": a learner's cell runs in a real IPython shell (IPython compiles
  each top-level statement on its own), then the grader's re-check decides; a correct answer whose
  cell imports at its top is accepted in every style of code, and code that is not compiled from a
  cell is still refused.
- The re-check's seeds: the course's own SwiGLU passes check_swiglu on 40 of the re-check's seeds,
  and wrong answers are refused on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = str(ROOT / "course_lib" / "solutions")
LESSON00_F = "def f(x):\n    return (x ** 2).sum()  # y = x_1**2 + x_2**2 + x_3**2\n"
GRADIENT = {"key": "00.gradient", "name": "predicted_gradient", "checker": "check_gradient_prediction",
            "args": ["f", "[1.0, 2.0, 3.0]"]}
KV_BYTES = {"key": "11.kv_bytes", "name": "predicted_kv_bytes", "checker": "check_kv_bytes", "args": []}
LAYER_NORM = {"key": "04.layer_norm", "name": "MyLayerNorm", "checker": "check_layer_norm", "args": []}
NOT_FROM_CELLS = "is not code from your notebook's cells"


def _grader() -> dict:
    from course_lib.grading.runner import kernel_source

    grader: dict = {"__name__": "grader"}
    exec(kernel_source(), grader)  # noqa: S102 (as the grader sends it)
    return grader


@pytest.fixture
def shell(tmp_path, monkeypatch, checkers_put_back):
    """A fresh IPython shell, as a kernel's (no history database, its profile in tmp_path). What it
    changes in this process is put back after: sys.modules["__main__"], builtins' ``display`` and
    ``__IPYTHON__``, the shell instance."""
    import builtins

    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    for name in ("display", "__IPYTHON__"):
        if hasattr(builtins, name):
            monkeypatch.setattr(builtins, name, getattr(builtins, name))
        else:
            monkeypatch.delattr(builtins, name, raising=False)
    config = Config()
    config.HistoryManager.enabled = False
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        yield ip
    finally:
        InteractiveShell.clear_instance()
        for name in ("display", "__IPYTHON__"):
            vars(builtins).pop(name, None)  # monkeypatch then puts back what was there


def _recheck_cells(shell, cells: list[str], spec: dict) -> dict:
    """Run ``cells`` in the shell after the grader's snapshot, as a notebook runs; then the re-check
    on the shell's namespace (get_ipython(): its user_ns and transform_cell, as in a kernel)."""
    grader = _grader()
    restore = grader["snapshot"]()
    for cell in cells:
        result = shell.run_cell(cell, store_history=False, silent=False)
        assert result.success, (cell, result.error_before_exec or result.error_in_exec)
    published: list[str] = []
    results = grader["recheck"]([spec], 10_000, 60.0, restore, "nonce", SOLUTIONS, cells, publish=published.append)
    return results["exercises"][spec["key"]]


# the two answers of #49 that were refused, and the same answer in other styles
ACCEPTED = {
    "gradient_import_torch": (GRADIENT, "import torch\n"
                              "def predicted_gradient(): return torch.tensor([2., 4., 6.]).tolist()\n"),
    "kv_bytes_import_math": (KV_BYTES, "import math\n"
                             "def predicted_kv_bytes():\n"
                             "    return math.prod([2, 3, 2, 128 // 8, 50, 5, 4])\n"),
    "decorated": (GRADIENT, "import functools\nimport torch\n\n"
                  "def logged(fn):\n    @functools.wraps(fn)\n    def wrapper(*args):\n"
                  "        return fn(*args)\n    return wrapper\n\n"
                  "@logged\ndef predicted_gradient():\n    return torch.tensor([2., 4., 6.]).tolist()\n"),
    "nested_def": (GRADIENT, "import torch\n"
                   "def predicted_gradient():\n    def slope(x):\n        return 2 * torch.as_tensor(x)\n"
                   "    return slope([1.0, 2.0, 3.0]).tolist()\n"),
    "lambda_default": (GRADIENT, "import torch\n"
                       "def predicted_gradient(slope=lambda x: torch.mul(torch.tensor(x), 2)):\n"
                       "    return slope([1.0, 2.0, 3.0]).tolist()\n"),
    "class_with_methods": (LAYER_NORM, "import torch\nfrom torch import nn\n\n"
                           "class MyLayerNorm(nn.Module):\n"
                           "    def __init__(self, d_model, eps=1e-5):\n        super().__init__()\n"
                           "        self.weight = nn.Parameter(torch.ones(d_model))\n"
                           "        self.bias = nn.Parameter(torch.zeros(d_model))\n        self.eps = eps\n\n"
                           "    def forward(self, x):\n        mean = x.mean(dim=-1, keepdim=True)\n"
                           "        var = torch.var(x, dim=-1, keepdim=True, unbiased=False)\n"
                           "        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias\n"),
    # a thread started while the answer is checked is traced as well, and a correct answer made on
    # it counts (the guard on sys.settrace lets the grader's own tracer through)
    "computed_on_a_thread": (GRADIENT, "from concurrent.futures import ThreadPoolExecutor\n"
                             "def predicted_gradient():\n"
                             "    with ThreadPoolExecutor(1) as pool:\n"
                             "        return pool.submit(lambda: [2.0, 4.0, 6.0]).result()\n"),
    "magic_and_last_expression": (KV_BYTES, "%precision 3\nimport math\n"
                                  "def predicted_kv_bytes():\n    return math.prod([2, 3, 2, 16, 50, 5, 4])\n"
                                  "predicted_kv_bytes()\n"),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_a_correct_answer_whose_cell_imports_is_code_from_the_notebook(shell, case):
    spec, cell = ACCEPTED[case]
    result = _recheck_cells(shell, [LESSON00_F, cell], spec)
    assert result["outcome"] == "passed", result


def test_the_fingerprint_is_ipythons_compilation_not_the_whole_cells(shell):
    """The cause: compiled whole, ``torch.tensor`` in the function is another instruction than
    IPython's statement-by-statement compilation gives (Python 3.11); the grader's fingerprints now
    hold IPython's."""
    grader = _grader()
    cell = ACCEPTED["gradient_import_torch"][1]
    shell.run_cell(cell, store_history=False)
    code = shell.user_ns["predicted_gradient"].__code__
    whole = compile(cell, "<cell>", "exec", dont_inherit=True)
    assert grader["_fingerprint"](code) != grader["_fingerprint"](
        next(c for c in whole.co_consts if hasattr(c, "co_code")))
    assert not grader["fp_missing"](code, grader["_compiled"]([cell], shell.transform_cell))


def test_code_not_compiled_from_a_cell_is_still_refused(shell, tmp_path):
    answer = tmp_path / "answer.py"
    answer.write_text(ACCEPTED["gradient_import_torch"][1], encoding="utf-8")
    from_file = f"exec(compile(open({str(answer)!r}).read(), {str(answer)!r}, 'exec'))\n"
    result = _recheck_cells(shell, [LESSON00_F, from_file], GRADIENT)
    assert result["outcome"] == "failed" and NOT_FROM_CELLS in result["message"], result
    from_string = f"exec({ACCEPTED['kv_bytes_import_math'][1]!r})\n"
    result = _recheck_cells(shell, [from_string], KV_BYTES)
    assert result["outcome"] == "failed" and NOT_FROM_CELLS in result["message"], result
    # a class whose methods come from a file
    norm = ACCEPTED["class_with_methods"][1].replace("self.eps", "self.epsilon")  # not the solution's text
    (tmp_path / "norm.py").write_text(norm, encoding="utf-8")
    imported = f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom norm import MyLayerNorm\n"
    result = _recheck_cells(shell, [imported], LAYER_NORM)
    assert result["outcome"] == "failed" and NOT_FROM_CELLS in result["message"], result


# ----------------------------------------------------------------------------------------------
# The re-check's seeds: the course's own solution passes on every one
# ----------------------------------------------------------------------------------------------

def _reseeded_check(grader: dict, check, candidate, seed: int) -> str:
    """``check(candidate)`` as the re-check runs it (its global seeds, every seed a checker sets
    changed by ``seed``): "" if it passed, else the checker's message."""
    import contextlib
    import io
    import random

    import numpy
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    try:
        with contextlib.redirect_stdout(io.StringIO()), grader["_reseeded"](seed):
            check(candidate)
    except Exception as err:  # noqa: BLE001 (a CheckFailure: the verdict)
        return str(err) or type(err).__name__
    return ""


def test_the_swiglu_solution_passes_the_recheck_on_every_seed():
    """#49: the re-check draws its seed afresh; with a fixed 1e-5 tolerance the course's own float32
    SwiGLU was refused on 11 of these 40 seeds (82 of 300: off by up to 9e-5 where an output is near 0,
    at d_model 100 where outputs reach ~190). Its tolerance now scales with the output; wrong answers
    are still refused on every seed."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import course_lib.solutions.lesson11 as module
    from course_lib.checks import check_swiglu
    from course_lib.solutions import solution_source

    grader = _grader()
    namespace = {k: v for k, v in vars(module).items() if k in ("torch", "nn", "F", "math")}
    exec(compile(solution_source("11.swiglu"), "<cell>", "exec"), namespace)  # noqa: S102 (a learner's cell)
    seeds = [10_000 + 7919 * s for s in range(40)]  # the re-check's seeds are 10,000 + a fresh draw
    failed = {seed: why[:120] for seed in seeds if (why := _reseeded_check(grader, check_swiglu,
                                                                           namespace["MySwiGLU"], seed))}
    assert not failed, failed

    def wired(forward):
        class Wrong(nn.Module):
            def __init__(self, d_model):
                super().__init__()
                d_ff = round(8 * d_model / 3)
                self.gate, self.up = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False)
                self.down = nn.Linear(d_ff, d_model, bias=False)

            def forward(self, x):
                return forward(self, x)

        return Wrong

    wrong = {  # the named mistakes of tests/checks/test_lesson11_modern.py, and two unnamed ones
        "gate and up swapped": lambda m, x: m.down(F.silu(m.up(x)) * m.gate(x)),
        "GEGLU": lambda m, x: m.down(F.gelu(m.gate(x)) * m.up(x)),
        "ReGLU": lambda m, x: m.down(F.relu(m.gate(x)) * m.up(x)),
        "SiLU on both": lambda m, x: m.down(F.silu(m.gate(x)) * F.silu(m.up(x))),
        "that is GLU": lambda m, x: m.down(torch.sigmoid(m.gate(x)) * m.up(x)),
        "Output differs": lambda m, x: m.down(F.silu(m.gate(x)) * m.up(x)) * (1 + 1e-3),
        "Output differs ": lambda m, x: m.down(F.silu(m.gate(x)) * m.up(x)) + 1e-2,
    }
    for words, forward in wrong.items():
        for seed in seeds[:8]:
            assert words.strip() in _reseeded_check(grader, check_swiglu, wired(forward), seed), (words, seed)


# ----------------------------------------------------------------------------------------------
# #49's fakes, in this process: each would have turned a wrong prediction into a pass; each earns 0
# ----------------------------------------------------------------------------------------------

WRONG = "def predicted_gradient():\n    return [0.0, 0.0, 0.0]\n"
_PASS = ("import sys\n"
         "def _pass(*args, **kwargs):\n"
         "    common = sys.modules['course_lib.checks.common']\n"
         "    common.RESULTS.append(common.CheckResult('check_gradient_prediction', 'predicted_gradient',"
         " 'passed'))\n")
FAKES = {
    # the re-check's fresh import of the checkers, served by the notebook
    "import_module_wrapped": _PASS + (
        "import importlib, types\n_real = importlib.import_module\n"
        "def _fake(name, package=None):\n    module = _real(name, package)\n"
        "    if name == 'course_lib.checks':\n"
        "        fake = types.ModuleType(name)\n        fake.__dict__.update(vars(module))\n"
        "        fake.check_gradient_prediction = _pass\n        return fake\n    return module\n"
        "importlib.import_module = _fake\n" + WRONG),
    "meta_path_finder": _PASS + (
        "import importlib.machinery\n"
        "class _Finder:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name != 'course_lib.checks.lesson00_prerequisites':\n            return None\n"
        "        spec = importlib.machinery.PathFinder.find_spec(name, path)\n"
        "        real = spec.loader.exec_module\n"
        "        def exec_module(module):\n            real(module)\n"
        "            module.check_gradient_prediction = _pass\n"
        "        spec.loader.exec_module = exec_module\n        return spec\n"
        "sys.meta_path.insert(0, _Finder)\n" + WRONG),
    # an exception whose __str__ rewrites the last result and returns ""
    "exception_str": ("import sys\n"
                      "class Sneaky(BaseException):\n"
                      "    def __str__(self):\n"
                      "        sys.modules['course_lib.checks.common'].RESULTS[-1].outcome = 'passed'\n"
                      "        return ''\n"
                      "Sneaky.__name__ = ''\n"
                      "def predicted_gradient():\n    raise Sneaky()\n"),
    # the truth read from the checker's frame
    "reads_the_checkers_frame": ("import sys\n"
                                 "def predicted_gradient():\n"
                                 "    frame = sys._getframe(1)\n"
                                 "    while frame is not None:\n"
                                 "        if 'truth' in frame.f_locals:\n"
                                 "            return frame.f_locals['truth'].tolist()\n"
                                 "        frame = frame.f_back\n"
                                 "    return [0.0, 0.0, 0.0]\n"),
    # course_lib's solution, called with the grader's tracer switched off
    "settrace_none": ("import sys\nfrom course_lib.solutions.lesson00 import predicted_gradient as _s\n"
                      "def predicted_gradient():\n    sys.settrace(None)\n    return _s()\n"),
    "settrace_saved_and_put_back": ("import sys\nfrom course_lib.solutions.lesson00 import predicted_gradient as _s\n"
                                    "_st = sys.settrace\n"
                                    "def predicted_gradient():\n    t = sys.gettrace()\n    _st(None)\n"
                                    "    try:\n        return _s()\n    finally:\n        _st(t)\n"),
    "solution_on_a_thread": ("from concurrent.futures import ThreadPoolExecutor\n"
                             "from course_lib.solutions.lesson00 import predicted_gradient as _s\n"
                             "def predicted_gradient():\n"
                             "    with ThreadPoolExecutor(1) as pool:\n"
                             "        return pool.submit(_s).result()\n"),
    "pyeval_settrace_by_ctypes": ("import ctypes\nfrom course_lib.solutions.lesson00 import predicted_gradient as _s\n"
                                  "def predicted_gradient():\n"
                                  "    ctypes.pythonapi.PyEval_SetTrace(None, None)\n    return _s()\n"),
}


@pytest.mark.parametrize("case", list(FAKES))
def test_each_fake_of_49_earns_0(shell, case):
    result = _recheck_cells(shell, [LESSON00_F, FAKES[case]], GRADIENT)
    assert result["outcome"] == "failed", (case, result)


def test_a_lying_tensor_and_a_lying_string_earn_0(shell):
    liar = ("import torch\n"
            "class Lying(torch.Tensor):\n"
            "    @classmethod\n"
            "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
            "        if func in (torch.allclose, torch.equal, torch.Tensor.__eq__):\n            return True\n"
            "        return super().__torch_function__(func, types, args, kwargs or {})\n"
            "def predicted_gradient():\n    return torch.zeros(3).as_subclass(Lying)\n")
    assert _recheck_cells(shell, [LESSON00_F, liar], GRADIENT)["outcome"] == "failed"


def test_a_wrapped_publish_cannot_rewrite_the_results(shell):
    """The results leave through publish_display_data as it was before the notebook's first cell:
    a wrapper that rewrites every result to "passed" (#49, three lines) never sees them."""
    from IPython.core.displaypub import DisplayPublisher

    sent: list[dict] = []

    class Recorder(DisplayPublisher):
        def publish(self, data, metadata=None, **kwargs):  # noqa: ARG002
            sent.append(data)

    shell.display_pub = Recorder(shell=shell)
    grader = _grader()
    restore = grader["snapshot"]()
    wrap = ("import json\nimport IPython.display\nfrom IPython.core import display_functions\n"
            "_real = IPython.display.publish_display_data\n"
            "def _rewrite(data, *args, **kwargs):\n"
            "    for mime, text in list(data.items()):\n"
            "        if 'course-grader' in mime:\n"
            "            d = json.loads(text)\n"
            "            d['result'].update(outcome='passed', message='')\n"
            "            data[mime] = json.dumps(d)\n"
            "    return _real(data, *args, **kwargs)\n"
            "IPython.display.publish_display_data = display_functions.publish_display_data = _rewrite\n"
            "get_ipython().display_pub.publish = lambda data, *a, **k: sent_by_learner.append(data)\n"
            "sent_by_learner = []\n")
    cells = [LESSON00_F, wrap, WRONG]
    for cell in cells:
        assert shell.run_cell(cell, store_history=False).success
    results = grader["recheck"]([GRADIENT], 10_000, 60.0, restore, "nonce", SOLUTIONS, cells)
    import json

    payloads = [json.loads(d[grader["MIME"]]) for d in sent if grader["MIME"] in d]
    assert [p["result"]["outcome"] for p in payloads] == ["failed"], payloads
    assert results["exercises"]["00.gradient"]["outcome"] == "failed"
    assert any("publish_display_data" in p or "display path" in p for p in results["patched_before"])
    assert shell.user_ns["sent_by_learner"] == []


# ----------------------------------------------------------------------------------------------
# The red team of 2026-12-07 (scripts/red_team.py): fakes that earned a mark before, and earn 0 now
# ----------------------------------------------------------------------------------------------

RED_TEAM = {
    # torch's public modules are guarded whole: Tensor.backward calls torch.autograd.backward
    "autograd_backward_patched": ("import torch\n"
                                  "def _backward(tensors, *args, **kwargs):\n"
                                  "    leaf = tensors.grad_fn.next_functions[0][0].next_functions[0][0]\n"
                                  "    leaf.variable.grad = torch.zeros_like(leaf.variable)\n"
                                  "torch.autograd.backward = _backward\n" + WRONG),
    # a wrapper made with functools.wraps has torch's __module__ and __wrapped__, not torch's file
    "wraps_allclose": ("import functools, torch\n"
                       "torch.allclose = functools.wraps(torch.allclose)(lambda *a, **k: True)\n" + WRONG),
    "module_call_impl": ("import torch\n"
                         "torch.nn.Module._call_impl = lambda self, *a, **k: torch.zeros(3)\n" + WRONG),
}


@pytest.mark.parametrize("case", list(RED_TEAM))
def test_each_fake_of_the_red_team_earns_0(shell, case):
    result = _recheck_cells(shell, [LESSON00_F, RED_TEAM[case]], GRADIENT)
    assert result["outcome"] == "failed", (case, result)


def test_the_lessons_own_code_given_to_the_checker_cannot_be_redefined(shell):
    """check_gradient_prediction(predicted_gradient, f, ...) is given the lesson's ``f``: a cell
    added after it that redefines ``f`` (a plain sum) made the prediction of all ones come true."""
    ones = "def predicted_gradient():\n    return [1.0, 1.0, 1.0]\n"
    result = _recheck_cells(shell, [LESSON00_F, "def f(x):\n    return x.sum()\n", ones], GRADIENT)
    assert result["outcome"] == "failed" and "the lesson's own code" in result["message"], result
    patched = "import torch\nf.__code__ = (lambda x: torch.sum(x)).__code__\n"
    result = _recheck_cells(shell, [LESSON00_F, patched, ones], GRADIENT)
    assert result["outcome"] == "failed", result


def test_the_iopub_socket_and_its_class_are_put_back(shell):
    """The objects a result passes through on its way out (the IOPub thread's zmq socket, held by
    the display publisher's socket) are put back, and so is a class swapped by ``__class__``."""
    from types import SimpleNamespace

    from IPython.core.displaypub import DisplayPublisher

    class Socket:
        def send_multipart(self, parts):
            return parts

    real = Socket()
    shell.display_pub = DisplayPublisher(shell=shell)
    shell.display_pub.pub_socket = SimpleNamespace(io_thread=SimpleNamespace(socket=real))
    grader = _grader()
    restore = grader["snapshot"]()
    thread = shell.display_pub.pub_socket.io_thread
    thread.socket = SimpleNamespace(send_multipart=lambda parts: ["rewritten"])
    assert "the kernel's display path (socket)" in restore() and thread.socket is real

    class Rewriting(Socket):
        def send_multipart(self, parts):
            return ["rewritten"]

    real.__class__ = Rewriting
    assert "the kernel's display path (Socket)" in restore() and type(real) is Socket


def test_builtins_and_the_recursion_limit_are_put_back_before_the_next_exercise(shell):
    """A lying ``isinstance`` hung the whole re-check, and a recursion limit of 50 lost every result
    (the red team of 2026-12-07): the exercise that does it earns 0, the next one is still checked."""
    grader = _grader()
    restore = grader["snapshot"]()
    limit = sys.getrecursionlimit()
    liar = ("import builtins, sys\n"
            "def predicted_gradient():\n"
            "    builtins.isinstance = lambda obj, kind: True\n"
            "    sys.setrecursionlimit(50)\n"
            "    return [0.0, 0.0, 0.0]\n")
    right = "import math\ndef predicted_kv_bytes():\n    return math.prod([2, 3, 2, 128 // 8, 50, 5, 4])\n"
    cells = [LESSON00_F, liar, right]
    for cell in cells:
        assert shell.run_cell(cell, store_history=False).success
    try:
        results = grader["recheck"]([GRADIENT, KV_BYTES], 10_000, 60.0, restore, "nonce", SOLUTIONS, cells,
                                    publish=lambda payload: None)
    finally:
        sys.setrecursionlimit(limit)
    assert results["exercises"]["00.gradient"]["outcome"] == "failed"
    assert results["exercises"]["11.kv_bytes"]["outcome"] == "passed", results
    import builtins

    assert builtins.isinstance(1, str) is False and sys.getrecursionlimit() == limit
