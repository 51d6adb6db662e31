"""course_lib.bertviz_views: bertviz's views with vendored d3/jQuery, the fallback, the neuron view.

Whether a view really draws is a browser's job (`make test-browser`); here: what goes into the
notebook, the checksums, the signatures, the fallback, and MiniLM in bertviz's neuron-view classes.
"""

import hashlib
import inspect
import json
import math
import re
from importlib import metadata

import importlib

import pytest
import torch

from course_lib import bertviz_views
from course_lib.bertviz_views import head_view, model_view, neuron_view

# bertviz/__init__.py rebinds bertviz.head_view to the function, so import the modules by name.
BERTVIZ_HEAD = importlib.import_module("bertviz.head_view").head_view
BERTVIZ_MODEL = importlib.import_module("bertviz.model_view").model_view
BERTVIZ_NEURON = importlib.import_module("bertviz.neuron_view").show

TOKENS = ["[CLS]", "time", "flies", "[SEP]"]


def attention(layers=2, heads=3, rows=4, cols=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn(1, heads, rows, cols, generator=generator), -1)
            for _ in range(layers)]


@pytest.fixture(autouse=True)
def fresh_kernel(monkeypatch):
    """Every test starts as a kernel that has not run show_libraries(), outside Colab."""
    monkeypatch.setattr(bertviz_views, "_LIBRARIES_SHOWN", False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)


@pytest.fixture
def displayed(monkeypatch):
    """What a view passes to IPython's display(), in order."""
    shown = []
    monkeypatch.setattr(bertviz_views, "display", lambda obj, raw=False: shown.append(obj))
    return shown


def test_vendored_files_are_the_pinned_ones():
    libs = bertviz_views.vendored_libraries()
    assert libs is not None, "run: pip install --no-deps --require-hashes -r requirements-js.txt"
    assert libs["d3"].startswith("// https://d3js.org v5.7.0")  # the d3 bertviz asks its CDN for
    assert "jQuery v3.7.1" in libs["jquery"][:200]
    for name, (distribution, path, sha256) in bertviz_views.VENDORED.items():
        data = metadata.distribution(distribution).locate_file(path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, name


def test_same_signatures_as_bertviz():
    assert inspect.signature(head_view) == inspect.signature(BERTVIZ_HEAD)
    assert inspect.signature(model_view) == inspect.signature(BERTVIZ_MODEL)
    assert inspect.signature(neuron_view) == inspect.signature(BERTVIZ_NEURON)


def test_head_view_displays_container_libraries_and_code_without_cdn(displayed):
    assert head_view(attention(), TOKENS, layer=1, heads=[0]) is None
    page, code = displayed
    html = page.data
    assert re.search(r'<div id="bertviz-[0-9a-f]{32}"', html)
    assert bertviz_views.PLACEHOLDER.split(":")[0] in html  # shown where scripts do not run
    assert "d3js.org v5.7.0" in html and "jQuery v3.7.1" in html
    assert "<script src=" not in html  # nothing is fetched
    assert set(code) == {"application/javascript", "text/plain"}
    assert "__courseBertvizLibs" in code["application/javascript"]
    assert '"time"' in code["application/javascript"] and '"layer": 1' in code["application/javascript"]


def test_the_html_part_is_the_same_on_every_run(displayed):
    """nbval compares text/html: apart from bertviz's random id it must not change."""
    head_view(attention(seed=0), TOKENS)
    head_view(attention(seed=1), TOKENS)
    first, second = (re.sub(r"bertviz-[0-9a-f]{32}", "ID", out.data) for out in displayed[::2])
    assert first == second


def test_model_view_encoder_decoder_mode(displayed):
    model_view(encoder_attention=attention(rows=4, cols=4),
               decoder_attention=attention(rows=3, cols=3),
               cross_attention=attention(rows=3, cols=4),
               encoder_tokens=list("abcd"), decoder_tokens=list("xyz"))
    page, code = displayed
    assert "Cross" in page.data and '"Cross"' in code["application/javascript"]


def test_return_gives_one_self_contained_page():
    page = head_view(attention(), TOKENS, html_action="return").data
    assert page.count("<script>") == 2 and "d3js.org v5.7.0" in page and "<script src=" not in page


def test_falls_back_to_bertviz_as_shipped_without_the_files(monkeypatch):
    monkeypatch.setattr(bertviz_views, "vendored_libraries", lambda: None)
    page = head_view(attention(), TOKENS, html_action="return").data
    assert page.startswith('<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js')


def test_a_changed_file_counts_as_missing(monkeypatch):
    bertviz_views.vendored_libraries.cache_clear()
    changed = dict(bertviz_views.VENDORED, d3=("mpld3", "mpld3/js/d3.v5.min.js", "0" * 64))
    monkeypatch.setattr(bertviz_views, "VENDORED", changed)
    try:
        assert bertviz_views.vendored_libraries() is None
    finally:
        bertviz_views.vendored_libraries.cache_clear()


def test_bertviz_errors_stay_bertviz_errors():
    with pytest.raises(ValueError, match="number of tokens"):
        head_view(attention(), TOKENS[:3])


def test_script_end_tags_in_data_are_escaped(displayed):
    head_view(attention(), ["<s>", "</script>", "b", "c"])
    assert "</script>" not in displayed[1]["application/javascript"]


def test_neuron_view_model_is_minilm_and_its_arithmetic_is_the_views():
    from course_lib.pretrained import load_hf_bert, load_tokenizer

    model, tokenizer = bertviz_views.load_neuron_view_model()
    hf_tokenizer = load_tokenizer()
    sentence = "time flies like an arrow"
    tokens = ["[CLS]", *tokenizer.tokenize(sentence), "[SEP]"]
    encoded = hf_tokenizer(sentence, return_tensors="pt")
    assert tokens == hf_tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    with torch.no_grad():
        layers = model(torch.tensor([tokenizer.convert_tokens_to_ids(tokens)]))[-1]
        reference = load_hf_bert()(**encoded, output_attentions=True).attentions
    for layer in (0, 5):
        q, k = layers[layer]["queries"][0], layers[layer]["keys"][0]  # (heads, L, head_dim)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), -1)
        assert torch.allclose(weights, layers[layer]["attn"][0], atol=1e-5)
        assert torch.allclose(weights, reference[layer][0], atol=1e-5)


def test_show_neuron_view_displays_offline(displayed):
    bertviz_views.show_neuron_view("the cat sat", layer=2, head=1)
    page, code = displayed
    assert 'id="att_head"' in page.data and "<script src=" not in page.data
    assert "window.bertviz_params" in code["application/javascript"]
    assert '"queries"' in code["application/javascript"]


def test_view_data_is_rounded_to_4_decimals(displayed):
    head_view(attention(), TOKENS)
    code = displayed[1]["application/javascript"]
    params = code[code.index("const params = "):code.index("; // HACK")]
    assert re.search(r"\d\.\d{3,4}", params) and not re.search(r"\d\.\d{5,}", params)


def test_show_libraries_stores_them_once_and_later_views_leave_them_out(displayed):
    bertviz_views.show_libraries()
    head_view(attention(), TOKENS, layer=1, heads=[0])
    model_view(attention(), TOKENS)
    libraries, *views = displayed
    assert "d3js.org v5.7.0" in libraries.data and "jQuery v3.7.1" in libraries.data
    assert "__courseBertvizLibs" in libraries.data
    assert "bertviz-" not in libraries.data  # not a view: the browser test counts views by this id
    assert bertviz_views.LIBRARIES_NOTE in libraries.data
    pages, codes = views[::2], views[1::2]
    assert len(pages) == 2
    for page, code in zip(pages, codes):
        assert re.search(r'<div id="bertviz-[0-9a-f]{32}"', page.data)
        assert bertviz_views.PLACEHOLDER.split(":")[0] in page.data
        assert "d3js.org" not in page.data and "jQuery v3" not in page.data
        assert len(page.data) < 10_000  # the libraries are about 300 KB
        script = code["application/javascript"]
        assert "window.__courseBertvizLibs" in script
        assert json.dumps(bertviz_views.MISSING_NOTE) in script  # said when they never come


def test_views_carry_their_own_libraries_in_colab_and_as_a_page(displayed, monkeypatch):
    bertviz_views.show_libraries()
    assert "d3js.org v5.7.0" in head_view(attention(), TOKENS, html_action="return").data
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")  # each output has its own frame
    head_view(attention(), TOKENS)
    assert "d3js.org v5.7.0" in displayed[-2].data


def test_show_libraries_without_the_files_does_nothing(displayed, monkeypatch):
    monkeypatch.setattr(bertviz_views, "vendored_libraries", lambda: None)
    bertviz_views.show_libraries()
    assert displayed == [] and not bertviz_views._LIBRARIES_SHOWN
