"""CANN programs built the way CANN's own example build builds them, against a root made by
`aclnn-py mock-root`: its include paths and link lines (the built-in operator line with
-lopapi_math / -lopapi_transformer / -lhccl_fwk / -lc_sec, its older -lopapi form, and the custom
operator package line), sample-style programs that hold float16 host data as op::fp16_t, and the
header and library pieces themselves (op::fp16_t against numpy's float16, securec.h's return codes)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.root_copies import run_cli
from helpers.toolchain import c_compiler, cxx_compiler

SAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cann_samples"
ARCH = f"{platform.machine()}-linux"


def _root(tmp_path: Path, generations: str) -> Path:
    dest = tmp_path / f"root_v{generations.replace(',', '_')}"
    done = run_cli("mock-root", str(dest), "--generations", generations)
    assert done.returncode == 0, done.stderr
    return dest.resolve()


def _line(kind: str, root: Path, vendor: str = "") -> list[str]:
    """CANN's example link line of one kind, with the paths a CANN install's setenv script defines
    (ASCEND_HOME_PATH = root, ASCEND_OPP_PATH = root/opp)."""
    includes = [f"-I{root}/include", f"-I{root}/include/aclnn", f"-I{root}/{ARCH}/include/aclnnop"]
    libs = [f"-L{root}/opp/lib64", f"-L{root}/lib64"]
    if kind == "builtin":
        return includes + libs + ["-lopapi_math", "-lopapi_transformer", "-lascendcl", "-lnnopbase", "-lpthread",
                                  "-lhccl", "-lhccl_fwk", "-lc_sec"]
    if kind == "doc-page":  # the build script of the V3/V4 documents' samples
        return [f"-I{root}/include/", f"-I{root}/include/aclnnop/", f"-L={root}/lib64/", "-lascendcl", "-lnnopbase",
                "-lopapi_math", "-lop_common", "-lpthread", "-lhccl"]
    if kind == "builtin-legacy":
        return includes + libs + ["-lopapi", "-lopapi_transformer", "-lascendcl", "-lnnopbase", "-lpthread",
                                  "-lhccl"]
    assert kind == "cust"
    pkg = root / "opp" / "vendors" / vendor / "op_api"
    return [f"-I{root}/include", f"-I{pkg}/include", f"-L{pkg}/lib", f"-L{root}/lib64", "-lcust_opapi", "-lascendcl",
            "-lnnopbase", f"-I{root}/{ARCH}/include/aclnnop", "-lpthread", "-lhccl", "-lhccl_fwk", "-lc_sec",
            f"-Wl,-rpath={pkg}/lib"]


def _build(source: Path, line: list[str], out: Path) -> Path:
    cxx = cxx_compiler()
    cmd = [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", str(source), *line, "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, " ".join(cmd) + "\n" + done.stderr
    return out


def _run(exe: Path, root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACLNN_MOCK_")}
    full.update(ASCEND_HOME_PATH=str(root), ASCEND_OPP_PATH=str(root / "opp"), LD_LIBRARY_PATH=f"{root}/lib64", **env)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=240, env=full, check=False)


def _ranks_succeeded(out: str, phrase: str) -> list[int]:
    return sorted(int(ln.split()[2].rstrip(":")) for ln in out.splitlines() if phrase in ln)


@pytest.mark.parametrize("kind", ["builtin", "builtin-legacy", "doc-page", "cust"])
def test_fp16_sample_first_generation_on_every_link_line(tmp_path, kind):
    root = _root(tmp_path, "1")
    exe = _build(SAMPLES / "moe_dispatch_combine_fp16.cpp", _line(kind, root, vendor="moe_v1"), tmp_path / "fp16")
    res = _run(exe, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ranks_succeeded(res.stdout, "execute successfully") == list(range(8)), res.stdout


def test_fp16_sample_reports_the_refusal_with_cann_message(tmp_path):
    """With 4 devices the sample's aclrtSetDevice(4) fails: it prints the call and CANN's message."""
    root = _root(tmp_path, "1")
    exe = _build(SAMPLES / "moe_dispatch_combine_fp16.cpp", _line("builtin", root), tmp_path / "fp16")
    res = _run(exe, root, ACLNN_MOCK_DEVICE_COUNT="4")
    assert res.returncode != 0
    assert "aclrtSetDevice" in res.stdout and "deviceId must be in [0, 4) (got 4)" in res.stdout, res.stdout


@pytest.mark.parametrize(("source", "generations", "ranks"), [
    ("moe_dispatch_combine_v5.cpp", "5", 8),
    ("moe_dispatch_combine_v2.cpp", "2", 16),
    # a root offering several generations joins them in its libopapi_transformer.so
    ("moe_dispatch_combine_v5.cpp", "2,5", 8),
    ("moe_dispatch_combine_v4.cpp", "4", 8),
])
@pytest.mark.parametrize("kind", ["builtin", "doc-page"])
def test_generation_samples_on_cann_builtin_line(tmp_path, source, generations, ranks, kind):
    root = _root(tmp_path, generations)
    exe = _build(SAMPLES / source, _line(kind, root), tmp_path / "sample")
    res = _run(exe, root)
    assert res.returncode == 0, res.stdout + res.stderr
    phrase = "execute successfully" if "v4" in source else "match the host"
    assert _ranks_succeeded(res.stdout, phrase) == list(range(ranks)), res.stdout


def test_a2_sample_rank_table_processes(tmp_path):
    """Atlas A2, the way CANN's A2 samples run: a process per device, HcclCommInitClusterInfo on a rank
    table, generation 3, EP 16; the SoC as an A2 device reports it."""
    root = _root(tmp_path, "3")
    exe = _build(SAMPLES / "moe_dispatch_combine_v3_a2.cpp", _line("builtin", root), tmp_path / "v3_a2")
    work = tmp_path / "run"
    work.mkdir()
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACLNN_MOCK_")}
    full.update(LD_LIBRARY_PATH=f"{root}/lib64", ACLNN_MOCK_SOC="Ascend910B3")
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=240, env=full, cwd=work, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ranks_succeeded(res.stdout, "execute successfully") == list(range(16)), res.stdout
    assert (work / "moe_v3_a2_rank_table.json").is_file()


def test_a2_sample_with_too_few_devices_reports_each_rank(tmp_path):
    """With 8 devices, ranks 8..15 cannot set their device and ranks 0..7 find devices 8..15 of the rank
    table missing: every rank prints its call with CANN's message, and the program fails without a hang."""
    root = _root(tmp_path, "3")
    exe = _build(SAMPLES / "moe_dispatch_combine_v3_a2.cpp", _line("builtin", root), tmp_path / "v3_a2")
    work = tmp_path / "run"
    work.mkdir()
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACLNN_MOCK_")}
    full.update(LD_LIBRARY_PATH=f"{root}/lib64", ACLNN_MOCK_SOC="Ascend910B3", ACLNN_MOCK_DEVICE_COUNT="8")
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=240, env=full, cwd=work, check=False)
    assert res.returncode != 0
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "[ERROR] 16 of 16 ranks failed", res.stdout
    assert sum("aclrtSetDevice(rankId) failed. ret = 107001" in ln and "must be in [0, 8)" in ln for ln in lines) == 8
    assert sum("HcclCommInitClusterInfo(" in ln and "not a device id in [0, 8)" in ln for ln in lines) == 8, res.stdout


def test_v5_sample_on_the_950(tmp_path):
    root = _root(tmp_path, "5")
    exe = _build(SAMPLES / "moe_dispatch_combine_v5.cpp", _line("builtin", root), tmp_path / "v5")
    res = _run(exe, root, ACLNN_MOCK_SOC="Ascend950DT_9391")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ranks_succeeded(res.stdout, "match the host") == list(range(8)), res.stdout


def test_builtin_library_offers_only_the_chosen_generations(tmp_path):
    """A program calling generation 5 does not link against a root made with generation 2 only, as
    against a CANN install whose op package predates it."""
    root = _root(tmp_path, "2")
    cxx = cxx_compiler()
    cmd = [cxx, "-std=c++17", str(SAMPLES / "moe_dispatch_combine_v5.cpp"), *_line("builtin", root), "-o",
           str(tmp_path / "v5")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "aclnnMoeDistributeDispatchV5GetWorkspaceSize" in done.stderr


def test_package_mock_root_links_the_builtin_line(tmp_path):
    """The package's own mock root (every generation) serves the same line."""
    import aclnn_py

    root = Path(aclnn_py.mock_root()).resolve()
    exe = _build(SAMPLES / "moe_dispatch_combine_fp16.cpp", _line("builtin", root), tmp_path / "fp16")
    res = _run(exe, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _ranks_succeeded(res.stdout, "execute successfully") == list(range(8))


FP16_PROBE = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "aclnn/opdev/fp16_t.h"
// stdin: n, n float32 values, then n pairs of half bit patterns; stdout: the conversions and the
// sum, difference, product and quotient of each pair as half bits, and each half back as float32
int main() {
    size_t n = 0;
    if (std::fread(&n, sizeof n, 1, stdin) != 1) return 2;
    std::vector<float> f(n);
    std::vector<uint16_t> a(n), b(n);
    if (std::fread(f.data(), 4, n, stdin) != n || std::fread(a.data(), 2, n, stdin) != n ||
        std::fread(b.data(), 2, n, stdin) != n) return 2;
    for (size_t i = 0; i < n; ++i) {
        op::fp16_t x = f[i], p(a[i]), q(b[i]);
        uint16_t out[5] = {x.val, (p + q).val, (p - q).val, (p * q).val, (p / q).val};
        float back = static_cast<float>(p);
        std::fwrite(out, 2, 5, stdout);
        std::fwrite(&back, 4, 1, stdout);
    }
    return 0;
}
"""


def test_fp16_t_rounds_like_numpy_float16(tmp_path):
    import aclnn_py

    rng = np.random.default_rng(7)
    n = 20000
    special = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26,
                        2.0**-14, 2.0**-14 - 2.0**-25, np.inf, -np.inf, np.nan, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11],
                       dtype=np.float32)
    floats = np.concatenate([special, (rng.standard_normal(n - len(special)) *
                                       np.exp2(rng.integers(-26, 17, n - len(special)))).astype(np.float32)])
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    src = tmp_path / "probe.cpp"
    src.write_text(FP16_PROBE)
    root = Path(aclnn_py.mock_root()).resolve()
    exe = _build(src, [f"-I{root}/include"], tmp_path / "probe")
    stdin = np.array([n], dtype=np.uint64).tobytes() + floats.tobytes() + a.tobytes() + b.tobytes()
    done = subprocess.run([str(exe)], input=stdin, capture_output=True, check=False, timeout=60)
    assert done.returncode == 0
    rec = np.frombuffer(done.stdout, dtype=[("h", "<u2", 5), ("back", "<f4")])
    assert len(rec) == n
    ha, hb = a.view(np.float16), b.view(np.float16)
    with np.errstate(all="ignore"):
        expected = [floats.astype(np.float16), ha + hb, ha - hb, ha * hb, ha / hb]
    for col, want in enumerate(expected):
        got = rec["h"][:, col].view(np.float16)
        same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (col, np.flatnonzero(~same)[:5])
    back_ok = (rec["back"] == ha.astype(np.float32)) | (np.isnan(rec["back"]) & np.isnan(ha))
    assert back_ok.all()


SECUREC_PROBE = r"""
#include <stdio.h>
#include <string.h>
#include "securec.h"
int main(void) {
    char d[8] = "abcdefg";
    char big[16] = "0123456789";
    printf("%d", memcpy_s(d, sizeof d, "xy", 2));          /* EOK */
    printf(" %d[%s]", memcpy_s(d, 4, big, 10), d);          /* count > destMax: cleared, ERANGE_AND_RESET */
    printf(" %d", memcpy_s(NULL, 4, big, 1));               /* EINVAL */
    printf(" %d", memcpy_s(d, 0, big, 1));                  /* ERANGE */
    printf(" %d", memcpy_s(big, sizeof big, big + 2, 4));   /* overlap: EOVERLAP_AND_RESET */
    printf(" %d", memset_s(d, sizeof d, 'z', 3));           /* EOK */
    printf(" %d[%s]", strcpy_s(d, sizeof d, "hello"), d);   /* EOK */
    printf(" %d[%s]", strcpy_s(d, sizeof d, "too long!"), d); /* ERANGE_AND_RESET */
    printf(" %d[%s]\n", strncpy_s(d, sizeof d, "too long!", 3), d);
    return 0;
}
"""


def test_c_sec_return_codes(tmp_path):
    root = _root(tmp_path, "5")
    src = tmp_path / "sec.c"
    src.write_text(SECUREC_PROBE)
    cc = c_compiler()
    exe = tmp_path / "sec"
    done = subprocess.run([cc, "-Wall", "-Werror", str(src), f"-I{root}/include", f"-L{root}/lib64", "-lc_sec", "-o",
                           str(exe)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    out = _run(exe, root).stdout.strip()
    assert out == "0 162[] 22 34 182 0 0[hello] 162[] 0[too]"
