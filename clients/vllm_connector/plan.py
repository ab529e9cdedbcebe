"""What the connector's scheduler side decides, and what it tells the worker side.

Plain data and arithmetic, no vLLM import (the project's tests run it without vLLM):

- ``usable_hit_tokens``: how much of a store hit vLLM may take. It is cut to vLLM's block
  size (vLLM counts computed tokens in whole blocks) and leaves the prompt's last token to
  compute (vLLM needs one token's logits to sample from).
- ``LoadJob``: store blocks ``first_block …`` of one request into its vLLM blocks, tokens
  ``[start, end)``.
- ``SaveJob``: full store blocks of tokens vLLM computed in this step that the store lacks,
  copied out of vLLM's blocks after the step's forward (``wait_for_save``), so vLLM never
  holds a block for the store: when a request finishes, all its full blocks are out.
- ``ConnectorMeta``: one step's jobs (vLLM's ``KVConnectorMetadata`` subclass wraps it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.keys import Key, Namespace


def usable_hit_tokens(hit_blocks: int, block_tokens: int, prompt_tokens: int,
                      vllm_block_size: int) -> int:
    """Tokens of a store hit of ``hit_blocks`` vLLM may treat as computed."""
    tokens = min(hit_blocks * block_tokens, prompt_tokens - 1)
    return max(0, tokens // vllm_block_size * vllm_block_size)


@dataclass(frozen=True, slots=True)
class LoadJob:
    req_id: str
    ns: Namespace
    keys: tuple[Key, ...]  # chain keys of store blocks first_block, first_block + 1, …
    first_block: int
    start: int  # first token to place (vLLM already has the ones before)
    end: int  # one past the last
    block_ids: tuple[int, ...]  # the request's vLLM blocks, from token 0
    timeout_s: float  # the get's deadline (a PD hand-off's: its transfer budget, handoff)

    def failed_block_ids(self, loaded_end: int, vllm_block_size: int) -> set[int]:
        """vLLM blocks holding tokens ``[loaded_end, end)``: the part that did not load."""
        if loaded_end >= self.end:
            return set()
        first = loaded_end // vllm_block_size
        last = (self.end - 1) // vllm_block_size
        return set(self.block_ids[first : last + 1])


@dataclass(frozen=True, slots=True)
class SaveJob:
    req_id: str
    ns: Namespace
    keys: tuple[Key, ...]  # the chain from block 0 through the last block to save
    first_block: int  # blocks [first_block, len(keys)) are copied out and stored
    block_ids: tuple[int, ...]
    timeout_s: float  # the commit's deadline (a PD prefill's: its transfer budget, handoff)


@dataclass
class ConnectorMeta:
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)


@dataclass
class RequestState:
    """The scheduler side's memory of one request, from its lookup to its end."""

    ns: Namespace
    keys: list[Key]  # chain keys of the prompt's full blocks
    stored_blocks: int  # blocks the store holds or was given (a save starts after them)
    hit_blocks: int = 0  # what the lookup found
    load: tuple[int, int] | None = None  # tokens [start, end) to load, once allocated
    # Set once its load is handed to the worker. A request that comes back to the lookup
    # after that (vLLM recomputes from a failed block, or preempted it) is not offered the
    # store again: a store that just failed it would fail it again.
    load_issued: bool = False

    def save_range(self, computed_end: int, block_tokens: int) -> tuple[int, int] | None:
        """Full blocks of the tokens ``[0, computed_end)`` not stored yet, or ``None``."""
        full = computed_end // block_tokens
        if full <= self.stored_blocks:
            return None
        return self.stored_blocks, full
