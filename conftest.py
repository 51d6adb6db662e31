"""pytest configuration shared by the course_lib tests and nbval.

bertviz draws with JavaScript that embeds every attention weight and a random container id; that
JavaScript only runs in a browser, so nbval leaves it out of the output comparison. (Its HTML part is
still compared, with the random id sanitized by tests/nbval_sanitize.cfg.)
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the course never downloads from a hub
os.environ.setdefault("MPLBACKEND", "Agg")

NOT_COMPARED = ("application/javascript",)


def pytest_collectstart(collector):
    if hasattr(collector, "skip_compare"):  # nbval's notebook collector
        collector.skip_compare = tuple(collector.skip_compare) + NOT_COMPARED
