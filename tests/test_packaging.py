"""What the wheel ships: the product packages, never the test scaffolding."""

from __future__ import annotations

import tomllib

from setuptools import find_packages

from tests.conftest import REPO


def _shipped() -> list[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = cfg["packages"]["find"]
    return find_packages(str(REPO), include=find["include"], exclude=find.get("exclude", ()))


def test_the_wheel_leaves_out_test_scaffolding() -> None:
    shipped = _shipped()
    assert (REPO / "storage_nodes" / "testing").is_dir()  # it exists, and is left out
    assert not [p for p in shipped if "testing" in p.split(".")]
    assert not [p for p in shipped if p.split(".")[0] in ("tests", "bench", "examples")]


def test_the_wheel_ships_every_product_package() -> None:
    shipped = set(_shipped())
    for pkg in ("kvstore", "kvstore.wire", "kvstore.wire.proto", "storage_nodes.ssd", "clients"):
        assert pkg in shipped
