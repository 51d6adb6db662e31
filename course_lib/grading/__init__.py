"""Grading a class's notebooks (``python -m course_lib.grading``; docs/instructors.md).

One module per step: ``lessons`` (what each lesson's exercises and checker calls are, and which
lesson a submission is), ``limits`` (the kernel launcher that sets the memory limit), ``kernel_side``
and ``kernel_recheck`` (what runs inside the learner's kernel: the state its notebook may change, then
the re-check), ``runner`` (one submission, start to row),
``report`` (grades.csv, report.html, feedback pages) and ``csvfile`` (every CSV file's cells, none
of them a formula).

On learning platforms (#41): ``points`` (points per exercise), ``roster`` (the platform's roster
export, matched to the file stems), ``canvas`` and ``moodle`` (their import files), ``platforms``
(those options on the command line), ``shards`` (``--shard K/N`` and rows.json), ``merge``
(``python -m course_lib.grading.merge``), ``gradescope`` (the autograder zip) and
``gradescope_run`` (inside Gradescope's container: grade, write results.json).

A run killed midway (#49): ``journal`` (what the same command resumes from; dead runs' scratch
folders removed); ``integrity`` (course_lib on disk as the run found it, checked around each
submission, or the run stops).
"""
