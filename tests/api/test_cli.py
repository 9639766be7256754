"""The zerotune CLI: exit statuses, one-line errors, and a light import path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zerotune.api.cli import ExitStatus, main


def test_help_lists_subcommands(capsys):
    assert main(["--help"]) == ExitStatus.SUCCESS
    out = capsys.readouterr().out
    assert "catalog" in out and "validate" in out


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == ExitStatus.USAGE_ERROR


def test_validate_ok_and_json(capsys):
    assert main(["validate", "--cluster", "frontier:48", "--strategy", "zeropp", "--model", "gpt-neox-20b"]) == 0
    assert "384 ranks" in capsys.readouterr().out
    assert main(["validate", "--cluster", "local:2x2", "--strategy", "zero3", "--set", "weight_bits=8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"]["weight_bits"] == 8 and data["world_size"] == 4


def test_invalid_strategy_is_one_line_on_stderr(capsys):
    code = main(["validate", "--cluster", "local:2x2", "--strategy", "zero3", "--set", "grad_bits=3"])
    assert code == ExitStatus.USAGE_ERROR
    err = capsys.readouterr().err.strip()
    assert err == "zerotune: error: strategy.grad_bits=3: must be one of [32, 16, 8, 4]"


def test_validate_with_a_model_checks_that_it_fits(capsys):
    assert main(["validate", "--strategy", "zero1", "--model", "gpt-neox-20b", "--cluster", "frontier:48"]) == \
        ExitStatus.USAGE_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith("zerotune: error: strategy='zero1': gpt-neox-20b does not fit AMD MI250X GCD memory with "
                          "it: needs 95.3 GiB of 64 GiB") and len(err.splitlines()) == 1, err
    assert main(["validate", "--strategy", "zero3", "--model", "gpt-neox-20b", "--cluster", "frontier:48"]) == 0
    assert "gpt-neox-20b needs 22.3 GiB of 64 GiB per rank" in capsys.readouterr().out


@pytest.mark.parametrize("model, cluster, strategy", [
    ("gpt-13b", "dgx-h100:4", ["--strategy", "zero3"]),
    ("gpt-tiny", "local:2x2", ["--strategy", "zeropp", "--set", "micro_batch_size=2"]),
    ("gpt-neox-20b", "frontier:2", ["--strategy", "3level-b", "--set", "micro_batch_size=8"]),
])
def test_train_and_predict_default_to_the_same_training(model, cluster, strategy, tmp_path, capsys):
    """With no --global-batch, `zerotune predict` predicts the step `zerotune train` runs (the same global batch,
    split into the same micro-batches), and, where the micro-batch is one a study tries, the batch a request's
    trials train; both --help texts say so."""
    import argparse

    from zerotune.costmodel.catalog import parse_cluster, parse_model
    from zerotune.trainer.train import add_run_args, resolve
    from zerotune.tuner.request import TuneRequest
    from zerotune.tuner.space import MICRO_BATCH_SIZES

    assert main(["predict", "--model", model, "--cluster", cluster, *strategy, "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    parser = argparse.ArgumentParser()
    add_run_args(parser)  # what the ranks of `zerotune train` resolve, before any process starts
    args = parser.parse_args(["--model", model, "--cluster", cluster, *strategy, "--out", str(tmp_path / "run.json"),
                              "--force"])
    _, world, plan, accum = resolve(args, accelerated=False)
    trained = world.world_size * plan.micro_batch_size * accum
    micro = predicted["global_batch"] // (predicted["world_size"] * predicted["grad_accum_steps"])
    assert (predicted["global_batch"], micro) == (trained, plan.micro_batch_size)
    assert trained >= 4 * world.world_size  # four sequences per rank at least, whatever the micro-batch
    if plan.micro_batch_size in MICRO_BATCH_SIZES:
        assert TuneRequest(model=parse_model(model), cluster=parse_cluster(cluster)).global_batch == trained
    for command, other in (("predict", "zerotune train"), ("train", "zerotune predict")):
        assert main([command, "--help"]) == ExitStatus.SUCCESS
        assert f"as {other} and a request default to" in " ".join(capsys.readouterr().out.split())


def test_catalog_sizes_read_for_small_models_too(capsys):
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    assert "0.000 B" not in out
    assert "137.0 K params" in out and "4.2 M params" in out and "20.26 B params" in out


def test_catalog_json(capsys):
    assert main(["catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"frontier", "dgx-h100"} <= set(data["clusters"]) and "zeropp" in data["strategies"]


def test_console_script_runs_without_torch():
    code = ("import sys; from zerotune.api.cli import main; rc = main(['validate', '--cluster', 'frontier:48', "
            "'--strategy', '3level-a']); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    script = _own_script()
    command = [str(script)] if script else [sys.executable, "-m", "zerotune.api.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "validate" in result.stdout, result.stderr


def _own_script():
    """The ``zerotune`` console script installed beside this interpreter (the checkout under test's own), not
    whichever ``zerotune`` comes first on PATH (another checkout's environment, possibly gone)."""
    from pathlib import Path
    script = Path(sys.executable).parent / "zerotune"
    return script if script.is_file() else None


def test_serve_with_a_bad_setting_is_one_line_on_stderr(capsys):
    assert main(["serve", "--port", "70000"]) == ExitStatus.USAGE_ERROR
    err = capsys.readouterr().err.strip()
    assert err == "zerotune: error: ZEROTUNE_PORT=70000: Input should be less than or equal to 65535"


def test_serve_on_a_busy_port_is_one_line_and_never_says_serving(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--workers", "0", "--db", "sqlite://"]) == ExitStatus.USAGE_ERROR
    err = capsys.readouterr().err.strip()
    assert err == (f"zerotune: error: port={port}: 127.0.0.1:{port} is already in use (another service?); "
                   "choose another with --port or ZEROTUNE_PORT"), err


def test_make_run_takes_the_port_from_the_environment():
    """``make run`` passes no --host/--port of its own: ZEROTUNE_HOST / ZEROTUNE_PORT decide, as documented."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}  # also under `make test`
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "run"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2], env=env)
    assert out.returncode == 0, out.stderr
    serve = [line.strip() for line in out.stdout.splitlines() if "zerotune serve" in line]
    assert len(serve) == 1 and serve[0].endswith("zerotune serve"), out.stdout


def test_upload_exit_paths(tmp_path, capsys):
    assert main(["upload", str(tmp_path / "missing.json")]) == ExitStatus.USAGE_ERROR
    assert "cannot read a run.json" in capsys.readouterr().err
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"status": "ok", "model": "gpt-tiny", "cluster": "local:2", "strategy": "zero3"}))
    assert main(["upload", str(run), "--url", "http://127.0.0.1:9", "--timeout", "2"]) == ExitStatus.ERROR
    assert "service unreachable" in capsys.readouterr().err


def test_new_commands_are_listed_and_stay_light():
    code = ("import sys; from zerotune.api.cli import build_parser; "
            "build_parser().parse_args(['worker', '--max-jobs', '1']); "
            "build_parser().parse_args(['serve', '--workers', '0']); "
            "assert not {'torch', 'fastapi', 'optuna', 'sqlalchemy'} & set(sys.modules), sorted(sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_tune_takes_a_flag_for_each_field_of_a_request(capsys):
    """``zerotune tune``'s request flags are the request's fields (``core.fields.Options``): type, choices, default
    and meaning; a value that breaks a field's rule is the usual one-line usage error."""
    import argparse

    from zerotune.api.cli.tune import OWN_FLAGS, add_request_flags, request_options
    from zerotune.core.fields import DEFAULTS, OPTIONS

    p = argparse.ArgumentParser()
    add_request_flags(p)
    flagged = {d.name for d in OPTIONS if d.about.flag is not None and d.name not in OWN_FLAGS}
    assert flagged >= {"trials", "time_budget_s", "measure", "runner", "grad_reduce_in_fp32", "sampler", "seed"}
    assert request_options(p.parse_args([])) == {name: DEFAULTS[name] for name in flagged}
    given = request_options(p.parse_args(["--time-budget", "60", "--measure-shortlist", "slurm", "--trials", "7",
                                          "--grad-reduce-in-fp32", "--runner", "fsdp"]))
    assert (given["time_budget_s"], given["measure"], given["trials"], given["grad_reduce_in_fp32"],
            given["runner"]) == (60.0, "slurm", 7, True, "fsdp")
    assert main(["tune", "--model", "gpt-tiny", "--cluster", "local:2", "--time-budget", "-1"]) == \
        ExitStatus.USAGE_ERROR
    assert capsys.readouterr().err.strip() == "zerotune: error: budget.time_s=-1.0: must be > 0"
