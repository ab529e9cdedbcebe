"""The human-readable report of a load run: measured next to predicted."""

from __future__ import annotations

from typing import Any


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def to_text(body: dict[str, Any]) -> str:
    p = body["predicted"]
    lines = [
        f"{'':26}{'measured':>16}{'predicted':>16}",
        f"{'requests':<26}{body['requests']:>16,}{p['requests']:>16,}",
        f"{'input tokens':<26}{body['input_tokens']:>16,}{p['input_tokens']:>16,}",
        f"{'hit tokens':<26}{body['hit_tokens']:>16,}{p['hit_tokens']:>16,}",
        f"{'token hit rate':<26}{_pct(body['token_hit_rate']):>16}{_pct(p['token_hit_rate']):>16}",
        f"{'mean request hit ratio':<26}{_pct(body['mean_request_hit_ratio']):>16}"
        f"{_pct(p['mean_request_hit_ratio']):>16}",
    ]
    for name, t in body["tiers"].items():
        if t["present"]:
            lines.append(
                f"{name + ' hit tokens':<26}{t['hit_tokens']:>16,}"
                f"{p['tiers'][name]['hit_tokens']:>16,}   ({t['capacity_blocks']} blocks)"
            )
    lines.append(f"{'gap (points)':<26}{body['gap_points']:>16.3f}")
    tp = body["throughput"]
    lines += [
        "",
        f"wall {tp['wall_s']:.1f} s   {tp['requests_per_s']:,.0f} req/s   "
        f"read {tp['read_mb_per_s']:,.1f} MB/s   write {tp['write_mb_per_s']:,.1f} MB/s",
        f"{'call':<8}{'count':>10}{'p50 ms':>10}{'p99 ms':>10}",
    ]
    for call, s in body["latency"].items():
        lines.append(f"{call:<8}{s['count']:>10,}{_ms(s['p50_ms']):>10}{_ms(s['p99_ms']):>10}")
    errors = body["errors"]
    lines += [
        "",
        f"wrong bytes {body['wrong_bytes']}   errors "
        + (", ".join(f"{k} {v}" for k, v in errors.items()) if errors else "none"),
    ]
    if "audit" in body:
        a = body["audit"]
        lines.append(
            f"durable audit: {a['checked']} checked, {a['missing']} missing, "
            f"{a['wrong_bytes']} wrong bytes"
        )
    return "\n".join(lines)
