"""Where the Triton tests run.

Triton's interpreter (the only way to run its kernels without a GPU) is chosen once per
process, when Triton is first imported. So on a machine without a GPU the tests under
``triton/`` are not collected here: ``test_triton_interpreter.py`` runs them in a child
pytest started with ``TRITON_INTERPRET=1``, and this process never imports Triton in
interpreter mode (nothing leaks into other tests, whatever their import order). With a
GPU (or ``KERNELS_TEST_DEVICE`` set) they are collected here and run compiled.
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETER_CHILD = os.environ.get("TRITON_INTERPRET") == "1"
ON_DEVICE = bool(os.environ.get("KERNELS_TEST_DEVICE")) or torch.cuda.is_available()

collect_ignore = [] if HAS_TRITON and (ON_DEVICE or INTERPRETER_CHILD) else ["triton"]
