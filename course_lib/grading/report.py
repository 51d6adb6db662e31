"""What the grader writes: grades.csv (one per class and one per lesson), report.html, feedback pages.

grades.csv: one row per submission; ``student``, ``lesson``, one column per checked exercise of the
lessons present (named by solution key, ``01.attention``; the exercise's points if passed (1 unless
``--points`` weights it), 0 if not; empty when the exercise belongs to another lesson or the
notebook could not be read), ``total`` (the sum of the points) and ``status``.
grades_NN.csv: the same rows for lesson NN only, with exactly that lesson's exercise columns: the
file to import into a learning platform's assignment for that lesson.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

from .csvfile import write_csv
from .lessons import Lesson
from .points import earned, number, worth
from .roster import RosterMatch, describe
from .runner import Graded

_STYLE = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;
vertical-align:top}th{background:#f3f3f3}.ok{color:#1a7f37}.no{color:#b42318}.na{color:#777}
.bar{fill:#4c78a8}.axis{font-size:12px}.msg{white-space:pre-wrap}.warn{background:#fff4e5;padding:.5em}"""


def _columns(rows: list[Graded], lessons: dict[str, Lesson]) -> list[str]:
    present = sorted({r.lesson for r in rows if r.lesson})
    return [k for lid in present for k in lessons[lid].keys]


def _csv(path: Path, rows: list[Graded], keys: list[str], points: dict[str, float]) -> None:
    lines: list[list[object]] = [["student", "lesson", *keys, "total", "status"]]
    for r in rows:
        marks = earned(r.results, points)
        lines.append([r.student, r.lesson, *[marks[k] if k in marks else "" for k in keys],
                      sum(marks.values()), r.status])
    write_csv(path, lines)  # a learner's id such as "=2+5" is written as text, not as a formula


def mistake_of(result: dict[str, str]) -> tuple[str, str]:
    """(the identity of the mistake a checker named, a short label for it) for one failed result.

    The identity is the checker's own, carried out of the kernel with the message: the name of the
    mistake it named (``CheckFailure.mistake``), else the place in the checker that raised
    (``CheckFailure.site``); the label is that name, else the message's first line."""
    message = result.get("message", "").strip()
    first = message.splitlines()[0] if message else "(no message)"
    mistake, site = result.get("mistake", ""), result.get("site", "")
    return (mistake or site or first), (mistake or first)


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _chart(shares: list[tuple[str, float, int]]) -> str:
    """A horizontal bar chart (inline SVG): the share of the class that passed each exercise."""
    width, bar, left = 560, 22, 190
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="pass share per exercise" '
             f'width="{width}" height="{len(shares) * (bar + 6) + 30}">']
    for i, (key, share, n) in enumerate(shares):
        y = i * (bar + 6)
        w = (width - left - 110) * share  # room for the label after a full bar
        parts.append(f'<text class="axis" x="{left - 8}" y="{y + 15}" text-anchor="end">{key}</text>'
                     f'<rect class="bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar}"/>'
                     f'<text class="axis" x="{left + w + 6:.1f}" y="{y + 15}">{share:.0%} of {n}</text>')
    y = len(shares) * (bar + 6) + 12
    parts.append(f'<text class="axis" x="{left}" y="{y}">share of the graded learners who passed</text></svg>')
    return "".join(parts)


def _roster_section(matched: RosterMatch | None, key: str) -> str:
    """Who is on one side only: submissions not in the roster, roster learners with no submission."""
    if matched is None:
        return ""
    esc = html.escape
    lost = ("".join(f"<li>{esc(s)}</li>" for s in matched.not_in_roster)
            if matched.not_in_roster else "")
    missing = ("".join(f"<li>{esc(describe(r, key))}</li>" for r in matched.no_submission)
               if matched.no_submission else "")
    return ("<h2>The roster</h2>"
            f"<p>{len(matched.matched)} submissions matched to the roster by its column <b>{esc(key)}</b>.</p>"
            f"<h3>Submissions not in the roster ({len(matched.not_in_roster)})</h3>"
            + (f"<p>Their rows are kept, marked <i>(not in roster)</i> in grades_canvas_NN.csv and left out of "
               f"grades_moodle_NN.csv.</p><ul>{lost}</ul>" if lost else "<p>None.</p>")
            + f"<h3>In the roster, no submission ({len(matched.no_submission)})</h3>"
            + (f"<ul>{missing}</ul>" if missing else "<p>None.</p>"))


def _report(rows: list[Graded], lessons: dict[str, Lesson], sandbox: str = "",
            matched: RosterMatch | None = None, roster_key: str = "", note: str = "") -> str:
    esc = html.escape
    graded = [r for r in rows if r.lesson and r.results]
    shares, pass_rows, mistakes = [], [], []
    for key in _columns(rows, lessons):
        takers = [r for r in graded if key in r.results]
        n_pass = sum(r.results[key]["outcome"] == "passed" for r in takers)
        share = n_pass / len(takers) if takers else 0.0
        shares.append((key, share, len(takers)))
        pass_rows.append([esc(key), f"{n_pass} of {len(takers)}", f"{share:.0%}"])
        named: Counter[str] = Counter()
        labels, examples = {}, {}
        for r in takers:
            if r.results[key]["outcome"] == "failed":
                identity, label = mistake_of(r.results[key])
                named[identity] += 1
                labels.setdefault(identity, label)
                examples.setdefault(identity, r.results[key]["message"])
        for identity, count in named.items():
            mistakes.append((count, key, labels[identity], examples[identity]))
    mistakes.sort(key=lambda m: (-m[0], m[1], m[2]))
    mistake_rows = [[esc(key), f"<b>{count} learner{'s' * (count != 1)}</b>: {esc(label[:200])}",
                     f"<div class='msg'>{esc(example[:1200])}</div>"]
                    for count, key, label, example in mistakes]
    peeks = [[esc(r.student), esc(", ".join(r.peeked))] for r in rows if r.peeked]
    trouble = [[esc(r.student), esc(r.lesson or "?"), esc(r.status), esc("; ".join(r.notes))]
               for r in rows if r.status != "graded"]
    n_lessons = ", ".join(sorted({r.lesson for r in rows if r.lesson})) or "none"
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Class report</title>"
            f"<style>{_STYLE}</style></head><body><h1>Class report</h1>"
            + (f"<p class='warn'>{esc(sandbox)}</p>" if sandbox else "")
            + (f"<p class='warn'>{esc(note)}</p>" if note else "")
            + f"<p>{len(rows)} submissions; {len(graded)} run and re-checked by the grader; lessons {n_lessons}. "
            "Every mark is the genuine checker's verdict on the learner's own code, re-run by the grader "
            "after the notebook.</p>"
            f"<h2>Who passed each exercise</h2>{_chart(shares)}{_table(['exercise', 'passed', 'share'], pass_rows)}"
            "<h2>The class's mistakes, most common first</h2>"
            + (_table(["exercise", "mistake the checker named", "what it said (one learner's message)"],
                      mistake_rows) if mistake_rows
               else "<p>No checker named a mistake.</p>")
            + "<h2>Solutions shown before passing</h2>"
            + (_table(["student", "exercises"], peeks) if peeks else "<p>Nobody.</p>")
            + "<h2>Submissions with problems</h2>"
            + (_table(["student", "lesson", "status", "details"], trouble) if trouble else "<p>None.</p>")
            + _roster_section(matched, roster_key)
            + "</body></html>")


def _feedback(row: Graded, lessons: dict[str, Lesson], points: dict[str, float] | None = None) -> str:
    esc = html.escape
    body = []
    for key, result in row.results.items():
        outcome = result["outcome"]
        if outcome == "passed":
            verdict = "<span class='ok'>passed</span>"
        elif outcome in ("not implemented", "missing"):
            verdict = "<span class='na'>not attempted</span>"
        else:
            verdict = "<span class='no'>not passed</span>"
        message = "" if outcome == "not implemented" else f"<div class='msg'>{esc(result['message'])}</div>"
        body.append([esc(key), verdict, message])
    total = sum(row.marks().values())
    status = "" if row.status == "graded" else f"<p><b>Note:</b> {esc(row.status)}. {esc('; '.join(row.notes))}</p>"
    lesson = f"lesson {esc(row.lesson)}" if row.lesson else "no lesson recognised"
    if points and row.results:  # weighted exercises: the points too
        earned_points = number(sum(earned(row.results, points).values()))
        total = f"{total} of {len(row.results)} exercises passed, {earned_points} of " \
                f"{number(sum(worth(k, points) for k in row.results))} points"
    else:
        total = f"{total} of {len(row.results)} exercises passed"
    table = _table(["exercise", "result", "what the checker said"], body) if body else ""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Feedback for "
            f"{esc(row.student)}</title><style>{_STYLE}</style></head><body><h1>Feedback for "
            f"{esc(row.student)}</h1><p>{lesson}: {total}.</p>"
            f"{status}{table}</body></html>")


def write_all(out: Path, rows: list[Graded], lessons: dict[str, Lesson], sandbox: str = "",
              points: dict[str, float] | None = None, matched: RosterMatch | None = None, key: str = "",
              note: str = "") -> None:
    """grades.csv, grades_NN.csv per lesson, report.html and feedback/<student>.html under ``out``;
    ``points`` weights exercises (default 1 each), ``matched`` adds the roster's section to the report,
    ``note`` a line at its top (rows resumed from an earlier run's journal)."""
    rows = sorted(rows, key=lambda r: r.student)
    points = points or {}
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    _csv(out / "grades.csv", rows, _columns(rows, lessons), points)
    for lid in sorted({r.lesson for r in rows if r.lesson}):
        _csv(out / f"grades_{lid}.csv", [r for r in rows if r.lesson == lid], lessons[lid].keys, points)
    (out / "report.html").write_text(_report(rows, lessons, sandbox, matched, key, note), encoding="utf-8")
    for r in rows:
        (out / "feedback" / f"{r.student}.html").write_text(_feedback(r, lessons, points), encoding="utf-8")
