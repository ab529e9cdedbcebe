"""``kvstore hitrate`` through the real CLI: outputs, sweeps, plots and every bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hitrate_files import (
    access_log_table,
    kvct_request,
    write_access_log,
    write_kvct,
    write_mooncake_jsonl,
    write_mooncake_parquet,
)

from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA
from kvstore.cli import main
from kvstore.hitrate.__main__ import main as standalone_main

TRACE = [(0, 1000, [1, 2]), (1000, 1100, [1, 2, 3]), (2000, 600, [1, 9]), (3000, 1024, [1, 2])]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["hitrate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def fail(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI expecting exit status 2 and a single stderr line; return that line."""
    rc = main(["hitrate", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvstore hitrate: error: ")
    return lines[0]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_mooncake_jsonl(tmp_path / "t.jsonl", TRACE)


def test_json_has_every_promised_field(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    out = run_json(
        capsys, str(trace), "--hbm", "512tok", "--dram", "0", "--ssd", "inf", "--replay-keep", "100"
    )
    assert out["requests"] == 4
    assert out["input_tokens"] == 1000 + 1100 + 600 + 1024
    assert out["hit_tokens"] == 1024 + 512 + 1024
    assert out["token_hit_rate"] == pytest.approx(2560 / 3724)
    assert out["mean_request_hit_ratio"] == pytest.approx((0 + 1024 / 1100 + 512 / 600 + 1) / 4)
    assert set(out["tiers"]) == {"hbm", "dram", "ssd"}
    for body in out["tiers"].values():
        assert {"hit_tokens", "hit_blocks", "capacity_blocks"} <= set(body)
    assert out["tiers"]["hbm"]["capacity_blocks"] == 1
    assert out["tiers"]["ssd"]["capacity_blocks"] is None  # unbounded
    assert out["tiers"]["dram"]["present"] is False
    tiers_sum = sum(t["hit_tokens"] for t in out["tiers"].values())
    assert tiers_sum == out["hit_tokens"]
    assert out["computed_tokens"] == 3724 - 2560
    assert out["computed_tokens_with_replay"] == 3724 - 2560 + 3 * 100
    cost = out["cost"]
    assert cost["cached_input_usd"] == pytest.approx(2560 * 0.003 / 1e6)
    assert cost["uncached_input_usd"] == pytest.approx(1164 * 0.15 / 1e6)
    assert cost["blended_usd_per_m_input_tokens"] == pytest.approx(
        (2560 * 0.003 + 1164 * 0.15) / 3724
    )
    assert cost["prefill_gpu_hours_saved"] == pytest.approx(2560 / 9200 / 3600)


def test_prices_and_throughput_flags(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    out = run_json(
        capsys,
        str(trace),
        "--price-cached",
        "1",
        "--price-uncached",
        "10",
        "--prefill-tokens-per-gpu-s",
        "1000",
    )
    assert out["cost"]["total_input_usd"] == pytest.approx((2560 * 1 + 1164 * 10) / 1e6)
    assert out["cost"]["prefill_gpu_hours_saved"] == pytest.approx(2560 / 1000 / 3600)


def test_text_table(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    assert main(["hitrate", str(trace), "--dram", "1GiB"]) == 0
    text = capsys.readouterr().out
    assert "token hit rate" in text and f"{100 * 2560 / 3724:.2f} %" in text
    assert "dram" in text and "1.0 GiB" in text and "blended" in text


def test_standalone_entry_point_matches(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    assert standalone_main(["--json", str(trace)]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a == run_json(capsys, str(trace))
    assert standalone_main([str(tmp_missing := str(trace) + ".nope")]) == 2
    assert tmp_missing in capsys.readouterr().err


def test_config_file_supplies_defaults(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text('ssd = "512tok"\nretention = "inf"\n')
    out = run_json(capsys, str(trace), "--config", str(cfg))
    assert out["tiers"]["ssd"]["capacity_blocks"] == 1
    assert out["retention_s"] is None


def test_sweep_and_plot(capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "s.png"
    out = run_json(
        capsys,
        str(trace),
        "--ssd",
        "0",
        "--sweep",
        "dram=512tok..2048tok:x2",
        "--sweep",
        "ssd=512tok,1024tok",
        "--plot",
        str(png),
    )
    assert out["sweep_method"] == "stack"
    pts = [(p["tier"], p["capacity_tokens"], p["hit_tokens"]) for p in out["sweep"]]
    assert [p[:2] for p in pts] == [
        ("dram", 512),
        ("dram", 1024),
        ("dram", 2048),
        ("ssd", 512),
        ("ssd", 1024),
    ]
    rates = [p[2] for p in pts[:3]]
    assert rates == sorted(rates)
    assert png.read_bytes().startswith(b"\x89PNG")
    # Policies other than LRU are not stack algorithms: one replay per point.
    out2 = run_json(
        capsys, str(trace), "--ssd", "0", "--policy", "s3fifo", "--sweep", "dram=4096tok"
    )
    assert out2["sweep_method"] == "replay"
    assert out2["sweep"][0]["hit_tokens"] == out2["sweep"][0]["tiers"]["dram"]["hit_tokens"]


def test_sweep_text(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    assert main(["hitrate", str(trace), "--sweep", "hbm=1MiB..4MiB:+1MiB"]) == 0
    text = capsys.readouterr().out
    assert "sweep (stack)" in text
    assert text.count("\nhbm ") >= 4


def test_every_format_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pq_path = write_mooncake_parquet(tmp_path / "m.parquet", TRACE)
    assert run_json(capsys, str(pq_path))["hit_tokens"] == 2560
    kv = write_kvct(
        tmp_path / "k.json", [kvct_request(0, 130, [1, 2]), kvct_request(1, 130, [1, 2])]
    )
    assert run_json(capsys, str(kv))["hit_tokens"] == 128
    log = write_access_log(tmp_path / "a.parquet", [(0, 16, 32, [1, 2]), (1, 16, 32, [1, 2])])
    assert run_json(capsys, str(log), "--format", "access-log")["hit_tokens"] == 32


# -- bad input: exit 2, one line naming the file and where ------------------------------


def test_missing_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "no such file" in fail(capsys, str(tmp_path / "nope.jsonl"))
    assert "no file matches" in fail(capsys, str(tmp_path / "*.jsonl"))
    (tmp_path / "empty").mkdir()
    assert "no trace files" in fail(capsys, str(tmp_path / "empty"))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "invalid JSON"),
        (b'{"timestamp": 1, "input_length": 5}', "missing field 'hash_ids'"),
        (b'{"timestamp": 1, "input_length": -5, "hash_ids": []}', "must not be negative"),
        (b'{"timestamp": 1, "input_length": 5, "hash_ids": [1, "x"]}', "list of integers"),
        (b'{"timestamp": "soon", "input_length": 5, "hash_ids": [1]}', "timestamp must be"),
        (b'{"timestamp": 1, "input_length": true, "hash_ids": [1]}', "input_length must be"),
        (b"[1, 2, 3]", "expected a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_mooncake_line_names_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: bytes, message: str
) -> None:
    p = tmp_path / "bad.jsonl"
    good = b'{"timestamp": 0, "input_length": 5, "hash_ids": [1]}'
    p.write_bytes(good + b"\n\n" + line + b"\n" + good + b"\n")
    err = fail(capsys, str(p), "--format", "mooncake")
    assert f"{p}:3:" in err and message in err


@pytest.mark.parametrize(
    ("doc", "where", "message"),
    [
        ('{"block_size": 64, "requests": [', ":1:", "invalid JSON"),
        ('{"requests": []}', "", "missing field 'block_size'"),
        ('{"block_size": 0, "requests": []}', "", "block_size must be positive"),
        ('{"block_size": 64, "requests": {}}', ":requests:", "must be a list"),
        ('{"block_size": 64, "requests": [{"t": 0, "in": 64}]}', ":requests[0]:", "hash_ids"),
        ('{"block_size": 64, "requests": [{"in": 64, "hash_ids": []}]}', ":requests[0]:", "'t'"),
        (
            '{"block_size": 64, "requests": [{"t": 0, "type": "subagent", "requests": '
            '[{"t": 1, "in": -1, "hash_ids": []}]}]}',
            ":requests[0].requests[0]:",
            "in must not be negative",
        ),
        ('{"block_size": 64, "requests": [7]}', ":requests[0]:", "expected an object"),
        ("[]", "", "expected a JSON object"),
    ],
)
def test_malformed_kv_cache_tester_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: str, where: str, message: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_text(doc)
    err = fail(capsys, str(p), "--format", "kv-cache-tester")
    assert f"{p}{where}" in err and message in err


def test_malformed_parquet_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Mooncake columns, one missing.
    p = tmp_path / "m.parquet"
    pq.write_table(pa.table({"timestamp": [0], "hash_ids": [[1]]}), p)
    assert "neither an access log nor Mooncake" in fail(capsys, str(p))
    assert "missing column(s) input_length" in fail(capsys, str(p), "--format", "mooncake")
    # A null in row 3.
    t = pa.table(
        {"timestamp": [0, 1, 2], "input_length": [5, 5, None], "hash_ids": [[1], [1], [1]]}
    )
    pq.write_table(t, p, row_group_size=2)
    assert f"{p}:row 3:" in fail(capsys, str(p))
    # Truncated file.
    good = write_mooncake_parquet(tmp_path / "g.parquet", [(0, 5, [1])] * 10)
    data = good.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    assert f"{cut}" in fail(capsys, str(cut))


def test_malformed_access_logs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = access_log_table([(0, 16, 16, [1]), (1, 16, 16, [1]), (2, 16, 16, [1])])
    # A column of the wrong type.
    p = tmp_path / "wrong.parquet"
    pq.write_table(good.set_column(3, "block_tokens", pa.array([16, 16, 16], pa.int64())), p)
    assert "column 'block_tokens' has type int64" in fail(capsys, str(p), "--format", "access-log")
    # A missing column.
    p2 = tmp_path / "missing.parquet"
    pq.write_table(good.drop_columns(["hit_ssd"]), p2)
    assert "missing column 'hit_ssd'" in fail(capsys, str(p2), "--format", "access-log")
    # Bad values, located by row.
    for col, values, row, message in [
        ("block_tokens", [16, 16, 0], 3, "block_tokens must be positive"),
        ("ts_us", [0, -1, 2], 2, "negative ts_us"),
        ("prompt_tokens", [16, 16, -3], 3, "negative prompt_tokens"),
    ]:
        i = ACCESS_LOG_SCHEMA.get_field_index(col)
        bad = good.set_column(
            i, ACCESS_LOG_SCHEMA.field(col), pa.array(values, ACCESS_LOG_SCHEMA.field(col).type)
        )
        p3 = tmp_path / f"{col}.parquet"
        pq.write_table(bad, p3)
        err = fail(capsys, str(p3))
        assert f"{p3}:row {row}:" in err and message in err
    # A null key.
    i = ACCESS_LOG_SCHEMA.get_field_index("keys")
    keys = pa.array([[b"k" * 16], [b"k" * 16, None], [b"k" * 16]], pa.list_(pa.binary(16)))
    p4 = tmp_path / "nullkey.parquet"
    pq.write_table(good.set_column(i, "keys", keys), p4)
    assert f"{p4}:row 2:" in fail(capsys, str(p4))
    # Two block sizes in one replay.
    mixed = access_log_table([(0, 16, 16, [1]), (1, 32, 32, [2])])
    p5 = tmp_path / "mixed.parquet"
    pq.write_table(mixed, p5)
    assert "block sizes 16 and 32" in fail(capsys, str(p5))


def test_inputs_that_disagree(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    kv = write_kvct(tmp_path / "k.json", [kvct_request(0, 64, [1])])
    assert "mix formats" in fail(capsys, str(trace), str(kv))
    assert "--block-tokens says 32" in fail(capsys, str(kv), "--block-tokens", "32")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "empty file" in fail(capsys, str(tmp_path / "blank.jsonl"))
    assert "no requests" in fail(capsys, str(tmp_path / "blank.jsonl"), "--format", "mooncake")
    (tmp_path / "what.txt").write_text("hello\n")
    assert "pass --format" in fail(capsys, str(tmp_path / "what.txt"))
    # Issue 14: a JSON trace nested 100,000 deep was a RecursionError traceback.
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    for fmt in ("mooncake", "kv-cache-tester"):
        assert "nested too deeply" in fail(capsys, str(tmp_path / "deep.jsonl"), "--format", fmt)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dram", "12XB"], "invalid size"),
        (["--ssd=-1GiB"], "invalid size"),
        (["--retention", "soon"], "invalid duration"),
        (["--retention", "0s"], "--retention must be positive"),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "fast"], "--time-scale: expected a number"),
        (["--bytes-per-token", "0"], "--bytes-per-token"),
        (["--bytes-per-token", "1e-320"], "--bytes-per-token"),  # issue 14: a traceback
        (["--bytes-per-token", "inf"], "--bytes-per-token"),
        (["--block-tokens", "0"], "--block-tokens must be positive"),
        (["--block-tokens", "1.5"], "--block-tokens: expected a number"),
        (["--replay-keep", "-1"], "--replay-keep"),
        (["--price-cached", "nan"], "--price-cached"),
        (["--prefill-tokens-per-gpu-s", "0"], "--prefill-tokens-per-gpu-s"),
        (["--policy", "mru"], "unknown policy"),
        (["--format", "csv"], "unknown format"),
        (["--sweep", "dram"], "invalid --sweep"),
        (["--sweep", "l3=1GiB..2GiB:x2"], "invalid --sweep"),
        (["--sweep", "dram=2GiB..1GiB:x2"], "is above"),
        (["--sweep", "dram=1GiB..2GiB:x1"], "x > 1"),
        (["--sweep", "dram=1GiB..2GiB"], "needs a step"),
        (["--sweep", "dram=1GiB..inf:x2"], "finite"),
        (["--sweep", "dram=1GiB..2Mtok:x2"], "both ends"),
        (["--sweep", "dram=1GiB", "--sweep", "dram=2GiB"], "at most once"),
        (["--plot", "x.png"], "--plot needs --sweep"),
    ],
)
def test_bad_flags(
    capsys: pytest.CaptureFixture[str], trace: Path, flags: list[str], message: str
) -> None:
    assert message in fail(capsys, str(trace), *flags)


def test_unwritable_plot(capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    err = fail(capsys, str(trace), "--sweep", "dram=1GiB", "--plot", str(tmp_path / "no" / "x.png"))
    assert "cannot write plot" in err


def test_sweep_over_an_empty_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "blank.jsonl").write_text("\n")
    err = fail(
        capsys, str(tmp_path / "blank.jsonl"), "--format", "mooncake", "--sweep", "dram=1GiB"
    )
    assert "no requests" in err


def test_progress_bar_on_a_terminal(
    capsys: pytest.CaptureFixture[str], trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["hitrate", str(trace)]) == 0
    captured = capsys.readouterr()
    assert "accesses" in captured.err  # tqdm's counter (block accesses, with an ETA)
    assert "token hit rate" in captured.out
    assert main(["hitrate", str(trace), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_toml_numbers_are_accepted(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "n.toml"
    cfg.write_text("dram = 1073741824\nreplay-keep = 7\nbytes-per-token = 445.5\n")
    out = run_json(capsys, str(trace), "--config", str(cfg))
    assert out["replay_keep_tokens"] == 7
    assert out["tiers"]["dram"]["capacity_blocks"] == 1073741824 // int(512 * 445.5)


@pytest.mark.parametrize(
    "sweep",
    ['"dram=1GiB..4GiB:x2"', '["dram=1GiB..4GiB:x2"]', '["dram=1GiB..4GiB:x2", "ssd=8GiB,16GiB"]'],
)
def test_a_sweep_in_a_config_is_the_flags_sweep(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path, sweep: str
) -> None:
    # Issue 36 (item 3): the string was iterated per character: "invalid --sweep 'd'".
    cfg = tmp_path / "s.toml"
    cfg.write_text(f"sweep = {sweep}\n")
    flags = [f"--sweep={s}" for s in json.loads(sweep if sweep.startswith("[") else f"[{sweep}]")]
    assert run_json(capsys, str(trace), "--config", str(cfg)) == run_json(
        capsys, str(trace), *flags
    )


def test_a_sweep_on_the_command_line_wins_over_the_configs(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text('sweep = ["ssd=1GiB,2GiB"]\n')
    given = ["--sweep", "dram=1GiB,2GiB"]
    assert run_json(capsys, str(trace), "--config", str(cfg), *given) == run_json(
        capsys, str(trace), *given
    )


def test_a_fractional_size_in_a_config_is_refused(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    # Issue 36 (item 6): `dram = 1.5` silently became a DRAM tier of 1 byte.
    cfg = tmp_path / "f.toml"
    cfg.write_text("dram = 1.5\n")
    assert "invalid size '1.5'" in fail(capsys, str(trace), "--config", str(cfg))


def test_the_standalone_command_checks_a_config_like_kvstore_hitrate(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text("dram = 1073741824\nreplay-keep = 7\n")  # TOML numbers, as flags take them
    assert standalone_main(["--json", str(trace), "--config", str(cfg)]) == 0
    assert json.loads(capsys.readouterr().out) == run_json(capsys, str(trace), "--config", str(cfg))
    cfg.write_text('nonsense = "x"\n')
    assert standalone_main([str(trace), "--config", str(cfg)]) == 2
    assert "unknown keys nonsense" in capsys.readouterr().err
