"""``FirstContact``: the state every client of the protocol keeps about its server's first
answer (the clients' behaviour with real servers: tests/clients/test_contact.py,
tests/storage_nodes/cluster/test_first_contact.py)."""

from __future__ import annotations

import grpc

from kvstore.errors import StoreUnavailable
from kvstore.wire.contact import FirstContact
from storage_nodes.cluster.errors import NodeUnavailable


def test_the_daemon_answering_ends_the_wait_for_good() -> None:
    contact = FirstContact("127.0.0.1:7420")
    assert contact.wait_for_ready() and contact.state == "waiting"
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        contact.saw(code)  # not an answer: still waiting
        assert contact.wait_for_ready()
    err = contact.gave_up(2.0, "Deadline\nExceeded")
    assert str(err).startswith("kv store 127.0.0.1:7420 is not reachable: nothing answered "
                               "there within 2.0 s (Deadline Exceeded)")
    assert not contact.wait_for_ready() and contact.state == "gave_up"
    contact.saw(grpc.StatusCode.NOT_FOUND)  # the daemon's own error is an answer
    assert contact.state == "answered"
    contact.gave_up(1.0, None)  # a later timeout does not undo it
    assert contact.state == "answered" and not contact.wait_for_ready()


def test_only_a_wait_that_used_its_whole_deadline_gives_up() -> None:
    contact = FirstContact("127.0.0.1:7420")
    # Refused while not waiting (no wait_for_ready): no verdict, still waiting.
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        assert contact.failed(code, None, waited=False, timeout_s=1) is None
    assert contact.state == "waiting"
    err = contact.failed(grpc.StatusCode.DEADLINE_EXCEEDED, "late", waited=True, timeout_s=3)
    assert isinstance(err, StoreUnavailable) and "within 3.0 s (late)" in str(err)
    assert contact.state == "gave_up"


def test_a_node_contact_words_its_line_and_raises_the_cluster_error() -> None:
    contact = FirstContact(
        "10.0.0.1:7431", server="storage node", hint="is it up?", error=NodeUnavailable
    )
    err = contact.gave_up(5.0, None)
    assert isinstance(err, NodeUnavailable)
    assert str(err) == (
        "storage node 10.0.0.1:7431 is not reachable: nothing answered there within 5.0 s "
        "(no answer); is it up?"
    )
