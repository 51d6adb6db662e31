"""The course's data sets, one module each, named for what they hold.

- ``copy_task``: the copy task and a word-level vocabulary (lesson 06)
- ``variable_length``: copy or reverse with an end symbol (lesson 07)
- ``translation``: character vocabularies, padded pair batches, TSV files (lesson 08)
- ``dates``: the date-normalisation corpus (lesson 08)
- ``shakespeare``: Shakespeare's plays, split by play (lesson 09)
- ``gpt2_bpe``: GPT-2's tokenizer files (lesson 10)
- ``instructions``: instructions about the plays that a program can judge (lesson 16)
- ``files``: where fetched data lives and the sha256 check (``python -m course_lib.data fetch``)

Until lesson 15 this package was one module, ``course_lib.data``, holding the copy task, the
translation data and the dates; its names stay importable from here.
"""

from .copy_task import EOS, PAD, SOS, UNK, CopyTask, CopyTaskBatch, Vocab, pad_sequences
from .dates import (
                    DATE_FORMATS,
                    MONTHS_DE,
                    MONTHS_DE_ABBR,
                    MONTHS_EN,
                    TRAIN_FORMATS,
                    WEEKDAYS_DE,
                    WEEKDAYS_EN,
                    DatePair,
                    DatesCorpus,
                    iso_date,
                    ordinal,
                    render_date,
)
from .translation import (
                    CharVocab,
                    TranslationBatch,
                    make_translation_batch,
                    read_tsv_pairs,
                    write_tsv_pairs,
)

__all__ = [
    "CopyTaskBatch", "CopyTask", "Vocab", "pad_sequences", "PAD", "SOS", "EOS", "UNK",
    "CharVocab", "TranslationBatch", "make_translation_batch", "read_tsv_pairs", "write_tsv_pairs",
    "DATE_FORMATS", "TRAIN_FORMATS", "render_date", "iso_date", "ordinal", "DatePair", "DatesCorpus",
    "MONTHS_EN", "MONTHS_DE", "MONTHS_DE_ABBR", "WEEKDAYS_EN", "WEEKDAYS_DE",
]
