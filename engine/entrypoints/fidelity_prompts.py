"""Real-text prompts for ``kvengine replay-fidelity --contexts``: a coding agent's session.

Every machine can derive them: the tool outputs are Python sources of the standard library
(``inspect.getsource``), with a short user instruction and an assistant line between them.
Each turn extends the last (one session, turns appended), and a prompt of ``n`` tokens is
the session's first ``n`` tokens, ending on a final instruction, so the prompts of two
contexts share their beginning as the turns of one conversation do. The sources are those
of the running Python (its version is reported next to the figures): the exact tokens
differ between Python versions, the kind of text does not.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable

#: Pure-Python standard-library modules, read in this order (a session's tool outputs).
MODULES = ("textwrap", "json.decoder", "shlex", "heapq", "bisect", "fnmatch", "functools",
           "dataclasses", "argparse", "string", "glob", "difflib", "calendar", "csv",
           "tokenize", "ast", "configparser", "pathlib", "logging", "inspect", "typing",
           "email.message", "http.client", "tarfile", "zipfile", "pydoc", "turtle")

INSTRUCTIONS = (
    "Read {path} and tell me where the parsing happens.",
    "Now open {path}; I think the bug is in there.",
    "Show me {path} as well.",
    "Check how {path} handles errors.",
    "Let's look at {path} next.",
)
FINAL = "\nUser: Summarize what these files do, then fix the bug.\nAssistant:"

#: Tool output read per turn at most (characters): a session reads many files, not one.
MAX_FILE_CHARS = 6000


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def session_text(min_chars: int, *, skip: int = 0) -> str:
    """The session's turns, appended until ``min_chars`` (``skip`` rotates the files, for
    the other requests of a batch). Without the final instruction."""
    parts: list[str] = []
    total = 0
    i = 0
    while total < min_chars:
        name = MODULES[(i + skip) % len(MODULES)]
        path = name.replace(".", "/") + ".py"
        src = inspect.getsource(importlib.import_module(name))[:MAX_FILE_CHARS]
        ask = INSTRUCTIONS[i % len(INSTRUCTIONS)].format(path=path)
        part = (f"User: {ask}\nAssistant: Reading {path}.\n"
                f"Tool output ({path}):\n```python\n{src}\n```\n")
        parts.append(part)
        total += len(part)
        i += 1
    return "".join(parts)


def agent_prompt(encode: Callable[..., list[int]], tokens: int, *, skip: int = 0) -> list[int]:
    """A prompt of exactly ``tokens`` tokens: the session's beginning, then the final
    instruction (the last file read is cut where the budget ends)."""
    tail = encode(FINAL, add_special_tokens=False)  # type: ignore[call-arg]
    if tokens <= len(tail):
        raise ValueError(f"a {tokens}-token prompt is shorter than the final instruction")
    body: list[int] = []
    chars = tokens * 4
    while len(body) < tokens - len(tail):
        body = encode(session_text(chars, skip=skip))
        chars *= 2
    return body[: tokens - len(tail)] + tail
