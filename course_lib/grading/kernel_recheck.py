"""The grader's code that runs inside each learner's kernel, part 2: the re-check.

Sent as text after kernel_side.py, in the same namespace (``runner.kernel_source()``), never
imported in the kernel; it uses kernel_side's ``restorer``, ``course_files``, ``is_ours``,
``functions_of`` and ``MIME``.

``recheck(...)`` runs after the last cell. It restores the state ``snapshot()`` kept, drops the checker
modules (``course_lib.checks.*``) and imports them afresh; the reference modules are kept, restored (the
learner's model is an instance of the very ``course_lib.gpt.GPT`` the fresh checker imports). Then it
calls each exercise's genuine checker as the lesson calls it, on the learner's object, with seeds the
notebook never saw and a time limit. An outcome counts only if, meanwhile, the learner's code left
the checkers, references, torch and builtins alone; ran none of course_lib's solutions or references
by a copy on any thread it starts; no thread it started earlier ran; the exercise's code is the code
of the notebook's own cells, and the lesson's own code the checker is given is the lesson's. The
outcomes leave the kernel as display messages of the re-check's own cell (MIME type ``MIME``,
numbered, with the grader's nonce), never through a file.
"""

import sys


def _fingerprint(code):
    """A code object's identity that survives a copy: its bytecode, names and constants (nested
    code objects by their own fingerprints), not its file name, line numbers or function name."""
    import types

    consts = tuple(_fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return (code.co_code, code.co_names, code.co_varnames, code.co_argcount, code.co_kwonlyargcount, consts)


def _lines(code):
    """How many source lines a code object spans (a one-line method is too common to call a copy)."""
    return len({line for _, _, line in code.co_lines() if line is not None})


def _codes(code):
    """``code`` and every code object nested in it."""
    import types

    found, stack = [], [code]
    while stack:
        c = stack.pop()
        found.append(c)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return found


def _compiled(sources, transform=None):
    """Fingerprints of every code object the given sources compile to (what does not compile is
    skipped), compiled as IPython compiles a cell, and also whole.

    IPython (``InteractiveShell.run_ast_nodes``) parses the transformed cell, then compiles each
    top-level statement on its own: ``ast.Module([statement])`` in mode 'exec', or, for the
    statements its ``ast_node_interactivity`` runs interactively (by default the last one, if it is
    an expression), ``ast.Interactive([statement])`` in mode 'single'; with top-level ``await``
    allowed (``autoawait``, on by default) and with the ``__future__`` flags of the cells before. The
    bytecode differs from the whole cell's: Python 3.11 compiles ``torch.tensor(...)`` in a function
    one way when ``import torch`` is in the same compilation and another way when it is not. So every
    statement is compiled in both modes (a cell may change the interactivity), with and without
    ``from __future__ import annotations``; the whole cell too (``exec`` of a cell's own text)."""
    import __future__
    import ast

    await_flag = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    prints = set()

    def add(node, mode, flags):
        try:
            top = compile(node, "<cell>", mode, flags | await_flag, dont_inherit=True)
        except (SyntaxError, ValueError, TypeError):
            return
        prints.update(_fingerprint(c) for c in _codes(top))

    for source in sources:
        try:
            text = transform(source) if transform else source
        except Exception:  # noqa: BLE001
            continue
        for flags in (0, __future__.annotations.compiler_flag):
            try:
                tree = compile(text, "<cell>", "exec", flags | await_flag | ast.PyCF_ONLY_AST, dont_inherit=True)
            except (SyntaxError, ValueError):
                continue
            add(tree, "exec", flags)
            for statement in tree.body:
                add(ast.Module([statement], []), "exec", flags)
                add(ast.Interactive([statement]), "single", flags)
    return prints


def _exercise_codes(obj):
    """The code objects an exercise's object is made of: a function's (unwrapped), a class's own
    methods (not those a @dataclass generates)."""
    import inspect

    obj = inspect.unwrap(obj) if callable(obj) else obj
    if inspect.isfunction(obj):
        return [obj.__code__]
    if inspect.isclass(obj):
        generated = set(getattr(obj, "__dataclass_fields__", ())) and {
            "__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__",
            "__le__", "__gt__", "__ge__", "__match_args__"}
        codes = []
        for name, member in vars(obj).items():
            member = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
            member = inspect.unwrap(member) if callable(member) else member
            if inspect.isfunction(member) and not (generated and name in generated
                                                   and member.__code__.co_filename == "<string>"):
                codes.append(member.__code__)
        return codes
    return []


def _reseeded(offset):
    """A context in which every seed a checker sets (``torch.Generator().manual_seed(s)``,
    ``torch.manual_seed(s)``, ``random.Random(s)``) becomes another one, chosen by ``offset``: the
    re-check's inputs are not the ones the notebook's run showed (and printed), so answers recorded
    while the notebook ran cannot be replayed."""
    import contextlib
    import random

    import torch

    def mix(s):
        return (hash((int(s), offset)) % 2**62) if isinstance(s, int) else s

    real_generator, real_seed, real_random = torch.Generator, torch.manual_seed, random.Random

    class Generator(real_generator):
        def manual_seed(self, s):
            return super().manual_seed(mix(s))

    class Random(real_random):
        def seed(self, a=None, version=2):
            return super().seed(mix(a) if isinstance(a, int) else a, version)

    @contextlib.contextmanager
    def swapped():
        torch.Generator, random.Random = Generator, Random
        torch.manual_seed = lambda s: real_seed(mix(s))
        try:
            yield
        finally:
            torch.Generator, torch.manual_seed, random.Random = real_generator, real_seed, real_random

    return swapped()


def recheck(spec, seed, limit, restore, nonce, solutions_dir, cells, user_ns=None, publish=None, budget=None):
    """Re-run every exercise's checker; publish (and return) {"exercises": {key: {outcome, message,
    mistake}}, "patched_before": [...]}. ``user_ns`` and ``publish`` default to the kernel's.

    ``limit``: seconds per exercise. ``budget``: seconds for all the exercises' checks together (None:
    no total), counted from the first one. They share its one deadline: each gets at most ``limit``,
    and at most its fair share of what is left (what is left / the exercises left), so that an endless
    loop in one exercise costs that exercise alone, while time an exercise does not use goes to the
    next ones."""
    import ast
    import contextlib
    import importlib
    import inspect
    import io
    import json
    import os
    import random
    import signal
    import threading
    import time

    sys.setprofile(None)
    sys.settrace(None)
    threading.setprofile(None)
    threading.settrace(None)
    patched_before = restore()
    mine = "lesson" + (spec[0]["key"][:2] if spec else "")  # the shared files and this lesson's only
    disk = [[f for f in files if not os.path.basename(f[0]).startswith("lesson")
             or os.path.basename(f[0]).startswith(mine)] for files in (course_files(), restore.files)]
    disk = disk[0] != disk[1]  # (without the sandbox, a checker rewritten on disk)
    sys.path_importer_cache.clear()  # a finder the notebook put in the cache for course_lib's folder goes
    importlib.invalidate_caches()
    # tqdm's monitor thread (any progress bar) wakes every 10 s: housekeeping, not the learner's
    # work; stopped here, or the busy-thread rule below would cost lessons 06-09 their marks.
    std = sys.modules.get("tqdm.std")
    monitor = getattr(getattr(std, "tqdm", None), "monitor", None)
    if std is not None and isinstance(monitor, std.TMonitor):
        std.tqdm.monitor_interval = 0
        monitor.exit()
        std.tqdm.monitor = None
    for name in [m for m in sys.modules if m.startswith("course_lib.checks")]:
        del sys.modules[name]
    checks = importlib.import_module("course_lib.checks")
    common = sys.modules["course_lib.checks.common"]
    import numpy
    import torch

    in_kernel = user_ns is None  # (the tests' namespaces hold no lesson cell's code)
    if user_ns is None:
        from IPython import get_ipython

        shell = get_ipython()
        user_ns = shell.user_ns
        transform = shell.transform_cell
    else:
        transform = None
    if publish is None:
        publish_display_data = getattr(restore, "publish_display_data", None)  # as it was before any cell
        if publish_display_data is None:
            from IPython.display import publish_display_data

        def publish(payload):
            publish_display_data({MIME: payload})

    restore_checkers = restorer({n: m for n, m in sys.modules.items() if n.startswith("course_lib.checks")})
    # The course's own code, and every copy of it: genuine code objects by identity, copies by
    # fingerprint. The notebook's cells may hold a solution's text (shown by show_solution; that
    # is a peek, reported as such), so code compiled from the cells is never called a copy.
    genuine = {c for n, m in list(sys.modules.items()) if is_ours(n) and not n.startswith("course_lib.grading")
               for _, _, f in functions_of(m) for c in _codes(f.__code__)}
    grader_codes = {c for f in globals().values() if inspect.isfunction(f) for c in _codes(f.__code__)}
    solution_files = [os.path.join(solutions_dir, f) for f in sorted(os.listdir(solutions_dir))
                      if f.endswith(".py")]
    solution_prints = _compiled([open(p, encoding="utf-8").read() for p in solution_files])
    course_prints = solution_prints | {_fingerprint(c) for c in genuine if _lines(c) >= 3}
    cell_prints = _compiled(cells, transform)
    lesson_prints, lesson_names = _lesson_cells(solutions_dir, spec, transform) if in_kernel else (set(), set())
    verdicts = {}

    def copied(code):
        """None, or what ``code`` is a copy of ("a solution", "course_lib's reference")."""
        key = id(code)
        if key not in verdicts:
            if code.co_filename.startswith(solutions_dir):
                verdicts[key] = (code, "course_lib's solutions")
            elif code in genuine or code in grader_codes:
                verdicts[key] = (code, None)
            else:
                fp = _fingerprint(code)
                if fp in course_prints and fp not in cell_prints:  # a module imported since?
                    genuine.update(c for n, m in list(sys.modules.items()) if is_ours(n)
                                   and getattr(m, "__file__", None) == code.co_filename
                                   for _, _, f in functions_of(m) for c in _codes(f.__code__))
                verdicts[key] = (code, None if code in genuine or fp in cell_prints or fp not in course_prints else
                                 "a copy of course_lib's solutions" if fp in solution_prints else
                                 "a copy of course_lib's reference")
        return verdicts[key][1]

    class GraderTimeout(BaseException):
        """Not an Exception: the checkers' and most learners' ``except Exception`` let it through."""

    allowed = [limit]  # this exercise's seconds

    def on_alarm(signum, frame):
        raise GraderTimeout(f"the checker did not finish within {allowed[0]:.3g} s (an endless loop?)")

    signal.signal(signal.SIGALRM, on_alarm)
    used = []

    def tracer(frame, event, arg):
        if event == "call":
            what = copied(frame.f_code)
            if what:
                used.append(what)

        return None

    def cpu_of(idents):
        times = {}
        for ident in idents:
            try:
                times[ident] = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, AttributeError, OverflowError):
                pass
        return times

    me = threading.get_ident()
    learner_threads = [i for i in sys._current_frames() if i != me and i not in restore.kernel_threads]
    results = {"patched_before": patched_before, "exercises": {}}
    seq = 0
    deadline = None if budget is None else time.monotonic() + budget
    for index, ex in enumerate(spec):
        outcome, message, mistake, site = "failed", "", "", ""
        allowed[0] = limit
        if deadline is not None:
            allowed[0] = min(limit, (deadline - time.monotonic()) / (len(spec) - index))
        if allowed[0] < 0.01:
            message = (f"Timed out: the grader's re-check has {budget:g} s for all the exercises together, and "
                       "they were spent before this one was checked.")
            mistake = "grader: re-check time spent"
        elif ex["name"] not in user_ns:
            outcome, message = "missing", f"`{ex['name']}` is not defined: the exercise cell is missing."
        else:
            candidate = user_ns[ex["name"]]
            namespace = dict(user_ns)
            namespace["_grader_checker_"] = getattr(checks, ex["checker"])
            call = f"_grader_checker_({', '.join([ex['name']] + ex['args'])})"
            # seeds the notebook never saw: the re-check's inputs differ from the cells' inputs
            torch.manual_seed(seed)
            random.seed(seed)
            numpy.random.seed(seed % 2**32)
            before, printed = len(common.RESULTS), io.StringIO()
            used.clear()
            cpu_before = cpu_of(learner_threads)
            signal.setitimer(signal.ITIMER_REAL, allowed[0])
            threading.settrace(tracer)
            sys.settrace(tracer)
            raised = False
            poisoned = _poison_solutions(solutions_dir, used)
            try:
                with contextlib.redirect_stdout(printed), _reseeded(seed), _no_trace_switch(used, tracer):
                    eval(call, namespace)
            except GraderTimeout as err:
                raised, message = True, f"Timed out: {_text(err)}."
            except BaseException as err:  # noqa: BLE001 (a learner's SystemExit or anything else)
                # read as data, never by the exception's own methods: a learner's __str__ or
                # __getattr__ runs nothing here (#49: one set the last result to "passed")
                raised, message = True, _text(err) or _type_name(err)
                if type(err) is common.CheckFailure:
                    mistake, site = _plain_str(vars(err).get("mistake")), _plain_str(vars(err).get("site"))
            finally:
                tracing = sys.gettrace()
                first = restore.first()  # (not hasattr: a builtin the checked code may have patched)
                sys.settrace(None)
                threading.settrace(None)
                signal.setitimer(signal.ITIMER_REAL, 0)
                _unpoison(poisoned)
            if tracing is not tracer:  # switched off by the code it traced (sys.settrace, ctypes)
                used.append("code that switched off the grader's tracing")
                outcome, raised = "failed", True
                message = message or ("Your code switched off the grader's tracing (sys.settrace) while it "
                                      "was being checked; it is graded 0.")
                mistake = "grader: switched off tracing"
            cpu_after = cpu_of(learner_threads)
            busy = [i for i in cpu_after if cpu_after[i] - cpu_before.get(i, cpu_after[i]) > 0.0001]
            new = common.RESULTS[before:]
            if not raised and not message and len(new) == 1:
                outcome = _plain_str(vars(new[0]).get("outcome")) if type(new[0]) is common.CheckResult \
                    else "failed"
            tampered = first + restore(False) + restore_checkers(False)  # and put back for the next one
            foreign = [c for c in _exercise_codes(candidate) if fp_missing(c, cell_prints)]
            names = [n.id for a in ex["args"] for n in ast.walk(ast.parse(a, mode="eval")) if type(n) is ast.Name]
            replaced = [n for n in names if n in lesson_names and n in user_ns and (
                not (inspect.isfunction(user_ns[n]) or inspect.isclass(user_ns[n]))
                or any(fp_missing(c, lesson_prints) for c in _exercise_codes(user_ns[n])))]
            if disk:
                outcome, message = "failed", "Your notebook changed course_lib's files on disk; it is graded 0."
                mistake = "grader: changed course_lib on disk"
            elif tampered:
                outcome, message = "failed", ("Your code changed " + ", ".join(sorted(set(tampered))[:3])
                                              + " while it was being checked; it is graded 0.")
                mistake = "grader: changed the checkers"
            elif used and outcome == "passed":
                outcome, message = "failed", (f"Your code runs {used[0]} instead of computing the "
                                              "answer itself; it is graded 0.")
                mistake = "grader: ran course_lib's code"
            elif foreign and outcome == "passed":
                outcome, message = "failed", (
                    f"`{ex['name']}` is not code from your notebook's cells (it was exec'd, imported or "
                    "loaded from a file): the grader grades only code you wrote in the notebook; it is "
                    "graded 0.")
                mistake = "grader: code not from the notebook"
            elif replaced and outcome == "passed":
                outcome, message = "failed", (
                    f"`{replaced[0]}`, the lesson's own code that the checker is given, is not the code of the "
                    "lesson's cell any more (redefined or changed by your notebook); it is graded 0.")
                mistake = "grader: the lesson's code replaced"
            elif busy and outcome == "passed":
                outcome, message = "failed", (
                    "A thread your notebook started earlier was running while this exercise was being "
                    "checked, so the grader cannot tell whose work the answer is; it is graded 0. "
                    "Stop your threads before the notebook ends.")
                mistake = "grader: a background thread ran"
            elif outcome == "passed":
                message = printed.getvalue().strip()
            elif not message:
                message = printed.getvalue().strip() or "the checker did not run"
        result = {"outcome": str(outcome), "message": str.__str__(str(message)),
                  "mistake": str.__str__(str(mistake)), "site": str.__str__(str(site))}
        results["exercises"][ex["key"]] = result
        # each exercise's result leaves at once, numbered: a later exercise's code cannot change it
        publish(json.dumps({"nonce": nonce, "seq": seq, "key": ex["key"], "result": result,
                            "patched_before": patched_before}))
        seq += 1
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return results


def _lesson_cells(solutions_dir, spec, transform=None):
    """(fingerprints, ``def``/``class`` names) of the lesson's cells but the stubs (``f``, ``TwoLayer``)."""
    import ast
    import glob
    import json
    import os

    notebooks = os.path.join(os.path.dirname(os.path.dirname(solutions_dir)), "notebooks")
    try:
        path = glob.glob(os.path.join(notebooks, f"{spec[0]['key'].split('.')[0]}_*.ipynb"))[0]
        with open(path, encoding="utf-8") as file:
            cells = ["".join(c["source"]) for c in json.load(file)["cells"] if c["cell_type"] == "code"
                     and not c.get("metadata", {}).get("exercise")]
        trees = [ast.parse(transform(cell) if transform else cell) for cell in cells]
    except Exception:  # noqa: BLE001 (no notebook there: nothing to compare with)
        return set(), set()
    names = {n.name for t in trees for n in t.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return _compiled(cells, transform), names


def fp_missing(code, cell_prints):
    """True if ``code`` was not compiled from any of the notebook's cells."""
    return _fingerprint(code) not in cell_prints


def _plain_str(value):
    """``value`` as an exact ``str`` if it is one (its subclass's methods never run), else ""."""
    return str.__str__(value) if issubclass(type(value), str) else ""


def _text(err):
    """An exception's message read as data: its arguments if they are all strings, else ""."""
    args = BaseException.__dict__["args"].__get__(err)
    if type(args) is tuple and all(issubclass(type(a), str) for a in args):
        return "; ".join(str.__str__(a) for a in args)
    return ""


def _type_name(err):
    return str.__str__(type.__dict__["__name__"].__get__(type(err)))


def _poison_solutions(solutions_dir, used):
    """While an exercise is checked, every function of course_lib's solutions that the notebook has
    imported records that it ran (in ``used``) and raises: whatever happened to the grader's tracing
    (#49: switched off by the code it traced), a call of a solution is seen. Returns what to put back."""
    import os

    trap_name = "__course_grader_trap__"

    def trap(*args, **kwargs):  # noqa: ARG001
        used.append("course_lib's solutions")
        raise RuntimeError("course_lib's solutions cannot run while an exercise is graded")

    stub = compile(f"def _solution(*args, **kwargs):\n    return {trap_name}(*args, **kwargs)\n", "<grader>", "exec")
    code = next(c for c in stub.co_consts if hasattr(c, "co_code"))
    poisoned = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if not (name.startswith("course_lib.solutions.") and os.path.abspath(path).startswith(
                os.path.abspath(solutions_dir))):
            continue
        vars(module)[trap_name] = trap
        poisoned.append((module, trap_name))
        for _, _, function in functions_of(module):
            if not function.__code__.co_freevars:
                poisoned.append((function, function.__code__))
                function.__code__ = code
    return poisoned


def _unpoison(poisoned):
    for owner, what in poisoned:
        if isinstance(what, str):
            vars(owner).pop(what, None)  # the module's trap name
        else:
            owner.__code__ = what


def _no_trace_switch(used, tracer):
    """A context in which ``sys.settrace`` and ``threading.settrace`` record a call (in ``used``) and
    do nothing: the learner's code cannot switch off the grader's tracer by them. Setting the
    grader's own ``tracer`` goes through: a thread the checked code starts sets it so
    (``threading.Thread`` calls ``sys.settrace`` with the hook ``threading.settrace`` left)."""
    import contextlib
    import threading

    @contextlib.contextmanager
    def guarded():
        real = sys.settrace, threading.settrace

        def guard(setter):
            def switched(function, *args, **kwargs):
                if function is tracer:
                    return setter(function, *args, **kwargs)
                used.append("code that switched off the grader's tracing")
                return None

            return switched

        sys.settrace, threading.settrace = guard(real[0]), guard(real[1])
        try:
            yield
        finally:
            sys.settrace, threading.settrace = real

    return guarded()
