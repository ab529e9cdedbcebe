"""Two ``kvengine serve`` replicas behind the real vllm-router (issue 32, item 6): agent
sessions replayed through the router with ``round_robin``, ``cache_aware`` and ``kv_aware``,
the replicas sharing one ``kvstore serve`` daemon; the measured hit rate by tier (pool =
``hbm``, the daemon's ``dram``) against the replica simulator's (``kvstore hitrate --replicas
2 --routing ...``: the same library call, on the same scaled requests in the order sent, at
the same block size and capacities), TTFT p50/p90, what the shared store buys
``round_robin`` (replicas' pools alone vs with the store), and a replica killed with SIGKILL
mid-run (the router ejects it; its sessions go on with store hits on the other replica; every
answer is compared with the same request's in the run without the kill).

The slice: the first ``--requests-per-session`` turns of ``--sessions`` kv-cache-tester
sessions (bench_serve's slice), at ``--k`` tokens a trace block, each session a closed loop
(its next turn once the last is answered), all sessions in flight (``--concurrency``), as
``kvengine bench-serve`` sends them; the prediction replays them in the order they were sent.
The pool of each replica holds about one session's prompt, so where a turn lands matters.

The prediction is the instant replay (each request looked up and committed in the order
sent); beside it, the same replay with every request routed to the replica that served it
(its reply's ``kvengine.pid``): the pool model alone, without the routing model's guesses.
``--repredict FILE`` re-runs a ``--json`` file's runs against the instant, timed and taken
models (``ReplicaSimulator.feed_timed``), by policy and where served.

Each router policy is predicted by the simulator's routing of the same name: ``kv_aware``
by its model of the router's KV-event policy (the longest pool prefix of any length, ties to
the last replica, else the least loaded), ``cache_aware`` by its longest-prefix model with
the 30 % threshold (the router's own ``cache_aware`` guesses pool contents from the prompts
it routed, a prefix tree of text).

The model is ``small`` (random weights, made in a temporary directory). Needs vllm-router's
venv (``$KVENGINE_ROUTER_VENV``, else ``.venv-router``). Run alone (a few minutes)::

    .venv/bin/python -m bench.bench_router

``--pd`` runs instead co-located against prefill/decode disaggregation through the store, on
the same slice and shared daemon: two ``--kv-role both`` replicas behind ``round_robin``
against a ``--kv-role prefill`` and a ``--kv-role decode`` replica behind the router's vLLM PD
mode (``--vllm-pd-disaggregation``), ``--pd-max-tokens`` generated per turn; TTFT and time
per output token (the stream's time after its first chunk over the tokens after the first)
p50/p90, PD over co-located, rounds interleaved, and whether PD's answers are co-located's
(``bench/router_pd.py``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_serve import SLICE
from bench.router_table import fleet_prediction, print_table, repredict, row
from engine.model.make_model import make_model
from engine.server.bench_serve import TIERS, Replay, Target, report, served_order
from engine.server.scaled_requests import ScaledRequest, load_sessions
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.units import parse_size

REPO = Path(__file__).resolve().parents[1]
# (label, router policy, shared store, the simulator's routing)
CONFIGS = (("round_robin (pools alone)", "round_robin", False, "round_robin"),
           ("round_robin", "round_robin", True, "round_robin"),
           ("cache_aware", "cache_aware", True, "cache_aware"),
           ("kv_aware", "kv_aware", True, "kv_aware"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def router_python() -> Path:
    venv = Path(os.environ.get("KVENGINE_ROUTER_VENV") or REPO / ".venv-router")
    if not (venv / "bin" / "python").is_file():
        raise SystemExit(f"vllm-router's venv {venv} is absent (make setup creates it)")
    return venv / "bin" / "python"


def wait_health(url: str, timeout_s: float = 120.0) -> None:
    target = Target(url, None)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=5)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise SystemExit(f"{url} never answered /health")


class Fleet:
    """A daemon (or none), two replicas publishing KV events, the router in front."""

    def __init__(self, model: Path, a: argparse.Namespace, work: Path, policy: str,
                 store: bool, pd: bool = False) -> None:
        """``pd``: replica 0 is ``--kv-role prefill``, replica 1 ``decode``, behind the
        router's vLLM PD mode (which needs the shared store)."""
        self.procs: list[subprocess.Popen[str]] = []
        self.daemon = DaemonProcess(["--dram", a.dram]) if store else None
        try:
            self._start(model, a, work, policy, pd)
        except BaseException:
            self.close()
            raise

    def _start(self, model: Path, a: argparse.Namespace, work: Path, policy: str,
               pd: bool) -> None:
        kv = self.daemon.url if self.daemon is not None else "none"
        self.replica_urls: list[str] = []
        sources: list[str] = []
        for role in ("prefill", "decode") if pd else ("both", "both"):
            events = f"tcp://127.0.0.1:{free_port()}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "serve", "--listen", "127.0.0.1:0",
                 "--model", str(model), "--kv-store", kv, "--block-tokens", str(a.k),
                 "--pool-tokens", str(a.pool_tokens), "--no-cache-generated",
                 "--max-batched-tokens", str(a.max_batched_tokens),
                 "--kv-events-endpoint", events, "--kv-role", role,
                 *(["--deterministic"] if a.deterministic else [])], cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env={**os.environ, "KVENGINE_CACHE_DIR": str(work / "cache")})
            self.procs.append(proc)
            assert proc.stdout is not None
            while not (line := proc.stdout.readline()).startswith("listening on "):
                if not line:
                    raise SystemExit("kvengine serve did not start")
            url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
            self.replica_urls.append(url)
            sources += ["--kv-event-source", f"{url}={events}"]
        for url in self.replica_urls:
            wait_health(url)
        self.info = Target(self.replica_urls[0], None).get_json("/v1/models")["data"][0]
        port = free_port()
        extra = [*sources, "--kv-event-block-size", str(a.k), "--kv-event-model",
                 self.info["id"]] if policy == "kv_aware" else []
        workers = (["--vllm-pd-disaggregation", "--prefill", self.replica_urls[0],
                    "--decode", self.replica_urls[1]] if pd
                   else ["--worker-urls", *self.replica_urls])
        self.procs.append(subprocess.Popen(
            [str(router_python()), "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), *workers, "--policy", policy,
             "--health-check-interval-secs", "1", "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(free_port()), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
        self.url = f"http://127.0.0.1:{port}"
        wait_health(self.url)

    def requests_per_replica(self) -> list[int | None]:
        """Requests each replica finished (its /metrics), None for one no longer up."""
        out: list[int | None] = []
        for url, proc in zip(self.replica_urls, self.procs, strict=False):
            if proc.poll() is not None:
                out.append(None)
                continue
            target = Target(url, None)
            conn = http.client.HTTPConnection(target.host, target.port, timeout=30)
            try:
                conn.request("GET", "/metrics")
                text = conn.getresponse().read().decode()
            finally:
                conn.close()
            out.append(int(sum(float(line.split()[-1]) for line in text.splitlines()
                               if line.startswith("kvengine_requests_total{"))))
        return out

    def kill_replica(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(timeout=30)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.daemon is not None:
            self.daemon.stop()


def send_all(fleet: Fleet, sessions: list[list[ScaledRequest]], concurrency: int,
             max_tokens: int, kill_at: int | None, think_s: float = 0.0) -> Replay:
    """Closed loop per session (a session's next turn ``think_s`` after its last is
    answered), at most ``concurrency`` sessions in flight; with ``kill_at``, replica 1 is
    SIGKILLed once that many requests are answered."""
    target = Target(fleet.url, None)
    rep = Replay(sessions)
    lock = threading.Lock()
    todo = iter(range(len(sessions)))

    def worker() -> None:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=600)
        while (s := next_session()) is not None:
            for i, req in enumerate(sessions[s]):
                if i:
                    time.sleep(think_s)
                try:
                    out = target.complete(conn, fleet.info["id"], req.prompt, max_tokens)
                except (OSError, RuntimeError, http.client.HTTPException) as e:
                    conn.close()
                    conn = http.client.HTTPConnection(target.host, target.port, timeout=600)
                    with lock:
                        rep.errors.append(f"session {s} turn {i}: {e}")
                    continue
                out.session, out.index = s, i
                with lock:
                    rep.outcomes.append(out)
                    if len(rep.outcomes) == kill_at:
                        fleet.kill_replica(1)
        conn.close()

    def next_session() -> int | None:
        with lock:
            return next(todo, None)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep.wall_s = time.perf_counter() - start
    return rep


def one(model: Path, a: argparse.Namespace, work: Path, label: str, policy: str, store: bool,
        routing: str, kill_at: int | None = None) -> dict[str, Any]:
    fleet = Fleet(model, a, work, policy, store)
    try:
        meta = fleet.info["kvengine"]
        sessions = load_sessions(a.paths, a.k, meta["vocab_size"], 16, None,
                                 a.requests_per_session)
        rep = send_all(fleet, sessions, a.concurrency or len(sessions), a.max_tokens, kill_at,
                       a.think_s)
        served_by = fleet.requests_per_replica()
    finally:
        fleet.close()
    dram = parse_size(a.dram) // meta["block_bytes"] if store else 0
    order = served_order(rep)
    by_turn = {(o.session, o.index): o for o in rep.outcomes}
    t0 = min((o.sent_s for o in rep.outcomes), default=0.0)
    timed = [(s, i, by_turn[s, i].sent_s - t0, by_turn[s, i].sent_s + by_turn[s, i].total_s - t0)
             for s, i in order]
    pids = {proc.pid: n for n, proc in enumerate(fleet.procs[:2])}
    served = [pids.get(by_turn[s, i].server_pid or -1, -1) for s, i in order]
    pred = fleet_prediction(sessions, timed, a.k, meta["pool_tokens"], dram, routing,
                            "instant")
    at_served = fleet_prediction(sessions, timed, a.k, meta["pool_tokens"], dram, routing,
                                 "instant", served if min(served, default=0) >= 0 else None)
    out = report(rep, pred)
    out["label"], out["predicted"] = label, pred
    out["predicted_served"] = {key: v for key, v in at_served.items() if key != "per_request"}
    out["requests_per_replica"] = served_by
    out["served_replicas"] = served
    out["dram_blocks"] = dram
    out["order"] = order  # (session, turn) in the order sent: to re-run the prediction
    out["timed"] = timed  # and when each was sent and answered (s from the first send)
    out["per_request"] = [
        {"session": s, "turn": i, "prompt_tokens": by_turn[s, i].prompt_tokens,
         "measured": by_turn[s, i].hit_tokens, "predicted": p["hit_tokens"],
         "predicted_replica": p["replica"], "predicted_served": q["hit_tokens"]}
        for (s, i), p, q in zip(order, pred["per_request"], at_served["per_request"],
                                strict=True)]
    out["texts"] = {f"{o.session}/{o.index}": o.text for o in rep.outcomes}
    out["first_errors"] = rep.errors[:3]
    if kill_at is not None:
        after = [o for o in sorted(rep.outcomes, key=lambda o: o.sent_s)][kill_at:]
        p = sum(o.prompt_tokens for o in after)
        out["after_kill"] = {"requests": len(after),
                             "hit_rate_by_tier": {t: sum(o.hit_tokens[t] for o in after) / p
                                                  if p else 0.0 for t in TIERS}}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=os.environ.get("KVSTORE_TRACES_DIR",
                                                      str(REPO.parent / "shared" / "traces")))
    p.add_argument("--sessions", type=int, default=3,
                   help="sessions of bench_serve's slice (odd: round_robin then moves "
                        "sessions between the replicas rather than pinning each to one)")
    p.add_argument("--requests-per-session", type=int, default=4)
    p.add_argument("--k", type=int, default=4, help="tokens per trace block")
    p.add_argument("--pool-tokens", type=int, default=8192, help="per replica")
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=None,
                   help="sessions in flight (default: all of them)")
    p.add_argument("--think-s", type=float, default=0.0,
                   help="pause between a session's answer and its next turn (a replica "
                        "answers once its prompt's commit is over, so none is needed for the "
                        "next turn to find it in the store)")
    p.add_argument("--dram", default="1GiB", help="the shared daemon's DRAM tier")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds (fresh fleets, the configurations interleaved); the table "
                        "gives medians over them")
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS),
                   help="which runs (comma-separated labels; default: all)")
    p.add_argument("--no-kill", action="store_true", help="skip the SIGKILL run")
    p.add_argument("--preset", default="small", choices=("tiny", "small"))
    p.add_argument("--model", default=None, help="an existing checkpoint instead")
    p.add_argument("--pd", action="store_true",
                   help="instead: co-located (2 --kv-role both replicas, round_robin) vs "
                        "PD (a prefill and a decode replica behind the router's PD mode): "
                        "TTFT and time per output token")
    p.add_argument("--pd-max-tokens", type=int, default=16,
                   help="with --pd: tokens generated per turn (time per output token is "
                        "measured over all but the first)")
    p.add_argument("--deterministic", action="store_true",
                   help="replicas run --deterministic (logits independent of batch and "
                        "chunking: with --pd, whether PD's answers then match co-located's)")
    p.add_argument("--json", default=None, metavar="FILE", help="write every run to FILE")
    p.add_argument("--repredict", default=None, metavar="FILE",
                   help="instead: the runs a --json FILE recorded against each model of "
                        "the simulator (instant, timed, taken), from their recorded times")
    a = p.parse_args()
    if a.pd and a.pd_max_tokens < 2:
        raise SystemExit("--pd-max-tokens must be at least 2 (time per output token is "
                         "measured after the first)")
    traces = Path(a.traces) / "kv-cache-tester"
    if not traces.is_dir():
        raise SystemExit(f"no kv-cache-tester traces under {a.traces} (--traces or "
                         "$KVSTORE_TRACES_DIR)")
    a.paths = [str(traces / n) for n in SLICE[: a.sessions]]
    if a.repredict:
        sessions = load_sessions(a.paths, a.k, 256, 16, None, a.requests_per_session)
        repredict(a.repredict, sessions, a.k, a.pool_tokens, 1 << 40)
        return
    if a.pd:
        from bench.router_pd import pd_main  # it builds on this module's fleet

        pd_main(a)
        return
    configs = [c for c in CONFIGS if c[0] in a.configs.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in configs}
    kills: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = (Path(a.model) if a.model
                 else make_model("qwen3", a.preset, work / f"{a.preset}-qwen3").path)
        for _ in range(a.rounds):  # rounds interleave the configurations
            for label, policy, store, routing in configs:
                runs[label].append(one(model, a, work, label, policy, store, routing))
                print(row(runs[label][-1]), flush=True)
            if not a.no_kill and "round_robin" in runs:
                n = len(runs["round_robin"][-1]["texts"])
                kills.append(one(model, a, work, "round_robin (replica 1 SIGKILLed)",
                                 "round_robin", True, "round_robin", kill_at=n // 2))
                print(row(kills[-1]), flush=True)
    print_table(runs, kills, a)
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "kills": kills}, indent=1))


if __name__ == "__main__":
    main()
