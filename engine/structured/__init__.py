"""Structured outputs: a grammar the answer must match (JSON schema, regex, Lark or GBNF
grammar, the tools' call format), enforced by masking the logits each step with
llguidance (chosen by measured mask cost: bench/RESULTS.md, "grammar masks")."""
