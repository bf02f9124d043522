"""examples/machine.py: the machine record every benchmark and the quickstart keep beside their times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import machine  # noqa: E402

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 ht

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 ht
"""


def test_cpuinfo_gives_the_model_and_the_kernel_flags_only(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    model, flags = machine.cpu_model_and_flags(info)
    assert model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert flags == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]  # in KERNEL_FLAGS order


def test_an_avx2_only_cpu_lists_no_avx512(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma sse4_2\n")
    assert machine.cpu_model_and_flags(info) == ("AMD EPYC", ["avx2", "fma"])


def test_the_record_measures_both_matmul_rates_in_a_child_and_prints_one_line(capsys):
    record = machine.stamp()
    printed = capsys.readouterr().out
    assert printed.startswith("machine: ") and record["cpu"] in printed and "GFLOP/s float32" in printed
    assert record["matmul_gflops_float32"] > 0 and record["matmul_gflops_bfloat16"] > 0
    assert record["cores"] >= 1 and record["threads"] >= 1 and record["torch"]


@pytest.mark.parametrize("threads", [1])
def test_the_command_writes_the_record_and_describes_it_again(tmp_path, threads):
    out = tmp_path / "machine.json"
    run = [sys.executable, str(EXAMPLES / "machine.py")]
    subprocess.run([*run, "--json", str(out), "--threads", str(threads)], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert record["threads"] == threads
    again = subprocess.run([*run, "--describe", str(out)], check=True, capture_output=True, text=True).stdout
    assert again.strip() == machine.one_line(record)
