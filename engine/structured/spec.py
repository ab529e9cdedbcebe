"""What a request constrains its output to, as a hashable value for ``SamplingParams``,
and the grammar text llguidance compiles from it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["json_schema", "regex", "lark", "gbnf"]

# JSON is written as the templates' ``tojson`` and Python's ``json.dumps`` write it (", "
# and ": ", no newlines): what the model writes then re-tokenizes as the history re-sent,
# and a model cannot pad an answer with whitespace forever.
JSON_SEPARATORS = {"whitespace_flexible": False, "item_separator": ", ",
                   "key_separator": ": "}
TOOL_OPEN, TOOL_CLOSE = "<tool_call>\n", "\n</tool_call>"


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    kind: Kind
    source: str  # a JSON schema's text, a regex, a grammar

    def grammar(self) -> str:
        """llguidance's grammar text (a Lark grammar or its JSON wrapper)."""
        import llguidance

        if self.kind == "json_schema":
            schema = json.loads(self.source)
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": JSON_SEPARATORS}
            return str(llguidance.grammar_from("json_schema", json.dumps(schema)))
        if self.kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            return str(llguidance.grammar_from("lark", gbnf_to_lark(self.source)))
        return str(llguidance.grammar_from(self.kind, self.source))


def json_schema(schema: Any) -> ConstraintSpec:
    return ConstraintSpec("json_schema", json.dumps(schema, sort_keys=False))


def tool_calls(tools: list[dict[str, Any]], name: str | None, parallel: bool
               ) -> ConstraintSpec:
    """Hermes tool calls (``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``)
    of ``name``, or of any of ``tools``: one, or with ``parallel`` one or more."""
    options = [
        {"type": "object", "properties": {"name": {"const": t["name"]},
                                          "arguments": t.get("parameters") or {"type": "object"}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools if name is None or t["name"] == name]
    schema = {"anyOf": options, "x-guidance": JSON_SEPARATORS} if len(options) > 1 else \
        {**options[0], "x-guidance": JSON_SEPARATORS}
    call = f"{json.dumps(TOOL_OPEN)} %json {json.dumps(schema)} {json.dumps(TOOL_CLOSE)}"
    more = f' ("\\n" {call})*' if parallel else ""
    return ConstraintSpec("lark", f"start: {call}{more}\n")
