"""Check the course's website (build/site, `make site`) offline and in headless Chromium.

    python scripts/site_test.py            (`make test-browser` builds the site, then runs this)

Offline, in Python, over every file of build/site:

* every internal link and image resolves: each relative href/src names a file of the site, and each
  #fragment an id of the page it points to (links to other hosts are left alone: they are only
  followed when a reader clicks them);
* no solution appears: no line of course_lib.solutions' blocks (``solution_source``) is in any
  page's text, in the search index or in a downloadable notebook (lines that the lessons
  themselves hold, such as a stub's signature, are not counted).

In headless Chromium, the site served from 127.0.0.1 on a free port (the server is stopped at the
end, even on a failure), with every other host unreachable:

* every page loads with no JavaScript error, no console error, no failed request and no request to
  another host; math is typeset (no raw TeX left); every image loads;
* bertviz's views draw (their SVG nodes counted) and respond to a click;
* each lesson's page has its Open in Colab and .ipynb download buttons and previous/next links;
* the search finds the right lesson for each query of SEARCHES;
* the start page, a lesson with bertviz views and a search also work from file://.

Screenshots (the top of each lesson, each bertviz view) go to build/screenshots/site/.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import re
import sys
import threading
import time
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cdp import Browser, Page, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "build" / "site"
SHOTS = ROOT / "build" / "screenshots" / "site"

# query -> the lesson whose page the search must list among its first results
SEARCHES = {
    "KV cache": "07_inference",
    "FlashAttention": "13_attention_at_scale",
    "induction head": "12_inside_the_model",
    "label smoothing": "06_training_copy_task",
    "RoPE": "11_modern_block",
    "WordPiece": "10_tokenization",
    "ZeRO": "14_training_at_scale",
    "LoRA": "15_finetuning_and_lora",
    "DPO": "16_instructions_and_preferences",
    "beam search": "07_inference",
    "teacher forcing": "06_training_copy_task",
}
TOP = 3  # the lesson must be among the first TOP results


# ----------------------------------------------------------------------------------------------
# Offline checks


class Links(HTMLParser):
    """The ids and the href/src targets of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.targets: list[tuple[str, str]] = []  # (tag.attribute, target)
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            if value and ((name == "href" and tag in ("a", "link"))
                          or (name == "src" and tag in ("img", "script", "iframe"))):
                self.targets.append((f"{tag}.{name}", value))
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def site_pages(site: Path) -> list[Path]:
    """The site's pages (not the theme's templates under _static/)."""
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)


@functools.lru_cache(maxsize=None)
def parse(path: Path) -> Links:
    parser = Links()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def check_links(site: Path) -> list[str]:
    """Every relative link of every page names a file of the site, and its #fragment an id."""
    problems = []
    for page in site_pages(site):
        for kind, target in parse(page).targets:
            if re.match(r"^(?:[a-z][a-z0-9+.-]*:|//)", target, flags=re.I):
                continue  # another host (or mailto:, data:, javascript:): not followed offline
            url = urllib.parse.urlsplit(target)
            path = urllib.parse.unquote(url.path)
            file = (page.parent / path).resolve() if path else page
            if file.is_dir():
                file = file / "index.html"
            where = f"{page.relative_to(site)}: {kind} {target}"
            if not file.is_file() or not file.is_relative_to(site.resolve()):
                problems.append(f"{where}: no such file")
            elif url.fragment and file.suffix == ".html" and \
                    urllib.parse.unquote(url.fragment) not in parse(file).ids:
                problems.append(f"{where}: no id {url.fragment!r} in {file.name}")
    return problems


def solution_lines() -> dict[str, list[str]]:
    """Each solution's distinctive code lines: those the stored lessons do not hold themselves
    (a stub's signature, a line the prose shows). The lessons are checked for solutions by
    tests/notebooks/test_exercises.py; here, the site must add none."""
    from course_lib.solutions import solution_keys, solution_source

    lessons = []
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            lessons.append(_text(cell["source"]))
            for output in cell.get("outputs", []):
                lessons += [_text(output.get("text", ""))]
                lessons += [_text(value) for value in output.get("data", {}).values()
                            if isinstance(value, (str, list))]
    lessons_text = normal("\n".join(lessons))
    found = {}
    for key in solution_keys():
        lines = []
        for line in solution_source(key).splitlines():
            text = normal(line)
            if len(text) < 24 or text.startswith(("#", "import ", "from ", '"""', "'''")) \
                    or text in lessons_text:
                continue
            lines.append(text)
        found[key] = lines
    return found


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def normal(text: str) -> str:
    return " ".join(text.split())


def check_no_solutions(site: Path) -> tuple[list[str], int]:
    """No solution's distinctive line in any page's text, the search index or a notebook."""
    texts = {}
    for page in site_pages(site):
        texts[page.relative_to(site).as_posix()] = normal(html.unescape(" ".join(parse(page).text)))
    for extra in [site / "searchindex.js", *site.rglob("*.ipynb")]:
        texts[extra.relative_to(site).as_posix()] = normal(extra.read_text(encoding="utf-8"))
    problems, checked = [], 0
    for key, lines in solution_lines().items():
        for line in lines:
            checked += 1
            escaped = normal(json.dumps(line)[1:-1])
            for name, text in texts.items():
                if line in text or (name.endswith((".ipynb", ".js")) and escaped in text):
                    problems.append(f"solution {key} shown in {name}: {line[:80]!r}")
    return problems, checked


# ----------------------------------------------------------------------------------------------
# In the browser


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Server:
    """build/site over HTTP on 127.0.0.1, a free port, in a thread of this process."""

    def __init__(self, folder: Path):
        handler = functools.partial(QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


# MathJax 2 (if the page loads it) has finished its first typesetting.
MATHJAX_DONE_JS = ("!window.MathJax || (MathJax.isReady && MathJax.Hub.queue.pending === 0 "
                   "&& !MathJax.Hub.queue.running)")

INSPECT_JS = r"""
(() => {
  const main = document.querySelector('main') || document.body;
  const short = s => (s || '').slice(0, 120);
  const images = Array.from(document.images)
    .filter(img => !(img.complete && img.naturalWidth > 0))
    .map(img => short(img.getAttribute('src')));
  const copy = main.cloneNode(true);
  copy.querySelectorAll('code, pre, script, style, .MathJax, .MathJax_Display, .MathJax_Preview, '
                        + '.MathJax_CHTML, .cell_output, .output, .highlight, textarea')
    .forEach(node => node.remove());
  const text = copy.textContent;
  const tex = [];
  const pattern = /\$[^$\n]+\$|\\\(|\\\[|\\(frac|sqrt|mathrm|mathbf|cdot|sum|top|begin)\b/g;
  let match;
  while ((match = pattern.exec(text)) && tex.length < 5) {
    tex.push(text.slice(Math.max(0, match.index - 40), match.index + 60).replace(/\s+/g, ' '));
  }
  const views = Array.from(document.querySelectorAll('div[id^="bertviz-"]')).map(div => ({
    id: div.id.slice(0, 16),
    svg: div.querySelectorAll('svg *').length,
    labels: div.querySelectorAll('svg text').length,
    note: !!div.querySelector('.course-bertviz-note'),
  }));
  const math = document.querySelectorAll('.math').length;
  const typeset = document.querySelectorAll('.MathJax, .MathJax_Display').length;
  const colab = document.querySelector('a.course-colab');
  const download = document.querySelector('a.course-download');
  const buttons = {colab: colab && colab.href, download: download && download.getAttribute('href')};
  const prevNext = document.querySelectorAll('.prev-next-area a').length;
  return {images, tex, views, math, typeset, buttons, prevNext, title: document.title};
})()
"""

# Click each view: hover and click its rectangles (head view: a head's checkbox; model view: a
# thumbnail; neuron view: a token's (+)) until its SVG changes. Returns, per view, whether it did.
CLICK_JS = r"""
(() => Array.from(document.querySelectorAll('div[id^="bertviz-"]')).map(view => {
  const svgs = () => Array.from(view.querySelectorAll('svg')).map(s => s.innerHTML).join('');
  const before = svgs();
  const fire = (el, type) => el.dispatchEvent(new MouseEvent(type, {bubbles: true}));
  const groups = Array.from(view.querySelectorAll('svg g'));
  for (const g of groups.slice(0, 60)) fire(g, 'mouseover');
  const rects = Array.from(view.querySelectorAll('svg rect'));
  for (const rect of rects.slice(0, 200)) {
    fire(rect, 'mouseover');
    fire(rect, 'click');
    if (svgs() !== before) return true;
  }
  return false;
}))()
"""


def network_problems(page: Page, origin: str) -> list[str]:
    """Requests to another host, failed requests and HTTP errors, and console errors."""
    found, urls = [], {}
    for event in page.events:
        method, params = event["method"], event.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            if not url.startswith((origin, "data:", "blob:", "about:", "file:")):
                found.append(f"request to another host: {url[:120]}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            url = urls.get(params["requestId"], "?")
            found.append(f"failed request: {url[:120]} ({params.get('errorText')})")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"HTTP {params['response']['status']}: {params['response']['url'][:120]}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"console: {params['entry'].get('text', '')[:160]}")
    found += [f"JavaScript error: {e[:200]}" for e in page.javascript_errors()]
    return list(dict.fromkeys(found))


def open_page(browser: Browser, url: str) -> Page:
    page = browser.new_page()
    page.call("Network.enable")
    page.navigate(url, timeout=120)
    return page


def check_page(browser: Browser, url: str, origin: str, shot: Path | None,
               lesson: bool = False) -> tuple[list[str], dict]:
    """One page: loads cleanly, math typeset, images loaded, bertviz views drawn and clickable;
    a lesson's page also has its Colab and download buttons and its previous/next links."""
    page = open_page(browser, url)
    try:
        page.evaluate("document.querySelectorAll('img[loading=lazy]')"
                      ".forEach(img => img.loading = 'eager')")
        page.wait_for("Array.from(document.images).every(i => i.complete)", 30)
        page.wait_for("Array.from(document.querySelectorAll('div[id^=\"bertviz-\"]'))"
                      ".every(d => d.querySelectorAll('svg text').length > 0)", 30)
        mathjax = page.wait_for(MATHJAX_DONE_JS, 60)
        report = page.evaluate(INSPECT_JS)
        found = [f"image does not load: {src}" for src in report["images"]]
        found += [f"raw TeX: ...{snippet}..." for snippet in report["tex"]]
        if not mathjax:
            found.append("MathJax did not finish within 60 s")
        if report["math"] and not report["typeset"]:
            found.append(f"{report['math']} math elements, none typeset")
        for view in report["views"]:
            if view["labels"] == 0 or view["note"]:
                found.append(f"bertviz view {view['id']} drew nothing ({view['svg']} SVG nodes)")
        if lesson:  # its two buttons, and the previous and next lesson
            colab, download = report["buttons"]["colab"], report["buttons"]["download"]
            if not (colab or "").startswith("https://colab.research.google.com/github/"):
                found.append(f"no Open in Colab button (found {colab!r})")
            if not (download or "").endswith(".ipynb"):
                found.append(f"no download button for the .ipynb (found {download!r})")
            if report["prevNext"] < 1:
                found.append("no link to the previous or next lesson")
        if shot is not None:
            page.evaluate("window.scrollTo(0, 0)")
            time.sleep(0.3)
            page.screenshot(shot)
            for k in range(len(report["views"])):
                page.evaluate(f"document.querySelectorAll('div[id^=\"bertviz-\"]')[{k}]"
                              ".scrollIntoView({block: 'start'})")
                time.sleep(0.3)
                page.screenshot(shot.with_name(f"{shot.stem}-bertviz-{k + 1}.png"))
        if report["views"]:
            clicked = page.evaluate(CLICK_JS)
            found += [f"bertviz view {view['id']} does not respond to a click"
                      for view, ok in zip(report["views"], clicked) if not ok]
        time.sleep(0.2)
        found += network_problems(page, origin)
        return found, report
    finally:
        page.close()


SEARCH_JS = r"""
Array.from(document.querySelectorAll('#search-results ul.search li a'))
  .map(a => a.getAttribute('href'))
"""


def check_search(browser: Browser, base: str, origin: str, query: str, lesson: str) -> list[str]:
    """The search page lists the lesson among its first TOP results."""
    page = open_page(browser, f"{base}/search.html?q={urllib.parse.quote(query)}")
    try:
        # Sphinx fills the summary ("Search finished, found N pages ...") once every result is in.
        page.wait_for("(s => !!s && s.textContent.length > 0)"
                      "(document.querySelector('#search-results p.search-summary'))", 60)
        results = page.evaluate(SEARCH_JS) or []
        lessons = [urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1] for href in results]
        found = network_problems(page, origin)
        if f"{lesson}.html" not in lessons[:TOP]:
            found.append(f"{lesson} not among the first {TOP} results: {lessons[:5]} "
                         f"({len(results)} results)")
        return found
    finally:
        page.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, default=SITE)
    parser.add_argument("--only", metavar="GLOB", help="check only these pages in the browser "
                        "(e.g. 'notebooks/02*'), and no search (while working on the site)")
    args = parser.parse_args(argv)
    site = args.site.resolve()
    if not (site / "index.html").is_file():
        raise SystemExit(f"{site}/index.html not found: run `make site` first")
    started = time.time()
    outcome: dict[str, list[str]] = {}
    pages = site_pages(site)
    outcome["links (offline)"] = check_links(site)
    problems, checked = check_no_solutions(site)
    outcome[f"no solution text ({checked} solution lines, {len(pages)} pages)"] = problems
    find_chromium()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    server = Server(site)
    try:
        with Browser(offline=True) as browser:
            svg_nodes = 0
            for path in pages:
                name = path.relative_to(site).as_posix()
                if args.only and not Path(name).match(args.only):
                    continue
                shot = SHOTS / f"{path.stem}.png" if name.startswith("notebooks/") else None
                try:
                    found, report = check_page(browser, f"{server.url}/{name}", server.url, shot,
                                               lesson=name.startswith("notebooks/"))
                    svg_nodes += sum(v["svg"] for v in report["views"])
                    views = f" ({len(report['views'])} bertviz views)" if report["views"] else ""
                except Exception as error:  # noqa: BLE001 - reported as this page's failure
                    found, views = [f"raised {type(error).__name__}: {error}"[:300]], ""
                outcome[f"page {name}{views}"] = found
            for query, lesson in ({} if args.only else SEARCHES).items():
                outcome[f"search {query!r} -> {lesson}"] = check_search(
                    browser, server.url, server.url, query, lesson)
            # The same site from file://: no server at all.
            by_file = ("index.html", "notebooks/02_multi_head_attention.html")
            for name in () if args.only else by_file:
                found, _ = check_page(browser, (site / name).as_uri(), "file://", None)
                outcome[f"file:// {name}"] = found
            if not args.only:
                outcome["file:// search 'RoPE'"] = check_search(
                    browser, site.as_uri(), "file://", "RoPE", SEARCHES["RoPE"])
    finally:
        server.close()
    for item, found in outcome.items():
        for message in found[:10]:
            print(f"FAIL site {item}: {message}")
        if len(found) > 10:
            print(f"FAIL site {item}: ... and {len(found) - 10} more")
        if not found:
            print(f"ok   site {item}")
    passed = sum(not found for found in outcome.values())
    print(f"site: {len(pages)} pages, bertviz SVG nodes: {svg_nodes}; screenshots: "
          f"{SHOTS.relative_to(ROOT)}/ ({time.time() - started:.0f} s)")
    print(f"{passed} passed, {len(outcome) - passed} failed")
    return 0 if passed == len(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
