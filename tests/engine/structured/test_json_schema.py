"""Structured outputs on the tiny random-weight model, whose own choices are noise: every
answer parses and validates against its schema because the grammar's mask forces it
(hypothesis over schemas of objects, arrays, enums and nested required fields)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from engine.structured.backend import GrammarBackend
from engine.structured.spec import ConstraintSpec, json_schema

NAMES = st.sampled_from(["id", "name", "tags", "kind", "size", "ok", "items", "meta"])
LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 5)),
    st.builds(lambda a, d: {"type": "integer", "minimum": a, "maximum": a + d},
              st.integers(-50, 50), st.integers(0, 500)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda v: {"enum": v}, st.lists(st.one_of(
        st.sampled_from(["red", "green", "blue", "a b"]), st.integers(-3, 3)),
        min_size=1, max_size=4, unique=True)),
)


def _object(props: dict[str, dict], required: list[bool]) -> dict:
    names = list(props)
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": [n for n, r in zip(names, required, strict=False) if r]}


def _compound(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    arrays = st.builds(lambda item, hi, lo: {"type": "array", "items": item,
                                              "minItems": min(lo, hi), "maxItems": hi},
                       children, st.integers(0, 2), st.integers(0, 1))
    objects = st.builds(_object, st.dictionaries(NAMES, children, max_size=3),
                        st.lists(st.booleans(), min_size=3, max_size=3))
    return st.one_of(arrays, objects)


SCHEMAS = st.builds(_object, st.dictionaries(
    NAMES, st.recursive(LEAVES, _compound, max_leaves=6), min_size=1, max_size=3),
    st.lists(st.booleans(), min_size=3, max_size=3))


@pytest.fixture(scope="module")
def engine(tiny: LoadedModel) -> Iterator[LLMEngine]:
    spec = tiny.spec
    config = EngineConfig(pool_tokens=8192, block_tokens=16, attention_backend="torch")
    eng = LLMEngine(tiny.model, config, NullStoreLink(engine_namespace(spec, 16)))
    eng.grammar = GrammarBackend(tiny.tokenizer.backend.to_str(), spec.vocab_size,
                                 spec.eos_token_ids[0])
    yield eng
    eng.close()


def answer(engine: LLMEngine, tiny: LoadedModel, spec: ConstraintSpec, seed: int,
           max_new_tokens: int = 1500, must_end: bool = True) -> str:
    prompt = tiny.tokenizer.encode("Answer in JSON:", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed,
                            constraint=spec)
    (seq,) = engine.generate([prompt], params)
    assert seq.finish_reason == "stop" or not must_end, "the grammar did not end the answer"
    return tiny.tokenizer.decode(seq.output_ids, skip_special_tokens=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_json_schema_answers_always_parse_and_validate(engine: LLMEngine, tiny: LoadedModel,
                                                       schema: dict, seed: int) -> None:
    text = answer(engine, tiny, json_schema(schema), seed)
    jsonschema.validate(json.loads(text), schema)
    # Written as json.dumps writes it: what templates' tojson re-renders token for token.
    assert text == json.dumps(json.loads(text), ensure_ascii=False)


def test_json_object_regex_and_grammars(engine: LLMEngine, tiny: LoadedModel) -> None:
    # Any object: a random model may write one forever; what it wrote is an object's start.
    obj = answer(engine, tiny, json_schema({"type": "object"}), 1, 40, must_end=False)
    assert obj.startswith("{")
    r = answer(engine, tiny, ConstraintSpec("regex", r"[a-c]{3}-\d{2}"), 2)
    assert len(r) == 6 and r[3] == "-" and set(r[:3]) <= set("abc") and r[4:].isdigit()
    lark = answer(engine, tiny, ConstraintSpec("lark", 'start: "yes" | "no"'), 3)
    assert lark in ("yes", "no")
    gbnf = answer(engine, tiny, ConstraintSpec("gbnf", 'root ::= "x" [0-9] [0-9]?'), 4)
    assert gbnf[0] == "x" and gbnf[1:].isdigit() and len(gbnf) <= 3


def test_a_bad_grammar_is_the_callers_error(engine: LLMEngine) -> None:
    from engine.errors import EngineInputError

    assert engine.grammar is not None
    with pytest.raises(EngineInputError):
        engine.grammar.check(json_schema({"type": "objectz"}))
    with pytest.raises(EngineInputError):
        engine.grammar.check(ConstraintSpec("regex", "(unclosed"))
