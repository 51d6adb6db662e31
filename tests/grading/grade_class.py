"""A generated class of submissions for the grader's test, each with the row it must get.

    python tests/grading/grade_class.py FOLDER     writes the class to FOLDER (to try `make grade` on it)

Submissions are lesson notebooks edited programmatically: a stub replaced by its solution
(course_lib.solutions) or by a known mistake (the wrong answers of tests/checks/test_lesson*.py), cells
added, edited, deleted or moved. All are lesson 00 (the shortest lesson to run: about 7 s a kernel on
a busy 2-core machine) but one of lesson 01 (24 s), which makes two lessons. The ``slow`` submissions
need a short cell time limit (an endless loop) and are graded in a second run, without the sandbox,
with the kernel that kills its grader's worker (``build_killer``).

Each kernel costs seconds (a fresh Python, torch, course_lib), so where the grader's path is the same,
one notebook carries several cases, one per exercise (or cells that must change nothing, together):
``Submission.cases`` names them, and its expected row is what each case alone gives its exercise.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from course_lib.solutions import solution_source

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
L00 = ["00.broadcast", "00.gradient", "00.parameters"]
L01 = ["01.top_key", "01.nan_rows", "01.attention", "01.fixed_attention", "01.padding_mask"]
L02 = ["02.parameters", "02.split_heads", "02.merge_heads", "02.view", "02.sliced_attention"]
# Wrong predictions of 00.gradient (x = [1, 2, 3], y = sum x_i^2), one per mistake its checker names.
GRADIENT_MISTAKES = {
    "none": ("None", "None is what x.grad holds BEFORE any backward"),
    "squares": ("[1.0, 4.0, 9.0]", "are the values x_i ** 2, not their slopes"),
    "x_itself": ("[1.0, 2.0, 3.0]", "is x itself"),
    "twos": ("[2.0, 2.0, 2.0]", "2 for every element drops the x"),
    "ones": ("[1.0, 1.0, 1.0]", "All ones is the gradient of a plain sum"),
    "twice": ("[4.0, 8.0, 12.0]", "is twice the gradient"),
    "zeros": ("[0.0, 0.0, 0.0]", "All zeros would mean y does not change"),
    "one_number": ("[14.0]", "x has 3 elements, so x.grad has 3 numbers"),
}
# The mistakes graded as submissions: each takes a kernel, and the grader's path is the same for all
# (a failed check, its message and mistake name carried out of the kernel); squares is the one other
# tests pick (feedback, shards, Gradescope), None the one answer that is not a list of numbers.
# tests/grading/test_grade.py puts the checker's verdict on every one of them through the report in-process.
# squares is graded alone (mistake_squares); none shares a notebook with a faked broadcast exercise.
KERNEL_MISTAKES = ("squares", "none")


@dataclass
class Submission:
    student: str
    content: str  # the file's text
    lesson: str
    marks: dict[str, int]  # expected grades.csv cells of its lesson
    status: str
    suffix: str = ".ipynb"
    cases: tuple[str, ...] = ()  # the cases it carries (one per exercise, or harmless cells together)

    def __post_init__(self):
        self.cases = self.cases or (self.student,)


def lesson(number: str) -> nbformat.NotebookNode:
    return copy.deepcopy(nbformat.read(next(NOTEBOOKS.glob(f"{number}_*.ipynb")), as_version=4))


def solve(nb, *keys: str, source: str | None = None) -> nbformat.NotebookNode:
    """Replace the stubs of ``keys`` by their solutions (or by ``source``)."""
    for cell in nb.cells:
        key = cell.get("metadata", {}).get("exercise")
        if key in keys:
            cell.source = source if source is not None else solution_source(key)
    return nb


def index_of(nb, text: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and text in c.source)


def insert_after(nb, text: str, source: str) -> nbformat.NotebookNode:
    """Add a code cell after the first code cell containing ``text``."""
    nb.cells.insert(index_of(nb, text) + 1, new_code_cell(source))
    return nb


def edit(nb, text: str, source: str) -> nbformat.NotebookNode:
    nb.cells[index_of(nb, text)].source = source
    return nb


IMPORTS = "from course_lib.checks import ("  # the import cell of lessons 00-02
GRADIENT = "def predicted_gradient():\n    return {}\n"


def build() -> tuple[list[Submission], list[Submission]]:
    """(the class graded with the usual limits, the submissions graded with a short cell limit)."""
    s: list[Submission] = []

    def add(student, nb, marks, status="graded", lesson_id="00", cases=()):
        keys = {"00": L00, "01": L01, "02": L02}[lesson_id]
        s.append(Submission(student, nbformat.writes(nb), lesson_id, dict(zip(keys, marks)), status,
                            cases=cases))

    add("correct", solve(lesson("00"), *L00), [1, 1, 1])
    add("partial", solve(lesson("00"), "00.broadcast"), [1, 0, 0])  # and two exercises not attempted
    name = KERNEL_MISTAKES[0]  # (the other one: fake_deleted_check_mistake_none below)
    add(f"mistake_{name}", solve(solve(lesson("00"), *L00), "00.gradient",
                                 source=GRADIENT.format(GRADIENT_MISTAKES[name][0])), [1, 0, 1])
    # right in another style (a list, a tensor), and the solution of 00.broadcast shown before it
    peek = solve(lesson("00"), *L00)
    edit(peek, "def predicted_broadcast_shape", "def predicted_broadcast_shape():\n    return [2, 3, 4]\n")
    edit(peek, "def predicted_gradient", "def predicted_gradient():\n    return torch.tensor([2., 4., 6.])\n")
    peek.cells.insert(index_of(peek, "def predicted_broadcast_shape"), new_code_cell('show_solution("00.broadcast")'))
    add("peeked", peek, [1, 1, 1], cases=("correct_other_style", "peeked"))
    # cells that must change nothing, together: exercise metadata stripped, sys.exit, files deleted
    stripped = solve(lesson("00"), *L00)
    for cell in stripped.cells:
        cell.metadata.pop("exercise", None)
    insert_after(stripped, IMPORTS, "import os\nfor f in os.listdir('.'):\n    os.remove(f)")
    insert_after(stripped, IMPORTS, "import sys\nsys.exit('bye')")
    add("metadata_stripped", stripped, [1, 1, 1], cases=("metadata_stripped", "sys_exit", "deletes_files"))

    wrong = "def predicted_broadcast_shape():\n    return (3, 1, 4)\n"
    fake = solve(solve(lesson("00"), "00.parameters"), "00.broadcast", source=wrong)
    del fake.cells[index_of(fake, "check_broadcast_shape(")]
    solve(fake, "00.gradient", source=GRADIENT.format(GRADIENT_MISTAKES[KERNEL_MISTAKES[1]][0]))
    add("fake_deleted_check_mistake_none", fake, [0, 0, 1], cases=("fake_deleted_check", "mistake_none"))
    fake = solve(solve(lesson("00"), "00.gradient", "00.parameters"), "00.broadcast", source=wrong)
    insert_after(fake, IMPORTS, "import course_lib.checks as checks\nfrom course_lib.checks import common\n"
                 "has_passed = checks.has_passed = common.has_passed = lambda obj: True\n"
                 "check_broadcast_shape = checks.check_broadcast_shape = lambda *args: print('right')\n"
                 "common.compare = lambda *args, **kwargs: None")
    add("fake_monkeypatch", fake, [0, 1, 1])
    # torch patched for 00.broadcast; course_lib's reference answer for 00.parameters
    fake = solve(solve(lesson("00"), "00.gradient"), "00.broadcast", source=wrong)
    insert_after(fake, IMPORTS, "torch.broadcast_shapes = lambda *shapes: torch.Size([3, 1, 4])")
    solve(fake, "00.parameters",
          source='def predicted_parameter_count():\n    return predicted_answer("00.parameters")\n')
    add("fake_patched_torch_reference_answer", fake, [0, 1, 0],
        cases=("fake_patched_torch", "fake_reference_answer"))
    # compare patched while 00.broadcast is checked; 00.parameters wrong, its check cell edited to say right
    fake = solve(lesson("00"), "00.gradient", "00.parameters")
    insert_after(fake, "def predicted_broadcast_shape", "def predicted_broadcast_shape():\n"
                 "    import course_lib.checks.common as c\n"
                 "    c.compare = lambda *a, **k: None\n    return (3, 1, 4)\n")
    solve(fake, "00.parameters", source="def predicted_parameter_count():\n    return 7\n")
    edit(fake, "check_parameter_count(", 'print("check_parameter_count: right, 7.")')
    add("fake_patch_while_checked_edited_check", fake, [0, 1, 0],
        cases=("fake_patch_while_checked", "fake_edited_check"))

    s.append(Submission("not_a_notebook", "this is my homework, sorry, Word ate it\n", "", {}, "not a notebook"))
    other = new_notebook(cells=[new_code_cell("print('a notebook of another course')")])
    s.append(Submission("other_course", nbformat.writes(other), "", {}, "unknown lesson"))
    gone = solve(lesson("00"), *L00)
    del gone.cells[index_of(gone, "class TwoLayer")]
    add("deleted_cells", gone, [1, 1, 0], "cells deleted")
    moved = solve(lesson("00"), *L00)
    i = index_of(moved, "class TwoLayer")
    moved.cells.append(moved.cells.pop(i))
    add("reordered_cells", moved, [1, 1, 1], "cells reordered")  # TwoLayer is defined by the re-check
    add("memory_hog", insert_after(solve(lesson("00"), *L00), IMPORTS,
                                   "hog = torch.ones(20 * 2**30, dtype=torch.uint8)"), [1, 1, 1], "memory limit")
    add("os_exit", insert_after(solve(lesson("00"), *L00), IMPORTS, "import os\nos._exit(3)"),
        [0, 0, 0], "kernel died")
    add("segfault", insert_after(solve(lesson("00"), *L00), IMPORTS, "import ctypes\nctypes.string_at(0)"),
        [0, 0, 0], "kernel died")
    add("huge_output", insert_after(solve(lesson("00"), *L00), IMPORTS,
                                    "for i in range(60_000):\n    print('spam ' * 20)"), [1, 1, 1],
        "output too large")

    # --- issue 40: processes, kernels, sabotage, fakes ------------------------------------------
    # json.dumps is also what the kernel's own messages are made with: the kernel stops talking
    add("sabotage_json", insert_after(solve(lesson("00"), *L00), IMPORTS,
                                      'import json\njson.dump = lambda o, fp, *a, **k: fp.write("{")\n'
                                      'json.dumps = lambda *a, **k: "{"'), [0, 0, 0], "kernel died")
    add("forged_results", insert_after(solve(lesson("00"), *L00), IMPORTS, FORGE), [0, 0, 0], "results forged")
    add("frame_swap", insert_after(solve(lesson("00"), "00.parameters"), "def predicted_broadcast_shape",
                                   FRAME_SWAP), [0, 0, 1])
    # (b) an imported solution renamed, (d) the reference on a thread started before, (a) a solution
    # block exec'd from the solutions file: one exercise each
    fakes = solve(lesson("00"), "00.broadcast", source=RENAMED)
    fakes = solve(insert_after(fakes, "def predicted_gradient", THREAD_POOL), "00.parameters", source=EXEC_FILE)
    add("fakes_b_d_a", fakes, [0, 0, 0])
    # (f) a stub moved after its check cell, (d) the reference on a thread started while it is checked
    moved = solve(lesson("00"), *L00)
    i = index_of(moved, "def predicted_parameter_count")
    moved.cells.insert(index_of(moved, "check_parameter_count(") + 1, new_code_cell(moved.cells.pop(i).source))
    add("fakes_f_d", insert_after(moved, "def predicted_gradient", THREAD_NEW), [1, 0, 0], "stub moved")
    # (h) without the sandbox: its answer in a cell that ran earlier, found on disk in any scratch
    # folder of the run (a notebook copy, a history file) would be copied: nothing holds it
    # ... in the notebook that also starts processes every way (they must all be ended)
    copier = solve(lesson("00"), "00.gradient", "00.parameters")
    insert_after(copier, IMPORTS, SPAWN)
    insert_after(copier, IMPORTS, "# scratch canary 8675309\nanswer = (2, 3, 4)")
    add("spawns_and_copies_from_scratch", solve(copier, "00.broadcast", source=SCRATCH_COPY), [0, 1, 1],
        cases=("spawns_processes", "copies_from_scratch"))
    # (c) inspect.getsource of course_lib's reference, exec'd under the learner's name; and a lesson
    # other than 00, partly solved, graded with its own exercises (one notebook: a lesson-01 kernel
    # costs three of lesson 00's)
    reference = solve(lesson("01"), "01.padding_mask", "01.top_key")
    edit(reference, "def my_attention", "my_attention = scaled_dot_product_attention  # course_lib's")
    edit(reference, "def fixed_attention", GETSOURCE)
    add("lesson01_reference_pasted", reference, [1, 0, 0, 0, 1], lesson_id="01",
        cases=("reference_pasted", "other_lesson_partly_solved"))

    slow = [Submission("endless_loop", nbformat.writes(solve(solve(lesson("00"), *L00), "00.gradient",
                       source="def predicted_gradient():\n    while True:\n        pass\n")),
                       "00", dict(zip(L00, [1, 0, 1])), "timeout")]
    return s, slow


def build_sandboxed() -> list[Submission]:
    """Cases only the sandbox can hold: the class folder (another learner's notebook replaced, a file
    added) and (h) another learner's answer copied from their scratch folder."""
    nb = insert_after(solve(solve(lesson("00"), *L00), "00.broadcast", source=COPY_OTHERS), IMPORTS, TAMPER)
    return [Submission("tamper_and_copy", nbformat.writes(nb), "00", dict(zip(L00, [0, 1, 1])), "graded")]


def build_plain() -> list[Submission]:
    """The class graded with --sandbox none: the process and sabotage cases."""
    main, _ = build()
    keep = {"spawns_and_copies_from_scratch", "forged_results"}
    return [sub for sub in main if sub.student in keep]


def build_killer() -> list[Submission]:
    """A kernel that kills its grader's worker, graded with --sandbox none (with the sandbox its
    parent is the sandbox's init, which it cannot kill). Its worker's pool breaks, and every
    submission in flight in it is graded again alone: so it is graded beside the endless loop, one
    worker, after it, and not beside the plain class (each of whose kernels it would cost a second run)."""
    return [Submission("kills_grader", nbformat.writes(insert_after(solve(lesson("00"), *L00), IMPORTS,
                                                                    "import os, signal\nos.kill(os.getppid(), "
                                                                    "signal.SIGKILL)")),
                       "", {}, "grader error")]


MARK = "4242"  # in the command line of every process the class starts: the test looks for it after
SPAWN = f"""import os, subprocess
subprocess.Popen(["sleep", "{MARK}.1"])
subprocess.Popen(["sleep", "{MARK}.2"], start_new_session=True)
subprocess.Popen(["sh", "-c", "(setsid sleep {MARK}.3 &) ; exit 0"])
if os.fork() == 0:
    os.execvp("sleep", ["sleep", "{MARK}.4"])
import tempfile
tempfile.mkstemp()
"""
FORGE = """import threading, time
from IPython.display import publish_display_data
def _forge():
    while True:
        publish_display_data({"application/vnd.course-grader+json": '{"seq": 0}'})
        time.sleep(0.02)
threading.Thread(target=_forge, daemon=True).start()
"""
FRAME_SWAP = """def predicted_broadcast_shape():
    import sys
    f = sys._getframe(1)
    while f is not None:  # the re-check's frame: mark every exercise passed
        found = f.f_locals.get("results")
        if isinstance(found, dict) and isinstance(found.get("exercises"), dict):
            for key in ("00.broadcast", "00.gradient", "00.parameters"):
                found["exercises"][key] = {"outcome": "passed", "message": "", "mistake": "", "site": ""}
        f = f.f_back
    return (3, 1, 4)
"""
EXEC_FILE = """import course_lib.solutions
exec(open(course_lib.solutions.__path__[0] + "/lesson00.py").read().split("# %% solution 00.parameters")[1])
"""
RENAMED = """from course_lib.solutions.lesson00 import predicted_broadcast_shape
predicted_broadcast_shape.__code__ = predicted_broadcast_shape.__code__.replace(co_filename="<ipython-input-3>")
"""
THREAD_NEW = """from concurrent.futures import ThreadPoolExecutor
def predicted_gradient():
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(predicted_answer, "00.gradient").result()
"""
THREAD_POOL = """from concurrent.futures import ThreadPoolExecutor
_pool = ThreadPoolExecutor(1)
_pool.submit(print, "ready").result()
def predicted_gradient():
    return _pool.submit(predicted_answer, "00.gradient").result()
"""
GETSOURCE = """import inspect
import course_lib.attention
_ns = dict(vars(course_lib.attention), __name__="__main__")  # its helpers, under the learner's name
exec(inspect.getsource(course_lib.attention.scaled_dot_product_attention).replace(
    "def scaled_dot_product_attention", "def fixed_attention"), _ns)
fixed_attention = _ns["fixed_attention"]
"""
TAMPER = """import pathlib
try:  # another learner's notebook replaced, a file added: the sandbox shows neither folder
    folder = pathlib.Path(CLASS_DIR)
    (folder / "correct.ipynb").write_text("{}")
    (folder / "added.ipynb").write_text("{}")
except OSError as err:
    print("could not:", type(err).__name__)
""".replace("CLASS_DIR", "{class_dir!r}")
SCRATCH_COPY = """import os, pathlib
_needle = ("scratch canary " + "8675309").encode()  # a cell that ran before, if it is kept on disk
_found = []
for _p in pathlib.Path(os.environ["TMPDIR"]).parents[1].rglob("*"):  # every scratch folder of the run
    try:
        if _p.is_file() and _p.stat().st_size < 2**26 and _needle in _p.read_bytes():
            _found.append(str(_p))
    except OSError:
        pass
print("found on disk:", _found)
def predicted_broadcast_shape():
    if not _found:
        raise NotImplementedError
    return answer
"""
COPY_OTHERS = """import glob, json
def predicted_broadcast_shape():
    raise NotImplementedError
for path in glob.glob("/tmp/**/*.ipynb", recursive=True):  # another learner's scratch copy
    try:
        for cell in json.load(open(path))["cells"]:
            text = "".join(cell["source"])
            if "def predicted_broadcast_shape" in text and "NotImplemented" not in text:
                exec(text)
    except Exception:
        pass
"""


def write(submissions: list[Submission], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for sub in submissions:
        path = folder / f"{sub.student}{sub.suffix}"
        content = sub.content.replace("{class_dir!r}", repr(str(folder.resolve())).replace("'", '\\"'))
        path.write_text(content, encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    main_class, slow_class = build()
    write(main_class + slow_class, Path(sys.argv[1]))
    print(f"wrote {len(main_class) + len(slow_class)} submissions to {sys.argv[1]}")
