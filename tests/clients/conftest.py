from tests.kvstore.daemon.conftest import shared_daemon, spawn_daemon  # noqa: F401  (fixtures)
