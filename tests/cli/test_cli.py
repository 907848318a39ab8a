"""`aclnn-py` as a user runs it (``python -m aclnn_py``, the console script's entry point): version,
bare call, defaults in every --help, one-line user errors with exit 2, an internal error's
traceback with exit 3, and silence on stderr under --quiet / --json."""

from __future__ import annotations

import json

import pytest
from helpers.root_copies import run_cli

from aclnn_py.tools import cli


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def test_version():
    import aclnn_py

    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"aclnn-py {aclnn_py.__version__}"


def test_bare_call_is_a_usage_error():
    r = run_cli()
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.startswith("usage: aclnn-py")
    assert r.stderr.strip().splitlines()[-1] == "aclnn-py: error: a command is required (see aclnn-py --help)"


@pytest.mark.parametrize("command", ["doctor", "demo"])
def test_every_help_shows_defaults(command):
    r = run_cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: aclnn-py {command}")
    assert "(default: " in r.stdout and "exit status:" in r.stdout
    # every option that takes a value says its default: as a value, or in words when it is computed
    parser = cli.build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.nargs == 0:
            continue  # flags and --help
        text = formatter._expand_help(action)
        assert "(default: " in text, (command, action.option_strings, text)


def test_demo_help_names_every_default():
    out = run_cli("demo", "--help").stdout
    for expected in ("(default: mock)", "(default: auto)", "(default: 4, on Atlas A2 16, or the number of --devices)",
                     "(default: 8, or one per MoE rank when there are more ranks)",
                     "(default: 1024)", "(default: 300.0)", "(default: bf16)"):
        assert expected in " ".join(out.split()), expected


USER_ERRORS = [
    (["frobnicate"], {}, "aclnn-py: error: argument <command>: invalid choice: 'frobnicate'"),
    (["demo", "--quant-mode", "7"], {}, "aclnn-py demo: error: argument --quant-mode: invalid choice: 7"),
    (["demo", "--tokens", "many"], {}, "aclnn-py demo: error: argument --tokens: invalid int value: 'many'"),
    (["demo", "--world-size", "8", "--experts", "30", "--shared-experts", "1", "--shared-expert-ranks", "1"], {},
     "aclnn-py demo: error: --experts 30 is not divisible by the 7 MoE ranks (--world-size 8 - "
     "--shared-expert-ranks 1)"),
    (["demo", "--world-size", "8"], {"ACLNN_MOCK_DEVICE_COUNT": "4"},
     "aclnn-py demo: error: --world-size 8 needs 8 devices but the backend reports 4 (set "
     "ACLNN_MOCK_DEVICE_COUNT, up to 1024, for more mock devices)"),
    (["demo", "--world-size", "20", "--experts", "20"], {},
     "aclnn-py demo: error: --world-size 20 needs 20 devices but the backend reports 16 (set "
     "ACLNN_MOCK_DEVICE_COUNT, up to 1024, for more mock devices)"),
    (["demo", "--devices", "0,1,9", "--experts", "6"], {"ACLNN_MOCK_DEVICE_COUNT": "4"},
     "aclnn-py demo: error: --devices 9: the backend reports devices 0..3 (set ACLNN_MOCK_DEVICE_COUNT"),
    (["demo", "--timeout", "0"], {}, "aclnn-py demo: error: argument --timeout: must be a number of seconds > 0 "
                                     "(got 0)"),
    (["demo", "--timeout", "-5"], {}, "aclnn-py demo: error: argument --timeout: must be a number of seconds > 0 "
                                      "(got -5)"),
    (["demo", "--timeout", "nan"], {}, "aclnn-py demo: error: argument --timeout: must be a number of seconds > 0 "
                                       "(got nan)"),
    (["demo", "--seed", "-1"], {}, "aclnn-py demo: error: argument --seed: must be >= 0 (got -1)"),
    (["demo", "--devices", "0,x"], {}, "aclnn-py demo: error: --devices '0,x': give comma-separated integers"),
    (["demo", "--soc", "Ascend310P"], {},
     "aclnn-py demo: error: --soc 'Ascend310P' is of no known SoC family: give a name beginning with Ascend910_93 "
     "(Atlas A3, e.g. Ascend910_9391, Ascend910_9392); Ascend910B (Atlas A2"),
    (["demo", "--quant-mode", "4"], {},
     "aclnn-py demo: error: --quant-mode 4 is not supported on Ascend910_93 (it supports 0, 2) (Ascend950 "
     "supports it: --soc on the mock)"),
    (["demo", "--soc", "Ascend950", "--quant-mode", "3", "--y-dtype", "int8"], {},
     "aclnn-py demo: error: --y-dtype int8 is not an output of quant mode 3 on Ascend950 (allowed: "
     "float8_e4m3fn, float8_e5m2)"),
    (["demo", "--comm-quant-mode", "3"], {},
     "aclnn-py demo: error: --comm-quant-mode 3 is not supported on Ascend910_93 (it supports 0, 2)"),
    (["demo", "--world-size", "1"], {},
     "aclnn-py demo: error: --world-size must be >= 2: the operators run on 2 or more ranks (got 1)"),
    (["demo", "--backend", "/nonexistent/cann"], {},
     "aclnn-py demo: error: --backend /nonexistent/cann: /nonexistent/cann is not a CANN root"),
]


@pytest.mark.parametrize("argv,env,expected", USER_ERRORS, ids=[" ".join(a) for a, _, _ in USER_ERRORS])
def test_user_errors_are_one_line_and_exit_2(argv, env, expected):
    r = run_cli(*argv, **env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert first_line(r.stderr).startswith(expected), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("argv,line", [
    ([], "python -m benchmarks"),
    (["--quick", "--json"], "python -m benchmarks --quick --json"),
    (["--sections", "host_overhead,pool", "--update", "my file.md"],
     "python -m benchmarks --sections host_overhead,pool --update 'my file.md'"),
])
def test_bench_is_not_installed_and_says_how_to_run_it(argv, line):
    r = run_cli("bench", *argv)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == ("aclnn-py bench: error: the benchmarks are not part of the installed package; from the "
                        f"root of a source checkout of aclnn-py, run: {line}\n")


def test_bench_help_points_to_the_checkout():
    r = run_cli("bench", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: aclnn-py bench")
    assert "`python -m benchmarks --help`" in r.stdout and "docs/benchmarks.md" in r.stdout


def test_other_commands_still_refuse_unknown_arguments():
    r = run_cli("doctor", "--frobnicate")
    assert r.returncode == 2 and r.stderr == ("aclnn-py: error: unrecognized arguments: --frobnicate "
                                              "(see aclnn-py --help)\n"), r.stderr


def test_operator_rejection_of_the_model_is_a_user_error():
    """H = 512 is outside the operators' 1024..8192: refused with the operators' words before any rank
    starts (the ranks' own refusal of a rule the demo cannot check ahead says "on rank N")."""
    r = run_cli("demo", "--world-size", "2", "--experts", "2", "--topk", "2", "--hidden", "512", "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr
    assert first_line(r.stderr).startswith("aclnn-py demo: error: the operator rejects this model: ")
    assert "x: dim 1 (H) must be in [1024, 8192] (got 512)" in r.stderr and "Traceback" not in r.stderr


def test_internal_error_prints_its_traceback_and_exits_3(monkeypatch, capsys):
    from aclnn_py.tools import demo

    def broken(args):
        raise RuntimeError("a bug in the demo")

    real = demo.add_parser

    def add_parser(sub):
        real(sub)
        sub.choices["demo"].set_defaults(func=broken)

    monkeypatch.setattr(demo, "add_parser", add_parser)
    assert cli.main(["demo"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: a bug in the demo" in err
    assert err.strip().endswith("aclnn-py: internal error (traceback above)")


def test_progress_on_stderr_by_default_and_silence_under_quiet():
    args = ("demo", "--world-size", "2", "--experts", "4", "--topk", "2")
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo: starting 2 ranks (processes)" in r.stderr and "round 1/1 done" in r.stderr
    q = run_cli(*args, "--quiet")
    assert q.returncode == 0 and q.stderr == "", q.stderr
    assert q.stdout.strip().endswith("result: MATCH (bit for bit with the golden)")


def test_demo_json_is_one_document_and_stderr_is_silent():
    r = run_cli("demo", "--world-size", "2", "--experts", "4", "--topk", "2", "--quant-mode", "2", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["result"] == "MATCH" and doc["model"]["quant_mode"] == 2
    outputs = {(c["rank"], c["output"]) for c in doc["checks"] if c["produced"]}
    assert outputs == {(r, o) for r in range(2) for o in ("expand_x", "dynamic_scales", "assist_info_for_combine",
                                                          "expert_token_nums", "ep_recv_counts", "expand_scales",
                                                          "x_out")}


def test_doctor_json_is_one_document_and_stderr_is_silent():
    r = run_cli("doctor", "--backend", "mock", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"]["kind"] == "mock" and doc["exit_code"] == 0


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`aclnn-py doctor | head -1`: the rest of the output has nowhere to go; no traceback."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        proc = subprocess.run([sys.executable, "-m", "aclnn_py", "doctor", "--backend", "mock"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
