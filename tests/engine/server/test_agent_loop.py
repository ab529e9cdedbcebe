"""The scripted agent of ``examples/agent_loop.py``: 10 turns of tool calls against
``kvengine serve`` with the embedded store behind it; from turn 3 on at least 90 % of each
prompt is served from cache. On the tiny random model (the grammar writes the calls), and
on SmolLM2-135M-Instruct (fetched by ``kvengine fetch-model`` once)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.engine.model.real_models import real_model
from tests.engine.server.conftest import client
from tests.engine.server.serve_process import REPO, ServeProcess

TEMPLATE = REPO / "examples" / "tool_chat_template_hermes.jinja"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples" /
                                                  "agent_loop.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["agent_loop"] = mod  # its dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def _serve(model: Path, env: dict[str, str], store: Path, *extra: str) -> ServeProcess:
    return ServeProcess(["--model", str(model), "--kv-store", f"embedded:{store}",
                         "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE),
                         "--pool-tokens", "16384", *extra], env)


def _check(turns: list, n: int) -> None:
    assert len(turns) == n
    assert all(t.call.startswith(("read_file(", "list_dir(")) for t in turns)
    low = [(t.index, round(t.cached_share, 3)) for t in turns[2:] if t.cached_share < 0.9]
    assert not low, f"turns under 90 % cached: {low}"


@pytest.fixture
def agent() -> ModuleType:
    return _example()


def test_ten_turns_on_the_tiny_model(tiny_dir: Path, env: dict[str, str], tmp_path: Path,
                                     agent: ModuleType) -> None:
    with _serve(tiny_dir, env, tmp_path / "store") as server:
        c = client(server)
        turns = agent.run_agent(c, c.models.list().data[0].id, 10, system_chars=4000,
                                result_chars=200)
    _check(turns, 10)


@pytest.fixture
def smollm2() -> Path:
    return real_model("smollm2-135m-instruct")  # fetched once; run, never skipped


def test_ten_turns_on_smollm2(smollm2: Path, env: dict[str, str], tmp_path: Path,
                              agent: ModuleType) -> None:
    # float32: bfloat16 matmuls are slow on CPUs (the test runs wherever the suite runs).
    with _serve(smollm2, env, tmp_path / "store", "--dtype", "float32") as server:
        # The first turn prefills ~4.5 K tokens: minutes on a busy CPU.
        c = client(server).with_options(timeout=900)
        model = c.models.list().data[0].id
        turns = agent.run_agent(c, model, 10)
        # The client's streamed tool flow on the same server: deltas accumulate to a call.
        stream = c.chat.completions.create(
            model=model, tools=agent.TOOLS, tool_choice="required", parallel_tool_calls=False,
            stream=True, max_tokens=160, messages=[
                {"role": "user", "content": "Read the README of this repository."}])
        name, arguments, finish = "", "", None
        for chunk in stream:
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name += (d.function.name or "") if d.function else ""
                arguments += (d.function.arguments or "") if d.function else ""
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    _check(turns, 10)
    assert finish == "tool_calls" and name in ("read_file", "list_dir")
    assert "path" in json.loads(arguments)
