"""Grading a class's notebooks (``python -m course_lib.grade``; README, "For instructors").

One module per step: ``lessons`` (what each lesson's exercises and checker calls are, and which
lesson a submission is), ``limits`` (the kernel launcher that sets the memory limit), ``kernel_side``
(the re-check that runs inside the learner's kernel), ``runner`` (one submission, start to row) and
``report`` (grades.csv, report.html, feedback pages).
"""
