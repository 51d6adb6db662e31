"""Measured studies of one lesson each, and the stored runs they write.

Each trains many short runs (seeds, settings) that a lesson loads instead of training them live
(``make adam-betas``, ``make ablation``, ...): the runs are stored per float path in
``course_lib/results/`` by ``stored``.

- ``adam_betas``: Adam's beta1, 0.7 against 0.9, on the copy task (lesson 06)
- ``dates_remedy``: the remedy for a date format never seen in training (lesson 08)
- ``tokens_vs_chars``: lesson 09's GPT on characters and on BPE tokens (lesson 10)
- ``ablation``: what each change of the Llama-style block buys (lesson 11)
- ``extrapolation``: length generalisation of learned, sinusoidal, RoPE and ALiBi positions (lesson 11)
- ``finetuning``: lesson 09's GPT fine-tuned on the poems by every mode and LoRA rank (lesson 15)
- ``instruct``: SFT with a chat template, preference pairs a program judges, DPO at three betas (lesson 16)
- ``stored``: saving and loading runs per float path
"""
