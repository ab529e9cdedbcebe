"""A scripted tool-using agent against ``kvengine serve``: the official ``openai`` client,
tools that read this repository's files, ``--turns`` turns of one tool call and one tool
result each — the traffic the store is built for (a stable system prompt, a growing tool
history). Each turn prints the share of its prompt served from cache; from turn 3 on it
must be at least ``--min-cached`` (exit 1 otherwise).

    kvengine serve --model ~/.cache/kvengine/models/smollm2-135m-instruct \\
        --kv-store embedded --tool-call-parser hermes \\
        --chat-template examples/tool_chat_template_hermes.jinja --listen 127.0.0.1:8000 &
    python examples/agent_loop.py --base-url http://127.0.0.1:8000/v1

``--tool-choice required`` (the default) makes the server's grammar write a valid call
every turn, so even a small model keeps the loop going; ``auto`` lets the model choose.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

REPO = Path(__file__).resolve().parents[1]
RESULT_CHARS = 400  # a tool result's size: the per-turn growth of the history
# The system prompt's size (~4.5 K tokens): a stable prefix that does not grow with the
# README it quotes, so ten turns keep fitting SmolLM2's 8 K context.
SYSTEM_CHARS = 18_000
FILES = ["README.md", "pyproject.toml", "engine/server/README.md", "engine/core/sampler.py",
         "engine/core/sampling_params.py", "engine/server/tool_parsers.py",
         "engine/core/scheduler.py", "engine/core/llm_engine.py", "engine/server/app.py",
         "engine/structured/spec.py"]
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository (its start).",
        "parameters": {"type": "object", "properties": {"path": {"enum": FILES}},
                       "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"enum": [".", "engine", "engine/server", "examples", "bench"]}},
            "required": ["path"], "additionalProperties": False}}},
]


@dataclass(frozen=True, slots=True)
class Turn:
    index: int  # from 1
    prompt_tokens: int
    cached_tokens: int
    call: str

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_tool(name: str, args: dict[str, Any], root: Path, limit: int = RESULT_CHARS) -> str:
    """A tool's result, confined to ``root`` (the model chooses only among listed paths)."""
    path = (root / str(args.get("path", "."))).resolve()
    if root.resolve() not in (path, *path.parents):
        return "error: outside the repository"
    if name == "list_dir" and path.is_dir():
        return "\n".join(sorted(p.name for p in path.iterdir()))[:limit]
    if name == "read_file" and path.is_file():
        return path.read_text(encoding="utf-8", errors="replace")[:limit]
    return f"error: no such {'directory' if name == 'list_dir' else 'file'}"


def system_prompt(root: Path, chars: int | None = None) -> str:
    # A coding agent's long, stable instructions: the server's own documentation.
    doc = (root / "engine" / "server" / "README.md").read_text(encoding="utf-8")
    return ("You are a coding agent working in the kvstore repository. Use the tools to "
            "read files before you answer. Reference:\n\n" + doc[:chars])


def run_agent(client: openai.OpenAI, model: str, turns: int, root: Path = REPO,
              tool_choice: str = "required", max_tokens: int = 160,
              system_chars: int | None = SYSTEM_CHARS, result_chars: int = RESULT_CHARS
              ) -> list[Turn]:
    """``system_chars`` and ``result_chars`` bound the system prompt and each tool result
    (a small model's context)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(root, system_chars)},
        {"role": "user", "content": "Find out how the server samples tokens and what it "
                                    "caches, one file at a time."}]
    out = []
    for i in range(1, turns + 1):
        r = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice,
            parallel_tool_calls=False, max_tokens=max_tokens, temperature=0.7, seed=i)
        msg = r.choices[0].message
        usage = r.usage
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        calls = msg.tool_calls or []
        call = calls[0] if calls else None
        label = (f"{call.function.name}({call.function.arguments})" if call
                 else f"(no call) {msg.content!r:.40}")
        turn = Turn(i, usage.prompt_tokens, cached or 0, label)
        out.append(turn)
        print(f"turn {i:2d}: prompt {turn.prompt_tokens:5d} tokens, cached "
              f"{turn.cached_tokens:5d} ({turn.cached_share:6.1%})  {label}", flush=True)
        if call is None:  # the model answered in text: the user asks it to go on
            messages += [{"role": "assistant", "content": msg.content or ""},
                         {"role": "user", "content": "Use a tool."}]
            continue
        messages.append({"role": "assistant", "content": msg.content, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]})
        try:
            args = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            args = {}
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": run_tool(call.function.name, args, root, result_chars)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default=None, help="default: the server's only model")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--tool-choice", default="required", choices=("required", "auto"))
    p.add_argument("--min-cached", type=float, default=0.9,
                   help="the least cached share of the prompt from turn 3 on")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    model = args.model or client.models.list().data[0].id
    turns = run_agent(client, model, args.turns, tool_choice=args.tool_choice)
    low = [t for t in turns if t.index >= 3 and t.cached_share < args.min_cached]
    for t in low:
        print(f"turn {t.index}: cached {t.cached_share:.1%} < {args.min_cached:.0%}",
              file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
