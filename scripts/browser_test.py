"""Check every lesson in a real browser: JupyterLab and the exported HTML, in headless Chromium.

    python scripts/browser_test.py notebooks/*.ipynb        (`make test-browser`)

Two passes, both offline (the pages get no network):

1. **JupyterLab.** Serves JupyterLab of this environment on 127.0.0.1 from a throw-away copy of the
   lessons (build/browser/lab/notebooks: no images/ folder beside it, as for a lesson opened on its
   own), trusted in a throw-away Jupyter data folder, and opens each lesson. Opening the *stored*
   outputs trusted runs their JavaScript exactly as running the cell does (Jupyter renders the same
   output through the same renderer), and `make test` has already re-run every lesson with strict
   nbval, which fails on an error and on any output that differs from the stored one. So this pass
   checks what only a browser can see, in about a minute instead of re-running every lesson.
2. **Exported HTML** (nbconvert, the lab template: what a learner, GitHub-like viewer or a course
   page shows from the stored notebook), opened from file:// with the network off.

The pages are checked in N lanes at once (`--jobs N`, default 2; `--jobs 1`: one after the other),
each lane with its own headless Chromium, all sharing one JupyterLab server and one queue of pages
(longest first): a page spends much of its time waiting rather than computing (for JupyterLab to
render and size its cells, in the pauses between scrolls and screenshots), so two lanes overlap the
waits. The results are printed in the same order whatever the number of lanes.

Fails on: an error output, a JavaScript error, an image that does not load, a bertviz view that
draws no SVG with token labels, and (JupyterLab) math left as raw TeX. Screenshots of each lesson
(its top and every bertviz view) go to build/screenshots/ (git-ignored).

Predict exercises (JupyterLab pass): for every reveal cell (metadata "reveals", see
tests/notebooks/test_exercises.py) the lesson is scrolled to the question, as a learner reaches it, and
screenshotted to build/screenshots/predict/<lesson>-<key>.png. Fails if the reveal cell shows an output
before it is run, or if its explanation is not in a closed <details> block.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

import nbformat
from nbconvert import HTMLExporter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cdp import Browser, Page, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "browser"
SHOTS = ROOT / "build" / "screenshots"

# Evaluated in the page: everything the checks need, as JSON-able values.
INSPECT_JS = r"""
(() => {
  const scope = document.querySelector(SCOPE) || document.body;
  const short = s => (s || '').slice(0, 120);
  const images = Array.from(scope.querySelectorAll('img'))
    .filter(img => !(img.complete && img.naturalWidth > 0))
    .map(img => short(img.getAttribute('src')));
  const views = Array.from(scope.querySelectorAll('div[id^="bertviz-"]')).map(div => ({
    id: div.id.slice(0, 16),
    labels: div.querySelectorAll('svg text').length,
    note: !!div.querySelector('.course-bertviz-note'),
  }));
  const tex = [];
  for (const md of scope.querySelectorAll(MARKDOWN)) {
    const copy = md.cloneNode(true);
    copy.querySelectorAll('code, pre, mjx-container, .MathJax, script, style, mjx-assistive-mml')
      .forEach(node => node.remove());
    const text = copy.textContent;
    const match = text.match(/\$[^$\n]+\$|\\\(|\\\[|\\(frac|sqrt|mathrm|mathbf|text|cdot|sum|top|begin)\b/);
    if (match) {
      const at = Math.max(0, match.index - 40);
      tex.push(text.slice(at, match.index + 60).replace(/\s+/g, ' '));
    }
  }
  const jsErrors = Array.from(scope.querySelectorAll('.jp-OutputArea-output'))
    .map(o => o.textContent)
    .filter(t => /Javascript Error|require is not defined/.test(t))
    .map(short);
  const tracebacks = Array.from(scope.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(o => o.textContent).filter(t => /Traceback|Error:/.test(t)).map(short);
  return {images, views, tex, jsErrors, tracebacks,
          cells: scope.querySelectorAll('.jp-Cell').length};
})()
"""


def inspect(page: Page, scope: str, markdown: str) -> dict:
    code = INSPECT_JS.replace("SCOPE", json.dumps(scope)).replace("MARKDOWN", json.dumps(markdown))
    return page.evaluate(code)


def stored_problems(path: Path) -> tuple[list[str], list[str]]:
    """Error outputs (failures) and stderr streams (warnings: JupyterLab shows them in pink)."""
    nb = nbformat.read(path, as_version=4)
    errors, warnings = [], []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                errors.append(f"cell {index}: stored error output {output.ename}: {output.evalue}")
            elif output.output_type == "stream" and output.name == "stderr":
                warnings.append(f"cell {index}: stderr output: {output.text.strip()[:80]!r}")
    return errors, warnings


def problems_from(report: dict, js_errors: list[str], expect_cells: int | None) -> list[str]:
    found = [f"image does not load: {src}" for src in report["images"]]
    for view in report["views"]:
        if view["labels"] == 0 or view["note"]:
            found.append(f"bertviz view {view['id']} drew nothing")
    found += [f"raw TeX: ...{snippet}..." for snippet in report["tex"]]
    found += [f"JavaScript error in an output: {text}" for text in report["jsErrors"]]
    found += [f"error output: {text}" for text in report["tracebacks"]]
    found += [f"JavaScript error: {text}" for text in js_errors]
    if expect_cells is not None and report["cells"] != expect_cells:
        found.append(f"{report['cells']} cells rendered, expected {expect_cells}")
    return found


# A neuron view shows its computation once a token is hovered and its (+) clicked: do that for the
# third token, so that the screenshot shows query, key, q x k, q . k and softmax.
EXPAND_NEURON_VIEW_JS = r"""
(() => {
  const root = document.querySelectorAll('div[id^="bertviz-"]')[INDEX];
  if (!root.querySelector('#att_head')) return false;
  const over = el => el && el.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
  const token = root.querySelectorAll('#collapsed #leftText > g')[2];
  if (!token) return false;
  over(token);
  const plus = token.querySelectorAll('rect');
  plus[plus.length - 1].dispatchEvent(new MouseEvent('click', {bubbles: true}));
  over(root.querySelectorAll('#expanded #leftText > g')[2]);
  return true;
})()
"""


def screenshots(page: Page, stem: str, folder: Path, scroll_top_js: str) -> list[Path]:
    """The top of the lesson, then every bertviz view scrolled into view."""
    shots = []
    page.evaluate(scroll_top_js)
    time.sleep(0.5)
    shots.append(folder / f"{stem}.png")
    page.screenshot(shots[-1])
    count = page.evaluate("document.querySelectorAll('div[id^=\"bertviz-\"]').length")
    for k in range(count):
        for _ in range(3):  # JupyterLab sizes cells lazily: the target moves while we scroll
            page.evaluate(f"document.querySelectorAll('div[id^=\"bertviz-\"]')[{k}]"
                          ".scrollIntoView({block: 'start'})")
            time.sleep(0.3)
        page.evaluate(EXPAND_NEURON_VIEW_JS.replace("INDEX", str(k)))
        time.sleep(0.5)
        shots.append(folder / f"{stem}-bertviz-{k + 1}.png")
        page.screenshot(shots[-1])
    return shots


# What the learner sees at a Predict exercise: the reveal cell's outputs and the <details> after it.
PREDICT_JS = r"""
(() => {
  const cells = document.querySelectorAll(SCOPE + ' .jp-Cell');
  const reveal = cells[REVEAL], explain = cells[REVEAL + 1];
  const details = explain ? explain.querySelector('details') : null;
  return {
    outputs: reveal ? reveal.querySelectorAll('.jp-OutputArea-output').length : -1,
    details: !!details,
    open: !!(details && details.open),
  };
})()
"""


def predictions(path: Path) -> list[tuple[str, int, int]]:
    """``(key, first cell to show, reveal cell)`` for each reveal cell of the notebook: the question
    starts at the markdown above the exercise's stub (or above the reveal cell, for a prediction
    asked in the prose)."""
    nb = nbformat.read(path, as_version=4)
    stubs = {c.metadata["exercise"]: i for i, c in enumerate(nb.cells)
             if c.get("metadata", {}).get("exercise")}
    found = []
    for index, cell in enumerate(nb.cells):
        key = cell.get("metadata", {}).get("reveals")
        if key:
            start = stubs.get(key, index)
            top = next((j for j in range(start - 1, -1, -1) if nb.cells[j].cell_type == "markdown"),
                       start)
            found.append((key, top, index))
    return found


def check_predictions(page: Page, path: Path, scope: str) -> list[str]:
    """Scroll to each Predict exercise, check that its answer is hidden, and screenshot it."""
    folder = SHOTS / "predict"
    folder.mkdir(parents=True, exist_ok=True)
    found = []
    for key, top, reveal in predictions(path):
        for _ in range(3):  # JupyterLab sizes cells lazily: the target moves while we scroll
            page.evaluate(f"document.querySelectorAll('{scope} .jp-Cell')[{top}]"
                          ".scrollIntoView({block: 'start'})")
            time.sleep(0.3)
        state = page.evaluate(PREDICT_JS.replace("SCOPE", json.dumps(scope))
                              .replace("REVEAL", str(reveal)))
        if state["outputs"] != 0:
            found.append(f"{key}: the reveal cell (cell {reveal}) shows {state['outputs']} "
                         "outputs before the learner runs it")
        if not state["details"] or state["open"]:
            found.append(f"{key}: the explanation after cell {reveal} is not a closed <details>")
        page.screenshot(folder / f"{path.stem}-{key}.png")
    return found


# ----------------------------------------------------------------------------------------------
# Pass 1: JupyterLab


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(base: Path) -> dict:
    env = dict(os.environ)
    for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                      ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                      ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[name] = str(base / sub)
        (base / sub).mkdir(parents=True, exist_ok=True)
    env["HF_HUB_OFFLINE"] = "1"
    # No news and no update check: nothing in the page goes to the internet.
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return env


class Lab:
    """One JupyterLab server for the whole run, shared by the lanes: each lane opens its pages in
    its own workspace, so that no lane restores another's open notebook."""

    def __init__(self, root: Path, env: dict):
        self.port = free_port()
        self.log = open(BUILD / "jupyterlab.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", f"--ServerApp.root_dir={root}",
             "--IdentityProvider.token=", "--ServerApp.password=",
             "--ServerApp.disable_check_xsrf=True", "--LabApp.news_url=None",
             *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI runs as root
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=root)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self):
        """Until the server answers (it starts in a few seconds: do something else meanwhile)."""
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited; see {BUILD / 'jupyterlab.log'}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("JupyterLab did not answer within 120 s")

    def page_url(self, path: str, workspace: str) -> str:
        """The page of `path` (relative to the lab root), alone: `?reset` forgets the layout."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?reset"

    def shutdown_kernels(self, path: str):
        """Shut down the kernels of the notebook at `path` (relative to the lab root), and only
        those: another lane may have a notebook open at the same time."""
        with urllib.request.urlopen(f"{self.url}/api/sessions", timeout=10) as response:
            sessions = json.load(response)
        for session in sessions:
            if path not in (session.get("path"), session.get("notebook", {}).get("path")):
                continue
            request = urllib.request.Request(f"{self.url}/api/sessions/{session['id']}",
                                             method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()

    def close(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


LAB_SCOPE = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
LAB_SCROLL_TOP = ("(document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"
                  " || document.scrollingElement).scrollTop = 0")


def prepare_lab(paths: list[Path]) -> tuple[Path, dict, list[Path]]:
    """The lab root (trusted copies of the lessons, and untrusted copies of those with bertviz
    views), the environment of its Jupyter, and the lessons that have an untrusted copy."""
    lab_root = BUILD / "lab"
    shutil.rmtree(lab_root, ignore_errors=True)
    (lab_root / "notebooks").mkdir(parents=True)
    env = jupyter_env(BUILD / "jupyter")
    for path in paths:
        shutil.copy(path, lab_root / "notebooks" / path.name)
    # The same lessons, not trusted (as a learner first opens a downloaded notebook): their
    # bertviz views cannot draw, and must say "run this cell" instead of showing raw objects.
    untrusted = [p for p in paths if "bertviz-" in p.read_text(encoding="utf-8")]
    if untrusted:
        (lab_root / "untrusted").mkdir()
        for path in untrusted:  # trust is by content: a changed copy is not trusted
            nb = nbformat.read(path, as_version=4)
            nb.metadata["browser_test"] = "untrusted copy"
            nbformat.write(nb, lab_root / "untrusted" / path.name)
    subprocess.run([sys.executable, "-m", "jupyter", "trust",
                    *[str(lab_root / "notebooks" / p.name) for p in paths]],
                   env=env, check=True, capture_output=True)
    return lab_root, env, untrusted


def lab_task(path: Path, browser: Browser, lab: Lab, workspace: str = "default") -> list[str]:
    """The trusted lesson in JupyterLab: rendered, checked, screenshotted, its Predict exercises."""
    cells = len(nbformat.read(path, as_version=4).cells)
    page = browser.new_page()
    try:
        page.navigate(lab.page_url(f"notebooks/{path.name}", workspace), timeout=120)
        rendered = page.wait_for(
            f"document.querySelectorAll('{LAB_SCOPE} .jp-Cell').length === {cells}", 120)
        # Images, math and bertviz views settle after the cells appear.
        settled = INSPECT_JS.replace("SCOPE", json.dumps(LAB_SCOPE)).replace(
            "MARKDOWN", json.dumps(".jp-RenderedMarkdown"))
        page.wait_for(f"(r => !r.images.length && !r.tex.length && "
                      f"r.views.every(v => v.labels > 0))({settled})", 60)
        time.sleep(1)
        report = inspect(page, LAB_SCOPE, ".jp-RenderedMarkdown")
        found = problems_from(report, lab_errors(page), cells)
        if not rendered:
            found.append("the notebook did not finish rendering within 120 s")
        screenshots(page, path.stem, SHOTS, LAB_SCROLL_TOP)
        found += check_predictions(page, path, LAB_SCOPE)
        return found
    finally:
        page.close()
        lab.shutdown_kernels(f"notebooks/{path.name}")


def untrusted_task(path: Path, browser: Browser, lab: Lab, workspace: str = "default") -> list[str]:
    """The untrusted copy in JupyterLab: every bertviz view says "run this cell"."""
    cells = len(nbformat.read(path, as_version=4).cells)
    page = browser.new_page()
    try:
        page.navigate(lab.page_url(f"untrusted/{path.name}", workspace), timeout=120)
        page.wait_for(f"document.querySelectorAll('{LAB_SCOPE} .jp-Cell').length === {cells}", 120)
        time.sleep(2)
        expected = bertviz_outputs(path)
        # Jupyter's sanitizer drops the container's id; find the views by their note.
        state = page.evaluate(f"""(() => {{
          const nb = document.querySelector('{LAB_SCOPE}');
          const notes = Array.from(nb.querySelectorAll('p')).filter(p => p.offsetHeight > 0
            && p.textContent.startsWith('Interactive bertviz view: run this cell'));
          if (notes.length) notes[0].scrollIntoView();
          return {{notes: notes.length, raw: nb.textContent.includes('IPython.core.display')}};
        }})()""")
        found = []
        if state["notes"] != expected:
            found.append(f"{state['notes']} 'run this cell' notes for {expected} bertviz views")
        if state["raw"]:
            found.append("a raw <IPython.core.display...> object is shown")
        found += [f"JavaScript error: {e}" for e in lab_errors(page)]
        time.sleep(0.5)
        page.screenshot(SHOTS / f"{path.stem}-untrusted.png")
        return found
    finally:
        page.close()
        lab.shutdown_kernels(f"untrusted/{path.name}")


def bertviz_outputs(path: Path) -> int:
    """How many outputs of the notebook hold a bertviz view."""
    return sum("bertviz-" in output.get("data", {}).get("text/html", "")
               for cell in nbformat.read(path, as_version=4).cells
               for output in cell.get("outputs", []))


def lab_errors(page: Page) -> list[str]:
    """JavaScript errors, without JupyterLab's own complaints about having no network."""
    ignore = ("Failed to fetch", "ERR_INTERNET_DISCONNECTED", "net::", "NetworkError")
    return [e for e in page.javascript_errors() if not any(word in e for word in ignore)]


# ----------------------------------------------------------------------------------------------
# Pass 2: exported HTML


EXPORT = BUILD / "export"


def export_task(path: Path, browser: Browser, exporter: HTMLExporter) -> list[str]:
    """The lesson exported by nbconvert, opened from file://."""
    body, _ = exporter.from_notebook_node(nbformat.read(path, as_version=4))
    html_path = EXPORT / f"{path.stem}.html"
    html_path.write_text(body, encoding="utf-8")
    page = browser.new_page()
    try:
        page.navigate(html_path.as_uri(), timeout=120)
        page.wait_for("Array.from(document.querySelectorAll('div[id^=\"bertviz-\"]'))"
                      ".every(d => d.querySelectorAll('svg text').length > 0)", 30)
        page.wait_for("Array.from(document.images).every(i => i.complete)", 30)
        report = inspect(page, "body", ".jp-MarkdownOutput")
        report["tex"] = []  # nbconvert's page loads MathJax from a CDN: offline, no math
        errors = [e for e in page.javascript_errors() if "MathJax" not in e]
        found = problems_from(report, errors, None)
        screenshots(page, path.stem, SHOTS / "export", "window.scrollTo(0, 0)")
        return found
    finally:
        page.close()


GRADE_JS = r"""
(() => ({tables: document.querySelectorAll('table').length,
         rows: document.querySelectorAll('tbody tr').length,
         bars: Array.from(document.querySelectorAll('svg rect')).filter(r => r.getBBox().width > 0).length,
         svgHeight: (document.querySelector('svg') || {getBBox: () => ({height: 0})}).getBBox().height,
         overflow: document.documentElement.scrollWidth > window.innerWidth + 1}))()
"""


def sample_grades(folder: Path) -> list[Path]:
    """The grader's report.html and one feedback page for a small made-up class (no kernel runs)."""
    from course_lib.grading.lessons import read_lessons
    from course_lib.grading.report import write_all
    from course_lib.grading.runner import Graded

    keys = read_lessons()["01"].keys
    wrong = ("Likely mistake (3-D input): softmax over the wrong axis (the query axis, dim=-2). Each query's "
             "weights over the keys must sum to 1: use softmax(dim=-1), the key axis.")
    rows = []
    for i in range(6):
        results = {k: {"outcome": "passed" if (i + j) % 3 else "failed", "message": wrong if (i + j) % 3 == 0
                       else "all cases match"} for j, k in enumerate(keys)}
        rows.append(Graded(f"learner{i}", "01", "graded", results, peeked=keys[:1] if i == 2 else []))
    rows.append(Graded("late", "01", "timeout", {k: {"outcome": "not implemented", "message": ""} for k in keys},
                       notes=["cell exceeded 300 s"]))
    rows.append(Graded("essay", "", "not a notebook", notes=["could not read it as a notebook"]))
    shutil.rmtree(folder, ignore_errors=True)
    write_all(folder, rows, read_lessons())
    return [folder / "report.html", folder / "feedback" / "learner0.html"]


def grade_task(path: Path, browser: Browser) -> list[str]:
    """A grader's page renders offline: its tables, the report's chart, no JavaScript error."""
    page = browser.new_page()
    try:
        page.navigate(path.as_uri(), timeout=60)
        seen = page.evaluate(GRADE_JS)
        found = [f"JavaScript error: {e}" for e in page.javascript_errors()]
        if seen["tables"] < (4 if path.name == "report.html" else 1) or seen["rows"] == 0:
            found.append(f"tables missing: {seen}")
        if path.name == "report.html" and (seen["bars"] < 3 or seen["svgHeight"] < 50):
            found.append(f"the chart draws no bars: {seen}")
        if seen["overflow"]:
            found.append("the page is wider than the window")
        (SHOTS / "grade").mkdir(parents=True, exist_ok=True)
        page.screenshot(SHOTS / "grade" / f"{path.stem}.png")
        return found
    finally:
        page.close()


# ----------------------------------------------------------------------------------------------
# Lanes. A page spends much of its time waiting (for JupyterLab to render and size its cells, and in
# the pauses between scrolls and screenshots) rather than computing: one lane after the other left
# two cores idle almost half the time (measured: ~285 s of wall time, ~310 s of CPU in all processes,
# Chromium's renderers most of it; `time`'s user+sys, ~130 s, misses them). Two lanes kept them ~80%
# busy (~190 s); a third lane gained nothing on two cores. Each lane has its own Chromium (a
# Browser's pages are not shared between threads) and takes pages from one queue, longest first.


class Task(NamedTuple):
    name: str  # the pass, as printed: "JupyterLab", "exported HTML", "grader pages"
    item: str  # what it checks, as printed: "01_attention.ipynb", "grades/report.html", ...
    cost: float  # a rough guess of its seconds, to start the longest first
    run: Callable[[Lane], list[str]]  # its problems; [] if it passes


class Lane:
    """One worker: its own Chromium, nbconvert exporter and JupyterLab workspace."""

    def __init__(self, number: int):
        self.workspace = f"lane-{number}"
        self.browser: Browser | None = None
        self.exporter: HTMLExporter | None = None

    def ready(self) -> Lane:
        """Start (or restart, if it died) this lane's Chromium."""
        if self.browser is None or self.browser.process.poll() is not None:
            if self.browser is not None:
                self.browser.close()
            self.browser = Browser(offline=True)
        if self.exporter is None:
            self.exporter = HTMLExporter(template_name="lab")
        return self

    def close(self):
        if self.browser is not None:
            self.browser.close()


def run_lanes(tasks: list[Task], jobs: int) -> dict[tuple[str, str], list[str]]:
    """Every task's problems, by (pass, item). A task that raises fails with the exception."""
    todo: queue.SimpleQueue[Task] = queue.SimpleQueue()
    for task in sorted(tasks, key=lambda t: -t.cost) if jobs > 1 else tasks:
        todo.put(task)
    results: dict[tuple[str, str], list[str]] = {}

    def work(lane: Lane):
        while True:
            try:
                task = todo.get_nowait()
            except queue.Empty:
                return
            try:
                found = task.run(lane.ready())
            except Exception as error:  # noqa: BLE001 - reported as this item's failure
                found = [f"raised {type(error).__name__}: {' '.join(str(error).split())[:300]}"]
            results[(task.name, task.item)] = found

    lanes = [Lane(k + 1) for k in range(jobs)]
    try:
        if jobs == 1:
            work(lanes[0])
        else:
            threads = [threading.Thread(target=work, args=(lane,), daemon=True) for lane in lanes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for lane in lanes:
            lane.close()
    for task in tasks:  # only if a lane died of something else than an Exception
        results.setdefault((task.name, task.item), ["not checked: its lane stopped"])
    return results


def lab_cost(path: Path) -> float:
    """A lesson's seconds in JupyterLab, roughly: its cells render, then each bertviz view and each
    Predict exercise is scrolled to and screenshotted."""
    cells = len(nbformat.read(path, as_version=4).cells)
    return 10 + cells / 10 + 2 * bertviz_outputs(path) + 1.5 * len(predictions(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--skip-lab", action="store_true", help="only the exported HTML")
    parser.add_argument("--skip-export", action="store_true", help="only JupyterLab")
    parser.add_argument("--jobs", type=int, default=2, metavar="N",
                        help="pages checked at the same time, each lane in its own Chromium "
                             "(default: 2; 1 checks them one after the other)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    paths = sorted(p.resolve() for p in args.notebooks)
    BUILD.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(SHOTS, ignore_errors=True)
    started = time.time()
    outcome = {}  # (pass, notebook) -> passed?
    for path in paths:
        errors, warnings = stored_problems(path)
        for message in warnings:
            print(f"  note {path.name}: {message}")
        for message in errors:
            print(f"FAIL stored outputs {path.name}: {message}")
        outcome[("stored outputs", path.name)] = not errors
    find_chromium()  # no Chromium: say how to install it, before starting anything
    tasks = []  # in the order their results are printed
    lab = None
    try:
        if not args.skip_lab:
            lab_root, env, untrusted = prepare_lab(paths)
            lab = Lab(lab_root, env)  # starts; wait() for it below
            tasks += [Task("JupyterLab", path.name, lab_cost(path),
                           lambda lane, path=path: lab_task(path, lane.browser, lab,
                                                            lane.workspace))
                      for path in paths]
            tasks += [Task("JupyterLab", f"{path.name} (untrusted)", 12,
                           lambda lane, path=path: untrusted_task(path, lane.browser, lab,
                                                                  lane.workspace))
                      for path in untrusted]
        if not args.skip_export:
            shutil.rmtree(EXPORT, ignore_errors=True)
            EXPORT.mkdir(parents=True)
            tasks += [Task("exported HTML", path.name, 3 + 2 * bertviz_outputs(path),
                           lambda lane, path=path: export_task(path, lane.browser, lane.exporter))
                      for path in paths]
        tasks += [Task("grader pages", f"grades/{page.relative_to(BUILD / 'grades')}", 1,
                       lambda lane, page=page: grade_task(page, lane.browser))
                  for page in sample_grades(BUILD / "grades")]
        if lab is not None:
            lab.wait()
        results = run_lanes(tasks, args.jobs)
    finally:
        if lab is not None:
            lab.close()
    for task in tasks:
        found = results[(task.name, task.item)]
        for message in found:
            print(f"FAIL {task.name} {task.item}: {message}")
        if not found:
            print(f"ok   {task.name} {task.item}")
        outcome[(task.name, task.item)] = not found
    print(f"screenshots: {SHOTS.relative_to(ROOT)}/ ({time.time() - started:.0f} s)")
    passed = sum(outcome.values())
    print(f"{passed} passed, {len(outcome) - passed} failed")
    return 0 if passed == len(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
