"""bertviz's interactive views, drawn offline: drop-in `head_view`, `model_view`, `neuron_view`.

bertviz (the package) draws with JavaScript that fetches require.js, d3 5.7.0 and jQuery from a CDN
when the view is displayed, so without a network its views stay blank. This module runs bertviz's
own Python and JavaScript unchanged, but hands the JavaScript d3 and jQuery from files that pip
installed (``requirements-js.txt``: d3 5.7.0 ships in the ``mpld3`` wheel, jQuery 3.7.1 in
``xstatic-jquery``), each checked against its sha256 below. Nothing is fetched when a view draws.

Each view becomes two outputs:

* ``text/html``: bertviz's container, a note "run this cell to see the interactive view" that the
  drawing replaces, and the two libraries inline (so a view also draws in an exported HTML page
  opened offline, and in Colab, which shows every cell's outputs in a frame of its own);
* ``application/javascript``: bertviz's view code with its data. ``require``/``requirejs`` are bound
  to a resolver that returns the inline libraries, so no loader and no globals are needed.

The libraries are about 300 KB. A notebook with several views can store them once:
``show_libraries()`` in a cell above the first view displays them in its own output, and the views
run after it in the same kernel leave them out and wait for that output's copy. Views run without
it (another kernel, Colab, ``html_action="return"``) still carry their own copy.

If the libraries are missing or their checksum differs, every function falls back to bertviz as
shipped (which works with a network). Same signatures as bertviz's functions::

    from course_lib.bertviz_views import head_view, model_view  # not: from bertviz import ...
    show_neuron_view("the cat sat on the mat", layer=2, head=0)    # MiniLM's queries and keys
"""

from __future__ import annotations

import functools
import hashlib
import html
import importlib
import inspect
import json
import os
import re
import sys
from importlib import metadata

from IPython.display import HTML, display

__all__ = [
    "head_view",
    "model_view",
    "neuron_view",
    "show_libraries",
    "show_neuron_view",
    "load_neuron_view_model",
    "vendored_libraries",
    "VENDORED",
    "PLACEHOLDER",
]

# (distribution, file inside it, sha256 of that file). Pinned with their wheels' hashes in
# requirements-js.txt; bertviz's JavaScript asks for d3 5.7.0, which is exactly the file below.
VENDORED = {
    "d3": ("mpld3", "mpld3/js/d3.v5.min.js",
           "bdad5585ef9a965ff25458738309b006058c55f2c78d794d25fbecae35014609"),
    "jquery": ("xstatic-jquery", "xstatic/pkg/jquery/data/jquery.slim.min.js",
               "9261efb3407e3a9096e4654750d8eff6b3a663422f48845c7fbcc65034c340cf"),
}

PLACEHOLDER = (
    "Interactive bertviz view: run this cell to see the interactive view. (Jupyter does not run "
    "the JavaScript stored in a notebook it does not trust, and GitHub never runs it.)"
)

LIBRARIES_NOTE = (
    "d3 5.7.0 and jQuery 3.7.1 for the bertviz views below, stored once in this output (offline "
    "copies: nothing is fetched)."
)
MISSING_NOTE = (
    "Interactive bertviz view: d3 and jQuery are not on this page. Run the cell with "
    "show_libraries() above (it stores them once for every view), then this cell again."
)

# True once show_libraries() has displayed the libraries in this kernel: later views leave them out.
_LIBRARIES_SHOWN = False

_SCRIPT_OPEN = '\n<script type="text/javascript">\n'  # how bertviz 1.4 joins HTML and JavaScript
_SCRIPT_CLOSE = "\n</script>\n"


@functools.lru_cache(maxsize=None)
def vendored_libraries() -> dict[str, str] | None:
    """The source of d3 and jQuery, keyed like bertviz's require names; None if one is missing.

    A file whose sha256 differs from the pinned one counts as missing (then bertviz's CDN is used).
    """
    sources = {}
    for name, (distribution, path, sha256) in VENDORED.items():
        try:
            data = metadata.distribution(distribution).locate_file(path).read_bytes()
        except (metadata.PackageNotFoundError, OSError):
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            return None
        sources[name] = data.decode("utf-8")
    return sources


def _script_safe(code: str) -> str:
    """JavaScript that can sit inside <script>...</script> (no early "</script>")."""
    return re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)


def _libraries_html(libs: dict[str, str]) -> str:
    """A <script> that evaluates d3 and jQuery once per page, without touching page globals.

    d3's UMD header assigns to `this.d3`, so it runs with `this` = a private object; jQuery sees a
    CommonJS `module` and returns itself instead of setting window.$; `define` is hidden from both.
    """
    return (
        "<script>\n(function () {\n"
        "  if (window.__courseBertvizLibs) { return; }\n"
        "  var holder = {}, jq = {exports: {}};\n"
        "  (function (exports, module, define) {\n"
        f"{_script_safe(libs['d3'])}\n"
        "  }).call(holder, undefined, undefined, undefined);\n"
        "  (function (module, define) {\n"
        f"{_script_safe(libs['jquery'])}\n"
        "  }).call(window, jq, undefined);\n"
        "  window.__courseBertvizLibs = {d3: holder.d3, jquery: jq.exports};\n"
        "})();\n</script>\n"
    )


def _view_js(root_id: str, vis_js: str, lean: bool = False) -> str:
    """bertviz's view code, run with `require`/`requirejs` resolving to the inline libraries.

    It waits for its container (and the libraries): every 50 ms, for 10 s. A ``lean`` view, whose
    libraries come with ``show_libraries()``'s output (which the page may render later), waits
    longer, every second for 10 more minutes, and after 10 s without them says so in its note.
    """
    if lean:
        missing = json.dumps(MISSING_NOTE)
        wait = (
            "      // Jupyter may run this before it attaches the view's container to the page, and\n"
            "      // the libraries come with another output, which the page may render later.\n"
            "      tries++;\n"
            "      if (tries === 200 && !libs) {\n"
            f"        var waiting = document.querySelector('#{root_id} .course-bertviz-note');\n"
            f"        if (waiting) {{ waiting.textContent = {missing}; }}\n"
            "      }\n"
            "      if (tries < 800) { setTimeout(draw, tries < 200 ? 50 : 1000); }\n"
        )
    else:
        wait = (
            "      // Jupyter may run this before it attaches the view's container to the page.\n"
            "      if (tries++ < 200) { setTimeout(draw, 50); }\n"
        )
    return (
        "(function () {\n"
        "  var tries = 0;\n"
        "  function draw() {\n"
        "    var libs = window.__courseBertvizLibs;\n"
        f"    if (!libs || !document.getElementById('{root_id}')) {{\n"
        + wait +
        "      else { console.error('course_lib.bertviz_views: no d3/jQuery or no container'); }\n"
        "      return;\n"
        "    }\n"
        "    var resolve = function (names, callback) {\n"
        "      callback.apply(null, names.map(function (name) { return libs[name]; }));\n"
        "    };\n"
        "    resolve.config = function () {};\n"
        f"    var note = document.querySelector('#{root_id} .course-bertviz-note');\n"
        "    if (note) { note.remove(); }\n"
        "    (function (require, requirejs) {\n"
        f"{_script_safe(vis_js)}\n"
        "    }).call(window, resolve, resolve);\n"
        "  }\n"
        "  draw();\n"
        "})();\n"
    )


def _split_bertviz_html(page: str) -> tuple[str, str] | None:
    """bertviz's html_action='return' page -> (container HTML, JavaScript); None if unexpected."""
    if not page.startswith("<script src=") or _SCRIPT_OPEN not in page:
        return None
    page = page[page.index("</script>") + len("</script>"):]  # drop the CDN require.js tag
    container, *scripts = page.split(_SCRIPT_OPEN)
    if not scripts or not all(s.endswith(_SCRIPT_CLOSE) for s in scripts):
        return None
    return container, "\n".join(s[: -len(_SCRIPT_CLOSE)] for s in scripts)


def _root_id(container: str) -> str | None:
    start = container.find("bertviz-")
    if start < 0:
        return None
    end = start + len("bertviz-")
    while end < len(container) and container[end] in "0123456789abcdef":
        end += 1
    return container[start:end]


def _with_note(container: str) -> str:
    note = f'<p class="course-bertviz-note" style="color:#555">{html.escape(PLACEHOLDER)}</p>'
    for vis in ("<div id='vis'></div>", '<div id="vis"></div>'):
        if vis in container:
            return container.replace(vis, vis[:-6] + note + "</div>", 1)
    return container + note


def _rounded(tensor):
    """4 decimals are plenty for a picture, and make the stored view's data 3x smaller."""
    return tensor.detach().double().mul(1e4).round().div(1e4)


class _RoundedOutputs:
    """A neuron-view model whose attention, queries and keys come back rounded (see _rounded)."""

    def __init__(self, model):
        self.model = model

    def eval(self):
        self.model.eval()
        return self

    def __call__(self, *args, **kwargs):
        output = self.model(*args, **kwargs)
        layers = [{key: _rounded(value) for key, value in layer.items()} for layer in output[-1]]
        return (*output[:-1], layers)


def _offline(bertviz_function, args, kwargs):
    """Run `bertviz_function` with html_action='return' and display its view offline."""
    bound = inspect.signature(bertviz_function).bind(*args, **kwargs)
    bound.apply_defaults()
    action = bound.arguments["html_action"]
    libs = vendored_libraries()
    if libs is None or action not in ("view", "return"):
        return bertviz_function(*args, **kwargs)  # bertviz as shipped: CDN, and its own errors
    bound.arguments["html_action"] = "return"
    for name in ("attention", "encoder_attention", "decoder_attention", "cross_attention"):
        if bound.arguments.get(name) is not None:
            bound.arguments[name] = [_rounded(t) for t in bound.arguments[name]]
    if "model" in bound.arguments:
        bound.arguments["model"] = _RoundedOutputs(bound.arguments["model"])
    parts = _split_bertviz_html(bertviz_function(*bound.args, **bound.kwargs).data)
    root_id = parts and _root_id(parts[0])
    if not root_id:
        return bertviz_function(*args, **kwargs)
    container, vis_js = parts
    # bertviz 1.4.1's neuron view expands into the page's first #vis, another view's if there are
    # several; point it at its own container.
    vis_js = vis_js.replace('d3.select("#vis")', "d3.select(`#${config.rootDivId} #vis`)")
    if action == "return":  # a page of its own: it must carry the libraries
        return HTML(_with_note(container) + _libraries_html(libs) + "<script>\n"
                    + _view_js(root_id, vis_js) + "</script>\n")
    lean = _LIBRARIES_SHOWN and not _in_colab()
    head = _with_note(container) + ("" if lean else _libraries_html(libs))
    code = _view_js(root_id, vis_js, lean)
    display(HTML(head))
    # text/plain is what Jupyter shows for this output where it may not run JavaScript.
    display({"application/javascript": code, "text/plain": ""}, raw=True)
    return None


def _in_colab() -> bool:
    """Colab shows each cell's outputs in a frame of its own: there, every view needs its copy."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def show_libraries() -> None:
    """Display d3 and jQuery once, for every bertviz view displayed after it in this kernel.

    Put it in a cell above a notebook's first view: its output stores the libraries (about
    300 KB), and the views leave them out. Re-running any view is fine (the page keeps the
    libraries, and the stored output brings them back after a reload); a view run in a kernel
    that has not run this cell carries its own copy, as does every view in Colab. Without the
    vendored files (see ``vendored_libraries``) it does nothing and the views use bertviz's CDN.
    """
    global _LIBRARIES_SHOWN
    libs = vendored_libraries()
    if libs is None:
        return
    note = f'<p class="course-libraries-note" style="color:#555">{html.escape(LIBRARIES_NOTE)}</p>'
    display(HTML(note + _libraries_html(libs)))
    _LIBRARIES_SHOWN = True


def _bertviz(name):
    """bertviz's own function (imported late: importing bertviz takes a moment)."""
    module, function = {
        "head_view": ("bertviz.head_view", "head_view"),
        "model_view": ("bertviz.model_view", "model_view"),
        "neuron_view": ("bertviz.neuron_view", "show"),
    }[name]
    return getattr(importlib.import_module(module), function)


def _same_signature(name):
    """Give the wrapper bertviz's signature and docstring (help() shows bertviz's arguments)."""

    def decorate(wrapper):
        try:
            functools.update_wrapper(wrapper, _bertviz(name), assigned=("__doc__",))
            wrapper.__signature__ = inspect.signature(_bertviz(name))
        except ImportError:
            pass
        return wrapper

    return decorate


@_same_signature("head_view")
def head_view(*args, **kwargs):
    return _offline(_bertviz("head_view"), args, kwargs)


@_same_signature("model_view")
def model_view(*args, **kwargs):
    return _offline(_bertviz("model_view"), args, kwargs)


@_same_signature("neuron_view")
def neuron_view(*args, **kwargs):
    """bertviz.neuron_view.show(model, model_type, tokenizer, sentence_a, ...), drawn offline."""
    return _offline(_bertviz("neuron_view"), args, kwargs)


@functools.lru_cache(maxsize=1)
def load_neuron_view_model():
    """MiniLM in bertviz's neuron-view classes (they return queries and keys), from the package.

    bertviz's ``transformers_neuron_view.BertModel`` would download its weights by name; we build
    it from the packaged config and load the packaged (sha256-checked) safetensors instead.
    Returns ``(model, tokenizer)``, the model in eval mode.
    """
    from bertviz.transformers_neuron_view import BertConfig, BertModel, BertTokenizer
    from safetensors.torch import load_file

    from .pretrained import minilm_path

    folder = minilm_path()  # checks the sha256 of model.safetensors
    config = BertConfig.from_json_file(str(folder / "config.json"))
    config.output_attentions = True
    model = BertModel(config)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or set(unexpected) - {"embeddings.position_ids"}:
        raise ValueError(f"MiniLM does not fit bertviz's BertModel: missing {missing}, "
                         f"unexpected {unexpected}")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    return model.eval(), tokenizer


def show_neuron_view(sentence_a: str, sentence_b: str | None = None, layer: int = 0,
                     head: int = 0, display_mode: str = "light", html_action: str = "view"):
    """bertviz's neuron view of MiniLM: query, key, q x k, q . k and softmax for one head.

    Offline: the weights come from the packaged model (see ``course_lib.pretrained``).
    """
    model, tokenizer = load_neuron_view_model()
    return neuron_view(model, "bert", tokenizer, sentence_a, sentence_b,
                       display_mode=display_mode, layer=layer, head=head, html_action=html_action)

