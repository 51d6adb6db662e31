"""The grader's code that runs inside each learner's kernel (sent as text, never imported there).

``snapshot()`` runs before the learner's first cell: it keeps the original attributes of builtins,
torch, torch.Tensor, torch.nn.functional and nn.Module, and returns ``restore()``, which puts back any
the notebook replaced (a monkeypatched ``torch.allclose`` cannot fake a pass).

``recheck(...)`` runs after the learner's last cell. It drops every ``course_lib`` module from
``sys.modules`` and imports the checkers afresh (an edited ``has_passed`` or a patched
``course_lib.checks`` is gone), then calls each exercise's genuine checker, exactly as the lesson
calls it, on the learner's object, with seeds set by the grader and a time limit. An outcome counts
only if the learner's code left the checkers, torch and builtins alone meanwhile and did not call
into ``course_lib/solutions``. It writes the outcomes as JSON to a file the grader reads.
"""

import sys


def _watched(target):
    """The attributes of ``target`` that restore() guards: public names, and Tensor's operators."""
    names = vars(target)
    if target.__name__ == "Tensor":
        return {k: v for k, v in names.items() if not k.startswith("_") or k.endswith("__")}
    if target.__name__ == "builtins":  # ipykernel swaps input() per request itself
        return {k: v for k, v in names.items() if not k.startswith("_") and k != "input"}
    return {k: v for k, v in names.items() if not k.startswith("_")}


def snapshot():
    import builtins

    import torch
    import torch.nn.functional as F

    saved = [(t, dict(_watched(t))) for t in (builtins, torch, torch.Tensor, F, torch.nn.Module)]
    missing = object()

    def restore():
        changed = []
        for target, attrs in saved:
            now = vars(target)
            for name, value in attrs.items():
                if now.get(name, missing) is not value:
                    try:
                        setattr(target, name, value)
                    except (AttributeError, TypeError):
                        pass
                    changed.append(f"{getattr(target, '__name__', '?')}.{name}")
        return changed

    return restore


def recheck(spec, out_path, seed, limit, restore, solutions_dir):
    import contextlib
    import importlib
    import io
    import json
    import random
    import signal

    sys.setprofile(None)
    sys.settrace(None)
    patched_before = restore()
    for name in [m for m in sys.modules if m == "course_lib" or m.startswith("course_lib.")]:
        del sys.modules[name]
    checks = importlib.import_module("course_lib.checks")
    common = sys.modules["course_lib.checks._common"]
    import numpy
    import torch
    from IPython import get_ipython

    user_ns = get_ipython().user_ns
    ours = [m for n, m in sys.modules.items() if n.startswith("course_lib")]
    originals = {id(m): dict(vars(m)) for m in ours}

    class GraderTimeout(BaseException):
        """Not an Exception: the checkers' and most learners' ``except Exception`` let it through."""

    def on_alarm(signum, frame):
        raise GraderTimeout(f"the checker did not finish within {limit:g} s (an endless loop?)")

    signal.signal(signal.SIGALRM, on_alarm)
    used_solutions = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(solutions_dir):
            used_solutions.append(frame.f_code.co_name)
        return None

    results = {"patched_before": patched_before, "exercises": {}}
    for ex in spec:
        outcome, message = "failed", ""
        if ex["name"] not in user_ns:
            outcome, message = "missing", f"`{ex['name']}` is not defined: the exercise cell is missing."
        else:
            namespace = dict(user_ns)
            namespace["_grader_checker_"] = getattr(checks, ex["checker"])
            call = f"_grader_checker_({', '.join([ex['name']] + ex['args'])})"
            torch.manual_seed(seed)
            random.seed(seed)
            numpy.random.seed(seed)
            before, printed = len(common.RESULTS), io.StringIO()
            used_solutions.clear()
            signal.setitimer(signal.ITIMER_REAL, limit)
            sys.settrace(tracer)
            try:
                with contextlib.redirect_stdout(printed):
                    eval(call, namespace)
            except GraderTimeout as err:
                message = f"Timed out: {err}."
            except BaseException as err:  # noqa: BLE001 (a learner's SystemExit or anything else)
                message = str(err) or type(err).__name__
            finally:
                sys.settrace(None)
                signal.setitimer(signal.ITIMER_REAL, 0)
            new = common.RESULTS[before:]
            if not message and len(new) == 1:
                outcome = new[0].outcome
            tampered = restore() + [
                f"{m.__name__}.{k}" for m in ours for k, v in originals[id(m)].items()
                if vars(m).get(k) is not v]
            for m in ours:  # put the checkers back for the next exercise
                vars(m).update(originals[id(m)])
            if tampered:
                outcome, message = "failed", ("Your code changed " + ", ".join(sorted(set(tampered))[:3])
                                              + " while it was being checked; it is graded 0.")
            elif used_solutions and outcome == "passed":
                outcome, message = "failed", ("Your code calls course_lib's solutions instead of "
                                              "computing the answer itself; it is graded 0.")
            elif outcome == "passed":
                message = printed.getvalue().strip()
            elif not message:
                message = printed.getvalue().strip() or "the checker did not run"
        results["exercises"][ex["key"]] = {"outcome": outcome, "message": message}
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(results, f)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return results
