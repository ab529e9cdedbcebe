"""Creating a namespace's state: fresh at ``register``, or adopted from own files."""

from __future__ import annotations

from functools import partial
from typing import Any

from storage_nodes.sharedfs.catalog import Catalog, Loc
from storage_nodes.sharedfs.config import slot_bytes_for
from storage_nodes.sharedfs.errors import SharedFSError
from storage_nodes.sharedfs.manifest_log import ManifestLog
from storage_nodes.sharedfs.own import OwnBlock, OwnSpace
from storage_nodes.sharedfs.publish import apply_peer, forget_peer, roll
from storage_nodes.sharedfs.recovery import Recovered
from storage_nodes.sharedfs.segments import slots_per_segment
from storage_nodes.sharedfs.state import Context, NsState
from storage_nodes.sharedfs.tail import Tailer


def new_state(ctx: Context, tenant: str, fingerprint: bytes, fields: dict[str, Any],
              block_bytes: int) -> NsState:
    cfg = ctx.config
    sb = slot_bytes_for(block_bytes)
    d = ctx.layout.ensure_owner_dir(tenant, fingerprint, ctx.me, cfg.tenant_dir_mode)
    # Old generations stay long enough for every reader to follow the SEALED record.
    grace_s = 4 * cfg.visibility_bound_s + 10.0
    st = NsState(
        tenant=tenant, fingerprint=fingerprint, fields=fields, block_bytes=block_bytes,
        slot_bytes=sb, dir=d, catalog=Catalog(),
        own=OwnSpace(tenant, fingerprint, block_bytes, sb,
                     slots_per_segment(cfg.segment_bytes, sb)),
        log=ManifestLog(d, grace_s),
    )
    st.tailer = Tailer(ctx.layout, tenant, fingerprint, ctx.me,
                       partial(apply_peer, ctx, st), partial(forget_peer, ctx, st))
    return st


def start_log(ctx: Context, st: NsState) -> None:
    """Write the first (or, after recovery, the next) generation from the state."""
    with st.publish:
        if not roll(ctx, st):
            raise SharedFSError(f"cannot write a manifest in {st.dir}")


def adopt(ctx: Context, st: NsState, rec: Recovered) -> None:
    """Take over what this daemon's manifest says it holds (caller holds ``ctx.lock``)."""
    used: dict[int, set[int]] = {s: set() for s in rec.segments}
    for seg, slot, _, _ in rec.blocks.values():
        used[seg].add(slot)
    for seg in sorted(rec.segments):
        st.own.add_segment(seg, used[seg])
    for key, (seg, slot, access_s, born_s) in rec.blocks.items():
        st.own.adopt(key, OwnBlock(seg, slot, born_s, ctx.next_seq()))
        st.catalog.put(key, Loc(ctx.me, seg, slot, born_s), access_s)
