"""Build the course as a static website, offline, from the stored notebooks (`make site`).

    python scripts/build_site.py     -> build/site/index.html (open it from file:// or serve it)

Sphinx + MyST-NB + sphinx-book-theme (configuration: site/conf.py). The notebooks are never run
(nb_execution_mode "off": strict nbval already proves their stored outputs). This script first
writes the Sphinx source folder, build/site-src/:

* notebooks/NN_*.ipynb: each lesson, with its cell attachments written to files beside it (MyST-NB
  ignores attachments: its issue 492), the Colab badge replaced by two buttons (open in Colab, the
  URL from ``[tool.course]`` in pyproject.toml as the badge's; download the .ipynb, which is copied
  beside the page), the setup cell folded, and bertviz's inline d3/jQuery replaced by one file of
  the site (_static/course/bertviz-libs.js, from the same sha256-checked files);
* index.md: the start page, the README's pitch and its lessons table, each lesson linked;
* docs/: instructors.md, developers.md and course_lib.md, their links to the repository's other
  files turned into links to the repository on GitHub;
* reference/: course_lib's docstrings (autodoc), one page per lesson's modules (the module map in
  course_lib/__init__.py). course_lib.solutions, course_lib.checks and the grader are not
  documented there: the answers never appear on the site.
* _static/: MathJax 2.7 (the PyPI package jupyter-server-mathjax, STIX-Web fonts), the libraries
  for bertviz's views, the site's CSS.

Then sphinx-build writes build/site/. `make test-browser` checks it (scripts/site_test.py).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from sync_notebooks import colab_url, course_settings  # noqa: E402

SOURCE = ROOT / "build" / "site-src"
OUT = ROOT / "build" / "site"
CONF = ROOT / "site"

BERTVIZ_LIBS = "course/bertviz-libs.js"
# course_lib.bertviz_views stores d3 and jQuery inline in each view's output, in this script block.
INLINE_LIBS = re.compile(
    r"<script>\n\(function \(\) \{\n  if \(window\.__courseBertvizLibs\) \{ return; \}\n"
    r".*?window\.__courseBertvizLibs = \{d3: holder\.d3, jquery: jq\.exports\};\n"
    r"\}\)\(\);\n</script>\n",
    re.S)
BADGE = re.compile(r"^\[!\[Open In Colab\]\(attachment:[^)]*\)\]\([^)]*\)\s*\n+")
# Modules of the map in course_lib/__init__.py that the reference leaves out: the answers and the
# checkers (course_lib.checks, course_lib.solutions) and the grader (docs/instructors.md).
NOT_DOCUMENTED = ("checks", "solutions", "grading")
MODULE_LINE = re.compile(r"^\s{4}(\d\d)(?:-(\d\d))?\s+([a-z_][\w.]*)\s{2,}(.+)$")
# Links to the repository's own files from docs/ and the README: where they go on the site.
SITE_TARGETS = {"README.md": "index.md", **{f"docs/{name}.md": f"docs/{name}.md"
                                           for name in ("instructors", "developers", "course_lib")}}


def lessons() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def lesson_title(nb: dict, path: Path) -> str:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            match = re.search(r"^# (.+)$", "".join(cell["source"]), re.M)
            if match:
                return match.group(1).strip()
    return path.stem


def buttons_html(path: Path, settings: dict) -> str:
    colab = colab_url(path, settings)
    return (
        '<div class="course-buttons">\n'
        f'<a class="course-button course-colab" href="{colab}">Open in Colab</a>\n'
        f'<a class="course-button course-download" href="{path.name}" download="{path.name}">'
        "Download the notebook (.ipynb)</a>\n</div>\n"
    )


def prepare_lesson(path: Path, settings: dict, folder: Path) -> tuple[str, int]:
    """Write the lesson's source copy into `folder`; returns its title and attachments written."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    files = folder / "attachments" / path.stem
    written = 0
    first_markdown = True
    for cell in nb["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown":
            if first_markdown:
                first_markdown = False
                source = BADGE.sub("", source, count=1)
                # The buttons right under the lesson's title.
                source = re.sub(r"^(# .+\n)", lambda m: m.group(1) + "\n" + buttons_html(
                    path, settings) + "\n", source, count=1, flags=re.M)
            for name, bundle in (cell.pop("attachments", None) or {}).items():
                mime, data = next(iter(bundle.items()))
                files.mkdir(parents=True, exist_ok=True)
                (files / name).write_bytes(base64.b64decode(data))
                source = source.replace(f"attachment:{name}",
                                        f"attachments/{path.stem}/{name}")
                written += 1
        elif cell["cell_type"] == "code":
            if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
                tags = cell["metadata"].setdefault("tags", [])
                if "hide-input" not in tags:
                    tags.append("hide-input")
            for output in cell.get("outputs", []):
                html = output.get("data", {}).get("text/html")
                if html is not None:
                    html = "".join(html) if isinstance(html, list) else html
                    output["data"]["text/html"] = INLINE_LIBS.sub(
                        f'<script src="../_static/{BERTVIZ_LIBS}"></script>\n', html)
        cell["source"] = source
    (folder / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    return lesson_title(nb, path), written


def bertviz_libraries_js() -> str:
    """d3 5.7.0 and jQuery 3.7.1 (sha256-checked by course_lib), defined as inline views do."""
    from course_lib.bertviz_views import vendored_libraries

    libs = vendored_libraries()
    if libs is None:
        raise SystemExit("d3/jQuery for bertviz are missing: run `make setup` "
                         "(requirements-js.txt)")
    return (
        "(function () {\n"
        "  if (window.__courseBertvizLibs) { return; }\n"
        "  var holder = {}, jq = {exports: {}};\n"
        "  (function (exports, module, define) {\n"
        f"{libs['d3']}\n"
        "  }).call(holder, undefined, undefined, undefined);\n"
        "  (function (module, define) {\n"
        f"{libs['jquery']}\n"
        "  }).call(window, jq, undefined);\n"
        "  window.__courseBertvizLibs = {d3: holder.d3, jquery: jq.exports};\n"
        "})();\n"
    )


def rewrite_links(text: str, here: str, settings: dict) -> str:
    """Markdown links of a file at `here` (repository path) to other repository files: to their
    page on the site when it has one, else to the file on GitHub."""
    base = f"{settings['repository']}/blob/{settings['branch']}"

    def fix(match):
        label, target = match.group(1), match.group(2)
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", target, flags=re.I):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (Path(here).parent / path).as_posix()
        resolved = str(Path(resolved)).replace("\\", "/")
        parts = []
        for part in resolved.split("/"):
            if part == "..":
                parts = parts[:-1]
            elif part not in ("", "."):
                parts.append(part)
        resolved = "/".join(parts)
        if resolved == "README.md" and anchor:  # the start page has only the README's top
            new = f"{base}/README.md"
        elif resolved in SITE_TARGETS:
            new = relative(SITE_TARGETS[resolved], here if here != "README.md" else "index.md")
        elif resolved.startswith("images/") and not label.startswith("!"):
            new = f"{base}/{resolved}"
        elif resolved.startswith("images/"):
            new = relative(resolved, here if here != "README.md" else "index.md")
        elif resolved.startswith("notebooks/") and resolved.endswith(".ipynb"):
            new = relative(resolved, here if here != "README.md" else "index.md")
        else:
            new = f"{base}/{resolved}"
        return f"{label}]({new}{'#' + anchor if anchor else ''})"

    return re.sub(r"(!?\[[^\]]*)\]\(([^)\s]+)\)", fix, text)


def relative(target: str, here: str) -> str:
    """`target` (a path in the site's source) as seen from the page `here`."""
    depth = here.count("/")
    return "../" * depth + target


def start_page(settings: dict, titles: dict[str, str]) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pitch = readme.split("\n## ", 1)[0]
    table = re.search(r"^## The lessons\n\n(\|.*?\n)\n", readme, re.S | re.M).group(1)
    rows = []
    for line in table.splitlines():
        match = re.match(r"^\| `(\d\d_\w+)` \|", line)
        if match and (ROOT / "notebooks" / f"{match.group(1)}.ipynb").is_file():
            stem = match.group(1)
            line = line.replace(f"`{stem}`", f"[{titles.get(stem, stem)}](notebooks/{stem}.ipynb)",
                                1)
        rows.append(line)
    pitch = rewrite_links(pitch, "README.md", settings)
    return (
        f"{pitch.strip()}\n\n"
        "Every lesson is a Jupyter notebook: read it here with its stored outputs (figures, "
        "tables, bertviz's interactive attention views, math), then open it in Colab or download "
        "it and run "
        "it in JupyterLab, where its exercises are checked as you go. How to set it up on your "
        f"machine: the [README]({settings['repository']}#quick-start).\n\n"
        "## The lessons\n\n" + "\n".join(rows) + "\n\n"
        "## More\n\n"
        "- [For instructors](docs/instructors.md): grading a class, Canvas, Moodle, Gradescope, "
        "shards.\n"
        "- [For developers](docs/developers.md): the tests, CI, float paths, benchmarks.\n"
        "- [The course_lib reference](docs/course_lib.md), and [course_lib by lesson]"
        "(reference/index.md): every module's docstrings.\n\n"
        "```{toctree}\n:hidden:\n:caption: Lessons\n\n"
        + "\n".join(f"notebooks/{stem}" for stem in titles) + "\n```\n\n"
        "```{toctree}\n:hidden:\n:caption: For instructors and developers\n\n"
        "docs/instructors\ndocs/developers\ndocs/course_lib\nreference/index\n```\n"
    )


def module_map() -> list[tuple[str, str, str]]:
    """(first lesson, module, description) from the map in course_lib/__init__.py's docstring."""
    import course_lib

    found = []
    for line in (course_lib.__doc__ or "").splitlines():
        match = MODULE_LINE.match(line)
        if match and not match.group(3).startswith(NOT_DOCUMENTED):
            found.append((match.group(1), match.group(3), match.group(4).strip()))
    return found


def reference_pages(folder: Path, titles: dict[str, str]) -> list[str]:
    """One page per lesson that introduces modules; returns the page names."""
    by_lesson: dict[str, list[tuple[str, str]]] = {}
    for lesson, module, description in module_map():
        by_lesson.setdefault(lesson, []).append((module, description))
    names = []
    stems = {stem[:2]: stem for stem in titles}
    for lesson in sorted(by_lesson):
        title = titles.get(stems.get(lesson, ""), f"Lesson {lesson}")
        lines = [f"# {title}: its modules\n",
                 "The modules this lesson introduces, from their docstrings "
                 "(a later lesson may add to one).\n"]
        for module, description in by_lesson[lesson]:
            lines += [f"## `course_lib.{module}`\n", f"*{description}*\n",
                      "```{eval-rst}", f".. automodule:: course_lib.{module}",
                      "   :members:", "```\n"]
        name = f"lesson{lesson}"
        (folder / f"{name}.md").write_text("\n".join(lines), encoding="utf-8")
        names.append(name)
    (folder / "index.md").write_text(
        "# course_lib by lesson: the docstrings\n\n"
        "`course_lib` is the finished reference package the lessons import. Its modules, by the "
        "lesson that introduces them, with their docstrings. The overview of every module is "
        "[docs/course_lib.md](../docs/course_lib.md); the checkers and the solutions are not "
        "documented here (a learner meets the checkers in the lessons; the solutions stay "
        "behind `show_solution`).\n\n"
        "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(names) + "\n```\n", encoding="utf-8")
    return names


def copy_mathjax(static: Path) -> None:
    dist = metadata.distribution("jupyter-server-mathjax")
    source = Path(dist.locate_file("jupyter_server_mathjax/static"))
    if not (source / "MathJax.js").is_file():
        raise SystemExit("MathJax not found: run `make setup` (requirements-site.txt)")
    shutil.copytree(source, static / "mathjax",
                    ignore=shutil.ignore_patterns("SVG", "*.md", "__pycache__"))


SITE_CSS = """\
.course-buttons { display: flex; flex-wrap: wrap; gap: 0.6rem; margin: 0.4rem 0 1.2rem; }
.course-button { display: inline-block; padding: 0.35rem 0.9rem; border-radius: 0.3rem;
  border: 1px solid var(--pst-color-primary); font-weight: 600; text-decoration: none !important; }
.course-colab { background: var(--pst-color-primary);
  color: var(--pst-color-background) !important; }
/* MathJax's hidden MathML for screen readers (AssistiveMML) gets CSS asking for the TeX fonts
   (MathJax_AMS, ...), which this MathJax copy lacks: it is invisible, any font does. */
.MJX_Assistive_MathML [mathvariant], .MJX_Assistive_MathML math { font-family: serif !important; }
/* bertviz's views are wider than the text column on small screens: scroll them. */
.cell_output div[id^="bertviz-"] { overflow-x: auto; }
"""


def write_sources(settings: dict) -> dict:
    shutil.rmtree(SOURCE, ignore_errors=True)
    (SOURCE / "notebooks").mkdir(parents=True)
    titles, attachments = {}, 0
    for path in lessons():
        title, written = prepare_lesson(path, settings, SOURCE / "notebooks")
        titles[path.stem] = title
        attachments += written
    (SOURCE / "index.md").write_text(start_page(settings, titles), encoding="utf-8")
    (SOURCE / "docs").mkdir()
    for name in ("instructors.md", "developers.md", "course_lib.md"):
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        (SOURCE / "docs" / name).write_text(rewrite_links(text, f"docs/{name}", settings),
                                            encoding="utf-8")
    shutil.copytree(ROOT / "images", SOURCE / "images",
                    ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (SOURCE / "reference").mkdir()
    reference_pages(SOURCE / "reference", titles)
    static = SOURCE / "_static"
    (static / "course").mkdir(parents=True)
    (static / BERTVIZ_LIBS).write_text(bertviz_libraries_js(), encoding="utf-8")
    (static / "course" / "site.css").write_text(SITE_CSS, encoding="utf-8")
    copy_mathjax(static)
    return {"lessons": len(titles), "attachments": attachments}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="2", help="sphinx-build's -j (default 2)")
    args = parser.parse_args(argv)
    started = time.time()
    settings = course_settings()
    counts = write_sources(settings)
    shutil.rmtree(OUT, ignore_errors=True)
    warnings = ROOT / "build" / "site-warnings.log"
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", args.jobs,
               "-w", str(warnings),
               "-c", str(CONF), "-d", str(ROOT / "build" / "site-doctrees"), str(SOURCE), str(OUT)]
    result = subprocess.run(command, cwd=ROOT, stderr=subprocess.DEVNULL,
                            env={**os.environ, "COURSE_SITE_SOURCE": str(SOURCE)})
    problems = warnings.read_text(encoding="utf-8").count("WARNING") if warnings.exists() else 0
    if result.returncode:
        print(f"sphinx-build failed: see {warnings.relative_to(ROOT)}")
        return result.returncode
    for path in lessons():  # the download buttons' files: the lessons exactly as stored
        shutil.copy(path, OUT / "notebooks" / path.name)
    (OUT / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and _images/ as they are
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"site: {OUT.relative_to(ROOT)}/index.html: {counts['lessons']} lessons, "
          f"{counts['attachments']} attachments as files, {size / 1e6:.0f} MB, "
          f"{time.time() - started:.0f} s; {problems} warnings in {warnings.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
