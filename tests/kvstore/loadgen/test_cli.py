"""``kvstore loadgen`` flags: bad input is one line on stderr and exit 2, nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.cli import main


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--store", "http://x:1"], "must start with grpc://"),
        (["--store", "grpc://nohost"], "HOST:PORT"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--concurrency", "two"], "--concurrency: expected an integer"),
        (["--speed", "-1"], "--speed must be positive"),
        (["--speed", "fast"], "--speed: expected a number"),
        (["--bytes-per-token", "0"], "--bytes-per-token must be >= 1"),
        (["--durability", "disk"], "--durability must be dram or ssd"),
        (["--streams", "random"], "--streams: unknown mode"),
        (["--requests", "0"], "--requests must be >= 1"),
        (["--audit-durable"], "--audit-durable needs --durability ssd"),
        (["--timeout", "soon"], "invalid duration"),
        (["--ssd-dir", "/tmp/x"], "--store embedded only"),
        # Issue 14 (item 12): absurd sizes grew to ~23 GB, or ended in a traceback.
        (["--bytes-per-token", "1000000000"], "makes blocks over 64 MiB"),
        (
            ["--bytes-per-token", "1048577", "--store", "embedded", "--dram", "1MiB"],
            "at most 64 MiB a block",
        ),
        (["--concurrency", "100000"], "--concurrency must be in [1, 1024]"),
        # Issue 36 (item 1): numpy's _ArrayMemoryError traceback, exit 1.
        (["--store", "embedded", "--dram", "1PiB"], "--dram 1024.0 TiB is more than this"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    conv_trace: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    try:
        code = main(["loadgen", str(conv_trace), *flags])
    except SystemExit as e:  # refused by argparse, at parse time (--timeout)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_and_malformed_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadgen", str(tmp_path / "nope.jsonl"), "--store", "embedded"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 10, "hash_ids": [1]}\n{"timestamp": 2}\n')
    assert main(["loadgen", str(bad), "--store", "embedded", "--dram", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2:" in err and len(err.strip().splitlines()) == 1


def test_unreachable_daemon_is_errors_not_a_crash(
    conv_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(
        [
            "loadgen",
            "--json",
            str(conv_trace),
            "--store",
            f"grpc://127.0.0.1:{port}",
            "--timeout",
            "0.2s",
            "--requests",
            "5",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot reach the store at grpc://127.0.0.1:{port}" in err
    assert len(err.splitlines()) == 1


def test_embedded_text_and_json_output(
    conv_trace: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert (
        main(
            [
                "loadgen",
                str(conv_trace),
                "--store",
                "embedded",
                "--dram",
                "1MiB",
                "--bytes-per-token",
                "4",
                "--verify",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "token hit rate" in text and "wrong bytes 0" in text and "p99 ms" in text
    cfg = tmp_path / "lg.toml"
    cfg.write_text('store = "embedded"\ndram = "1MiB"\nbytes_per_token = "4"\nconcurrency = "2"\n')
    assert main(["loadgen", "--json", "--config", str(cfg), str(conv_trace)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["load"]["concurrency"] == 2 and body["load"]["block_bytes"] == 2048
    for key in ("predicted", "wrong_bytes", "errors", "throughput", "latency"):
        assert key in body
    assert set(body["latency"]) == {"lookup", "get", "commit"}
    assert {"requests_per_s", "mb_per_s"} <= set(body["throughput"])
