"""The bubblewrap sandbox around each kernel (#49), run as the grader builds it (runner._sandbox_command),
with a short Python program in place of the kernel; skipped where bwrap cannot run.

- With TMPDIR outside /tmp (/var/tmp, a cluster's scratch) the grader's scratch root is hidden: a
  kernel sees only its own scratch folder there, not a sibling's ``ipc/kernel.json`` (whose key
  would let it run code in that kernel), and cannot write beside it.
- The sandbox's /tmp and /dev/shm are tmpfs (RAM) of a bounded size: a write beyond it fails with
  ENOSPC in the sandbox, and /dev itself is read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_lib.grading import runner
from course_lib.grading.cli import choose_sandbox

pytestmark = pytest.mark.skipif(choose_sandbox("auto")[0] != "bwrap", reason="bubblewrap cannot run here")


@pytest.fixture
def outside_tmp():
    """A run's scratch root outside /tmp (the grader's, under TMPDIR=/var/tmp), removed after."""
    for base in ("/var/tmp", str(Path.home())):
        if base.startswith("/tmp") or not os.access(base, os.W_OK):
            continue
        root = Path(tempfile.mkdtemp(prefix="grade-run-", dir=base))
        try:
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    pytest.skip("no writable folder outside /tmp")


def _scratch(root: Path, name: str) -> Path:
    scratch = root / name
    (scratch / "work").mkdir(parents=True)
    (scratch / "ipc").mkdir()
    (scratch / "ipc" / "kernel.json").write_text(json.dumps({"key": f"secret-of-{name}"}), encoding="utf-8")
    return scratch


def _in_sandbox(scratch: Path, code: str, settings: runner.Settings | None = None) -> dict:
    command = runner._sandbox_command(scratch, scratch / "ipc", settings or runner.Settings(sandbox="bwrap"))
    done = subprocess.run([*command, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_kernel_sees_only_its_own_scratch_folder_outside_tmp(outside_tmp):
    mine, sibling = _scratch(outside_tmp, "grade-aaaa-1"), _scratch(outside_tmp, "grade-bbbb-2")
    code = f"""
import errno, json, os
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
root, mine, sibling = {str(outside_tmp)!r}, {str(mine)!r}, {str(sibling)!r}
found = {{
    "listed": sorted(os.listdir(root)),
    "read sibling": attempt(lambda: open(sibling + "/ipc/kernel.json").read()),
    "list sibling": attempt(lambda: os.listdir(sibling)),
    "write beside": attempt(lambda: open(root + "/planted", "w").close()),
    "make sibling": attempt(lambda: os.makedirs(sibling + "/ipc")),
    "write own": attempt(lambda: open(mine + "/work/answer.txt", "w").write("mine")),
    "read own": open(mine + "/ipc/kernel.json").read(),
}}
print(json.dumps(found))
"""
    found = _in_sandbox(mine, code)
    assert found == {"listed": [mine.name], "read sibling": "ENOENT", "list sibling": "ENOENT",
                     "write beside": "EROFS", "make sibling": "EROFS", "write own": "ok",
                     "read own": json.dumps({"key": "secret-of-grade-aaaa-1"})}, found
    # outside the sandbox nothing changed: the sibling's folder is whole, only the kernel's own file is new
    assert json.loads((sibling / "ipc" / "kernel.json").read_text(encoding="utf-8"))["key"] == "secret-of-grade-bbbb-2"
    assert sorted(p.name for p in outside_tmp.iterdir()) == ["grade-aaaa-1", "grade-bbbb-2"]
    assert (mine / "work" / "answer.txt").read_text(encoding="utf-8") == "mine"


WRITE = """
import errno, json
def fill(path, mib):
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * 2**20)
                f.flush()
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
print(json.dumps({"tmp": fill("/tmp/big", MIB), "shm": fill("/dev/shm/big", MIB),
                  "tmp small": fill("/tmp/small", 0), "dev": attempt(lambda: open("/dev/planted", "w").close()),
                  "dev null": attempt(lambda: open("/dev/null", "w").write("x"))}))
"""


def test_tmp_and_shm_are_bounded_in_the_sandbox(tmp_path):
    assert (runner.Settings().tmp_bytes, runner.Settings().shm_bytes) == (256 * 2**20, 64 * 2**20)
    scratch = _scratch(tmp_path, "grade-cccc-3")
    found = _in_sandbox(scratch, WRITE.replace("MIB", "300"))  # the default limits: 256 MiB and 64 MiB
    assert found == {"tmp": "ENOSPC", "shm": "ENOSPC", "tmp small": "ok", "dev": "EROFS", "dev null": "ok"}, found
    small = runner.Settings(sandbox="bwrap", tmp_bytes=8 * 2**20, shm_bytes=8 * 2**20)
    assert _in_sandbox(scratch, WRITE.replace("MIB", "6"), small)["tmp"] == "ok"  # under the limit
    assert _in_sandbox(scratch, WRITE.replace("MIB", "9"), small)["tmp"] == "ENOSPC"


def test_a_graded_kernel_cannot_reach_a_sibling_with_tmpdir_outside_tmp(outside_tmp):
    """The same through the grader: lesson 00 graded with its scratch root under /var/tmp (what
    TMPDIR=/var/tmp gives ``python -m course_lib.grading``) next to another kernel's folder; the
    learner's answer is right only if the kernel sees nothing of it, in the notebook's run and in the
    re-check."""
    import nbformat
    from grade_class import L00, lesson, solve

    from course_lib.solutions import lesson00

    sibling = _scratch(outside_tmp, "grade-other-1")
    spy = (f"def predicted_parameter_count():\n"
           f"    import os\n"
           f"    seen = os.listdir({str(outside_tmp)!r})\n"
           f"    try:\n"
           f"        open({str(sibling / 'ipc' / 'kernel.json')!r}).read()\n"
           f"        return -1  # another kernel's key: it could run code there\n"
           f"    except OSError:\n"
           f"        pass\n"
           f"    return {lesson00.predicted_parameter_count()} if len(seen) == 1 else -2\n")
    nb = solve(solve(lesson("00"), *L00), "00.parameters", source=spy)
    path = outside_tmp.parent / f"{outside_tmp.name}-spy.ipynb"
    try:
        path.write_text(nbformat.writes(nb), encoding="utf-8")
        row = runner.grade_submission(path, runner.Settings(sandbox="bwrap", scratch_root=str(outside_tmp),
                                                            cell_timeout=120))
    finally:
        path.unlink(missing_ok=True)
    assert (row.status, row.marks()) == ("graded", {key: 1 for key in L00}), (row.status, row.results, row.notes)
    assert sorted(p.name for p in outside_tmp.iterdir()) == ["grade-other-1"]  # its own folder removed


def test_the_command_without_size_and_under_tmp(monkeypatch):
    """Where bwrap cannot size a tmpfs (before 0.7.0, or setuid) the command has no --size and still
    hides the scratch root; under /tmp the private /tmp hides it and no other folder is emptied."""
    elsewhere = Path("/var/tmp/grade-run-x/grade-1")
    monkeypatch.setattr(runner, "_bwrap_sizes", lambda: False)
    command = runner._sandbox_command(elsewhere, elsewhere / "ipc", runner.Settings(sandbox="bwrap"))
    assert "--size" not in command
    assert " --tmpfs /var/tmp/grade-run-x " in " ".join(command)
    assert " --remount-ro /var/tmp/grade-run-x " in " ".join(command)
    monkeypatch.setattr(runner, "_bwrap_sizes", lambda: True)
    under_tmp = Path("/tmp/grade-run-x/grade-1")
    command = " ".join(runner._sandbox_command(under_tmp, under_tmp / "ipc", runner.Settings(sandbox="bwrap")))
    assert f"--size {256 * 2**20} --tmpfs /tmp " in command and f"--size {64 * 2**20} --tmpfs /dev/shm " in command
    assert "grade-run-x " not in command and "--remount-ro /dev " in command
