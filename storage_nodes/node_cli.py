"""Entry point of ``kvstore node`` (registered in ``kvstore.cli.COMMANDS``)."""

from storage_nodes.node.cli import configure, run

__all__ = ["configure", "run"]
