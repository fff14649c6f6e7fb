"""Whole models: a problem's model decomposed into parts worth one kernel each, ranked by their share
of the model's GPU time, written as problems of their own, and composed back into one candidate
(docs/models.md). Plain Python: what needs torch runs in the sandbox (`harness/worker/decompose_trace.py`)."""
