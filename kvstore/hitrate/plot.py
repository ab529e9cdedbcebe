"""``--plot F.png``: token hit rate against capacity, one line per swept tier."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.hitrate.errors import HitrateError
from kvstore.hitrate.sweep import SweepPoint


def plot_sweep(points: Sequence[SweepPoint], path: str, *, title: str = "") -> None:
    """Write a PNG (matplotlib, Agg backend: no display needed)."""
    if not points:
        raise HitrateError("--plot needs --sweep: there is no capacity axis to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    in_tokens = points[0].capacity.bytes_ is None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        for tier in dict.fromkeys(p.tier for p in points):
            pts = [p for p in points if p.tier == tier]
            xs = [
                (p.capacity.tokens or 0) if in_tokens else (p.capacity.bytes_ or 0) / 2**30
                for p in pts
            ]
            ys = [100 * p.result.token_hit_rate for p in pts]
            ax.plot(xs, ys, marker="o", label=tier)
        if all(p.capacity.bytes_ or p.capacity.tokens for p in points):
            ax.set_xscale("log", base=2)
        ax.set_xlabel("tier capacity (tokens)" if in_tokens else "tier capacity (GiB)")
        ax.set_ylabel("token hit rate (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title="swept tier")
        if title:
            ax.set_title(title)
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as e:
            raise HitrateError(f"cannot write plot {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
