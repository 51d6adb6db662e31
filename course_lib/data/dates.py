"""A date-normalisation corpus generated offline (lesson 08): "3rd of March 2024" -> "2024-03-03".

``DatesCorpus`` writes dates from 1900 to 2099 in many surface forms ("3rd of March 2024",
"Sonntag, 3. März 2024", "3/3/2024", ...) and asks for ISO 8601 ("2024-03-03").
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from .translation import CharVocab, TranslationBatch, make_translation_batch

__all__ = ["MONTHS_EN", "MONTHS_DE", "MONTHS_DE_ABBR", "WEEKDAYS_EN", "WEEKDAYS_DE", "DATE_FORMATS", "TRAIN_FORMATS", "ordinal", "render_date", "iso_date", "DatePair", "DatesCorpus"]

# ----------------------------------------------------------------------------------------------
# The date corpus
# ----------------------------------------------------------------------------------------------

MONTHS_EN = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
MONTHS_DE = [
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
]
MONTHS_DE_ABBR = [
    "Jan",
    "Feb",
    "Mär",
    "Apr",
    "Mai",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Okt",
    "Nov",
    "Dez",
]
WEEKDAYS_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WEEKDAYS_DE = ["Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"]


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 3 -> '3rd', 11 -> '11th', 22 -> '22nd'."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


# Each surface form: name -> function(date) -> text. Weekdays come from the calendar
# (date.weekday()).
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "en day month": lambda d: f"{d.day} {MONTHS_EN[d.month - 1]} {d.year}",
    "en month day": lambda d: f"{MONTHS_EN[d.month - 1]} {d.day}, {d.year}",
    "en ordinal": lambda d: f"{ordinal(d.day)} of {MONTHS_EN[d.month - 1]} {d.year}",
    "en weekday": lambda d: (
        f"{WEEKDAYS_EN[d.weekday()]}, {MONTHS_EN[d.month - 1]} {d.day}, {d.year}"
    ),
    "en abbreviated": lambda d: (
        f"{WEEKDAYS_EN[d.weekday()][:3]} {d.day} {MONTHS_EN[d.month - 1][:3]} {d.year}"
    ),
    "de day month": lambda d: f"{d.day}. {MONTHS_DE[d.month - 1]} {d.year}",
    "de weekday": lambda d: (
        f"{WEEKDAYS_DE[d.weekday()]}, {d.day}. {MONTHS_DE[d.month - 1]} {d.year}"
    ),
    "de abbreviated": lambda d: (
        f"{WEEKDAYS_DE[d.weekday()][:2]}, {d.day:02d}. {MONTHS_DE_ABBR[d.month - 1]} {d.year}"
    ),
    "numeric m/d/y": lambda d: f"{d.month}/{d.day}/{d.year}",
    "numeric d.m.y": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "numeric y/m/d": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
}
# The last form is left out of training by default: lesson 08 uses it to show what the model does
# not generalise to (the year first, an order it never saw).
TRAIN_FORMATS: tuple[str, ...] = tuple(name for name in DATE_FORMATS if name != "numeric y/m/d")


def render_date(d: datetime.date, fmt: str) -> str:
    """The date ``d`` written in the surface form ``fmt`` (a key of ``DATE_FORMATS``)."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"render_date: unknown format {fmt!r}; known: {', '.join(DATE_FORMATS)}")
    return DATE_FORMATS[fmt](d)


def iso_date(d: datetime.date) -> str:
    """The target form, ISO 8601: ``2024-03-03``."""
    return d.isoformat()


class DatePair(NamedTuple):
    """One example: ``source`` text, ``target`` ISO date, the surface ``format`` and the
    ``date``."""

    source: str
    target: str
    format: str
    date: datetime.date


class DatesCorpus:
    """Dates from ``first_year`` to ``last_year`` in several surface forms, to ISO 8601.

    The held-out set is chosen **by date**: ``num_heldout`` dates are drawn once (``seed``) and
    never appear in training, in any format. Each held-out date is written in one training format,
    the formats taking turns, so every format has the same share of the held-out set
    (``heldout_pairs(fmt)`` writes all of them in one format instead). The held-out dates depend
    on ``seed`` and ``num_heldout`` only, not on ``formats``: a corpus with more training formats
    (lesson 08 adds the year-first form) is scored on the same unseen dates.

    Vocabularies are separate and character-level: ``src_vocab`` holds every character any format of
    ``DATE_FORMATS`` can produce (the held-out format included), ``tgt_vocab`` the digits and ``-``.
    Neither has ``<unk>``: an unknown character is a bug here, and it raises.
    """

    def __init__(
        self,
        num_heldout: int = 2000,
        seed: int = 0,
        formats: Sequence[str] = TRAIN_FORMATS,
        first_year: int = 1900,
        last_year: int = 2099,
    ) -> None:
        if first_year > last_year or first_year < 1:
            raise ValueError(
                f"DatesCorpus: need 1 <= first_year <= last_year, got {first_year}, {last_year}"
            )
        unknown = [f for f in formats if f not in DATE_FORMATS]
        if unknown or not formats:
            raise ValueError(
                f"DatesCorpus: formats must be a non-empty list of DATE_FORMATS keys, got "
                f"{unknown or formats}"
            )
        self.formats = tuple(formats)
        self.first = datetime.date(first_year, 1, 1)
        self.last = datetime.date(last_year, 12, 31)
        self.num_days = (self.last - self.first).days + 1
        if not 0 < num_heldout < self.num_days:
            raise ValueError(
                f"DatesCorpus: num_heldout must be in [1, {self.num_days - 1}], got {num_heldout}"
            )
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(self.num_days, generator=gen)
        self._heldout_days = order[:num_heldout].sort().values  # day offsets from self.first
        self._train_days = order[num_heldout:].sort().values
        self.heldout_dates = [self._date(int(i)) for i in self._heldout_days]
        self._heldout_set = set(self.heldout_dates)
        # the held-out dates in a seeded shuffled order, each in one format, formats taking turns
        shuffled = torch.randperm(num_heldout, generator=gen).tolist()
        self.heldout: list[DatePair] = [None] * num_heldout  # type: ignore[list-item]
        for rank, i in enumerate(shuffled):
            self.heldout[i] = self.pair(
                self.heldout_dates[i], self.formats[rank % len(self.formats)]
            )
        self.src_vocab = CharVocab.build(self._all_source_characters())
        self.tgt_vocab = CharVocab.build("0123456789-")

    @staticmethod
    def _all_source_characters() -> set[str]:
        words = (
            MONTHS_EN + MONTHS_DE + MONTHS_DE_ABBR + WEEKDAYS_EN + WEEKDAYS_DE + ["st nd rd th of"]
        )
        return {ch for w in words for ch in w} | set("0123456789 ,./")

    def _date(self, offset: int) -> datetime.date:
        return self.first + datetime.timedelta(days=offset)

    @staticmethod
    def pair(d: datetime.date, fmt: str) -> DatePair:
        return DatePair(render_date(d, fmt), iso_date(d), fmt, d)

    def is_heldout(self, d: datetime.date) -> bool:
        return d in self._heldout_set

    def heldout_pairs(self, fmt: str | None = None) -> list[DatePair]:
        """The held-out set: as drawn (``fmt=None``), or every held-out date written in ``fmt``."""
        if fmt is None:
            return list(self.heldout)
        return [self.pair(d, fmt) for d in self.heldout_dates]

    def sample_pairs(self, n: int, generator: torch.Generator) -> list[DatePair]:
        """``n`` random training pairs: a date that is not held out, in a random training format."""
        if n < 1:
            raise ValueError(f"DatesCorpus.sample_pairs: n must be >= 1, got {n}")
        days = self._train_days[torch.randint(len(self._train_days), (n,), generator=generator)]
        fmts = torch.randint(len(self.formats), (n,), generator=generator)
        return [self.pair(self._date(int(d)), self.formats[int(f)]) for d, f in zip(days, fmts)]

    def batch(self, pairs: Sequence[Sequence[str]]) -> TranslationBatch:
        """Padded batch of pairs with this corpus's vocabularies."""
        return make_translation_batch(pairs, self.src_vocab, self.tgt_vocab)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> TranslationBatch:
        """A fresh batch of ``batch_size`` random training pairs."""
        return self.batch(self.sample_pairs(batch_size, generator))
