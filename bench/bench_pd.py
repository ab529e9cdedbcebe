"""What the prefill/decode hand-off through the store costs (issue 32, item 3): three
``kvengine serve`` replicas of the ``small`` model on one ``kvstore serve`` daemon — a
co-located one (``--kv-role both``), a ``prefill`` and a ``decode`` one — and fresh prompts
(random token ids, nothing cached anywhere) sent the way vllm-router's PD mode sends them:

- ``co-located``: one request, ``max_tokens`` 1 (its latency is its TTFT);
- ``plain prefill``: the same request on the prefill replica without hand-off params;
- ``prefill``: the router's first request (``do_remote_decode``): the same compute, plus
  the awaited commit and the lookup of what the store serves;
- ``decode``: the router's second request (``do_remote_prefill`` with the prefill's
  params), ``max_tokens`` 1: the wait for the blocks, their load, the last block computed;
- ``PD TTFT`` = prefill + decode, against co-located.

Rounds interleave the configurations; figures are medians over every prompt of every round,
ratios against the co-located request of the same run. Run alone::

    .venv/bin/python -m bench.bench_pd
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.bench_serve import spawn
from bench.harness import machine
from engine.model.make_model import make_model
from kvstore.testing.daemon_process import DaemonProcess

MODEL = "small"


def post(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    took = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"{url}: {r.status_code} {r.text[:300]}")
    return took, r.json()


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=3, help="fresh prompts per round")
    p.add_argument("--prompt-tokens", type=int, default=2000)
    a = p.parse_args()
    rng = random.Random(0)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("co-located", "plain prefill", "prefill", "decode", "pd")}
    computed: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = make_model("qwen3", MODEL, work / "model").path
        env = {"KVENGINE_CACHE_DIR": str(work / "cache")}
        with DaemonProcess(["--dram", "1GiB"]) as daemon:
            common = ["--model", str(model), "--kv-store", daemon.url, "--pool-tokens", "16384"]
            procs: list[subprocess.Popen[str]] = []
            try:
                urls = {}
                for role in ("both", "prefill", "decode"):
                    proc, urls[role] = spawn([*common, "--kv-role", role], env)
                    procs.append(proc)
                name = httpx.get(urls["both"] + "/v1/models").json()["data"][0]["id"]

                def fresh() -> list[int]:
                    return [rng.randrange(10, 2000) for _ in range(a.prompt_tokens)]

                for _ in range(a.rounds):
                    for _ in range(a.prompts):
                        base = {"model": name, "max_tokens": 1, "temperature": 0}
                        times["co-located"].append(
                            post(urls["both"], {**base, "prompt": fresh()})[0])
                        times["plain prefill"].append(
                            post(urls["prefill"], {**base, "prompt": fresh()})[0])
                        prompt = fresh()
                        t_pre, body = post(urls["prefill"], {
                            **base, "prompt": prompt,
                            "kv_transfer_params": {"do_remote_decode": True}})
                        before = metric(urls["decode"],
                                        'kvengine_prompt_tokens_total{source="computed"}')
                        t_dec, _ = post(urls["decode"], {
                            **base, "prompt": prompt,
                            "kv_transfer_params": body["kv_transfer_params"]})
                        computed.append(metric(
                            urls["decode"], 'kvengine_prompt_tokens_total{source="computed"}')
                            - before)
                        times["prefill"].append(t_pre)
                        times["decode"].append(t_dec)
                        times["pd"].append(t_pre + t_dec)
                waits = {side: (metric(urls[side], "kvengine_kv_transfer_wait_seconds_sum{"
                                       f'side="{side}"' "}"),
                                metric(urls[side], "kvengine_kv_transfer_wait_seconds_count{"
                                       f'side="{side}"' "}"))
                         for side in ("prefill", "decode")}
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(timeout=60)
    med = {k: statistics.median(v) for k, v in times.items()}
    co = med["co-located"]
    print(f"{machine()}; load average {os.getloadavg()[0]:.1f}; model {MODEL}; "
          f"{a.prompt_tokens}-token fresh prompts, {a.rounds} rounds x {a.prompts}")
    for k, v in med.items():
        print(f"  {k:14s} median {v * 1000:8.1f} ms   / co-located {v / co:5.2f}x")
    for side, (total, count) in waits.items():
        print(f"  {side} hand-off wait (server side): mean {total / max(count, 1) * 1000:.1f} ms"
              f" over {int(count)}")
    print(f"  decode replica computed {statistics.median(computed):.0f} prompt tokens "
          f"(median) of {a.prompt_tokens}")


if __name__ == "__main__":
    main()
