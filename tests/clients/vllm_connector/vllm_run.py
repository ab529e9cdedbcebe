"""One vLLM process for the connector's tests: run in the vLLM venv, never imported by pytest.

``python vllm_run.py SPEC.json`` reads::

    {"model": DIR, "dtype": "float32", "connector": null | {extra config},
     "max_tokens": 8, "max_model_len": 8192,
     "wait_for_hit": {"tokens": N, "timeout_s": 120} | null,
     "phases": [{"prompts": [[ids…], …], "signal": null | ["KILL"|"STOP", pid]}, …]}

runs every phase's prompts with greedy sampling (sending ``signal`` to ``pid`` first) and
prints one line ``RESULT {"phases": [[{"tokens": […], "num_cached_tokens": n}, …], …],
"stats": [{counter: n}, …], "recovered": [n, …]}``: per phase, what the connector's worker
counted (``KVStoreConnector.totals``, deltas) and how many times vLLM recovered from a
failed load (its scheduler's warning), since vLLM's ``num_cached_tokens`` keeps counting
tokens a failed load then made it recompute.
``wait_for_hit`` polls the store until it holds the first prompt's first N tokens (a peer
process's commits landed). vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
is set by the caller), so the connector's store link closes with it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any

CONNECTOR_MODULE = "clients.vllm_connector.connector"


def transfer_config(extra: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "KVStoreConnector", "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_connector_extra_config": extra}


def wait_for_hit(spec: dict[str, Any], prompt: list[int], tokens: int, timeout_s: float) -> None:
    import torch

    from clients.vllm_connector.config import ConnectorConfig
    from clients.vllm_connector.namespace import base_namespace, checkpoint_model_spec
    from engine.connector.stores import StoreOptions, open_store_link
    from kvstore.keys import chain_keys

    cfg = ConnectorConfig.from_extra(spec["connector"])
    model = checkpoint_model_spec(spec["model"], getattr(torch, spec["dtype"]))
    link = open_store_link(cfg.store, lambda t: base_namespace(model, cfg.block_tokens, t),
                           StoreOptions(call_timeout_s=cfg.call_timeout_s))
    keys = chain_keys(link.ns, prompt[:tokens])
    deadline = time.monotonic() + timeout_s
    try:
        while link.lookup(keys, cfg.call_timeout_s).hit_blocks < len(keys):
            if time.monotonic() > deadline:
                raise SystemExit(f"the store never held {tokens} tokens of the prompt")
            time.sleep(0.5)
    finally:
        link.close()


class CountRecoveries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Recovered from KV load failure" in record.getMessage():
            self.count += 1


def connector_totals() -> dict[str, int]:
    """The worker connector's counters, once its commits so far have landed."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return {}
    connector = get_kv_transfer_group()
    drain, totals = getattr(connector, "drain", None), getattr(connector, "totals", None)
    if callable(drain):
        drain(120.0)
    return dict(totals()) if callable(totals) else {}


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    from vllm import LLM, SamplingParams

    kw: dict[str, Any] = {}
    if spec.get("connector") is not None:
        from vllm.config import KVTransferConfig

        kw["kv_transfer_config"] = KVTransferConfig(**transfer_config(spec["connector"]))
    llm = LLM(model=spec["model"], dtype=spec["dtype"], enforce_eager=True,
              enable_prefix_caching=False, max_model_len=spec.get("max_model_len", 8192),
              max_num_batched_tokens=spec.get("max_model_len", 8192), seed=0, **kw)
    params = SamplingParams(max_tokens=spec.get("max_tokens", 8), temperature=0.0)
    recoveries = CountRecoveries()
    logging.getLogger("vllm").addHandler(recoveries)
    results, stats, recovered = [], [], []
    for i, phase in enumerate(spec["phases"]):
        if phase.get("signal"):
            name, pid = phase["signal"]
            os.kill(int(pid), getattr(signal, f"SIG{name}"))
        if i == 0 and spec.get("wait_for_hit"):
            w = spec["wait_for_hit"]
            wait_for_hit(spec, phase["prompts"][0], w["tokens"], w.get("timeout_s", 120))
        before, seen = connector_totals(), recoveries.count
        outs = llm.generate([{"prompt_token_ids": p} for p in phase["prompts"]], params,
                            use_tqdm=False)
        after = connector_totals()
        stats.append({k: v - before.get(k, 0) for k, v in after.items()})
        recovered.append(recoveries.count - seen)
        results.append([{"tokens": list(o.outputs[0].token_ids),
                         "num_cached_tokens": int(o.num_cached_tokens or 0)} for o in outs])
    print("RESULT " + json.dumps({"phases": results, "stats": stats, "recovered": recovered}),
          flush=True)


if __name__ == "__main__":
    main()
