"""The settings registry (csrc/common/setting.h, pycollectives.settings): every PYCOLL_* variable
declared once; bad values raise a ValueError naming the setting and its range; docs/settings.md's
tables are what the declarations say."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import pycollectives.settings as ps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER = {"PYCOLL_ALGO", "PYCOLL_CPU_THREADS", "PYCOLL_DEBUG", "PYCOLL_SHM_BYTES", "PYCOLL_P2P_CHANNEL_BYTES", "PYCOLL_COST_MODEL",
        "PYCOLL_INTER_HOST_BACKEND", "PYCOLL_CHECK_ACROSS_HOSTS", "PYCOLL_COALESCE_P2P",
        "PYCOLL_CPU_PEER_READ", "PYCOLL_CPU_SHARED_TENSORS", "PYCOLL_CPU_ALLOCATOR", "PYCOLL_SHARED_CPU_MIN_BYTES",
        "PYCOLL_SHARED_CPU_CACHE_BYTES", "PYCOLL_FR_BUFFER_SIZE", "PYCOLL_FR_DUMP_SIGNAL", "PYCOLL_FR_DUMP_ON_ERROR",
        "PYCOLL_FR_DUMP_PIPE", "PYCOLL_FR_STACKS", "PYCOLL_FR_GPU_TIMING", "PYCOLL_CUDA_SAME_DEVICE",
        "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB"}


def test_every_setting_is_declared_once_with_doc_and_range():
    names = [s["name"] for s in ps.settings()]
    assert len(names) == len(set(names)), names
    assert USER <= set(names), set(names)
    # The CUDA engine's settings are listed in CPU-only builds too (csrc/cuda/cuda_settings.cpp).
    assert {"PYCOLL_CUDA_MAX_BLOCKS", "PYCOLL_CUDA_LL_MAX_KIB", "PYCOLL_CUDA_TRACE"} <= set(names)
    for s in ps.settings():
        assert s["name"].startswith("PYCOLL_")
        assert s["doc"] and s["range"] and s["default"], s
        assert s["audience"] in ("user", "developer"), s
    assert {s["name"] for s in ps.settings() if s["audience"] == "user"} == USER


@pytest.mark.parametrize("name,bad,words", [
    ("PYCOLL_SHM_BYTES", "lots", ["PYCOLL_SHM_BYTES=lots", "65536.."]),
    ("PYCOLL_SHM_BYTES", "1k", ["PYCOLL_SHM_BYTES=1k", "65536.."]),
    ("PYCOLL_CUDA_MAX_BLOCKS", "0", ["PYCOLL_CUDA_MAX_BLOCKS=0", "1..128"]),
    ("PYCOLL_CUDA_SLOT_KIB", "6", ["PYCOLL_CUDA_SLOT_KIB=6", "multiple of 4"]),
    ("PYCOLL_CUDA_TRACE", "2", ["PYCOLL_CUDA_TRACE=2", "0..1"]),
    ("PYCOLL_COMPRESSION_NATIVE", "2", ["PYCOLL_COMPRESSION_NATIVE=2", "0, 1"]),
])
def test_bad_value_names_the_setting_and_its_range(monkeypatch, name, bad, words):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError) as info:
        ps.read(name)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_values_parse_with_suffixes_and_defaults(monkeypatch):
    monkeypatch.delenv("PYCOLL_SHM_BYTES", raising=False)
    assert ps.read("PYCOLL_SHM_BYTES") == str(16 << 20)
    monkeypatch.setenv("PYCOLL_SHM_BYTES", "8M")
    assert ps.read("PYCOLL_SHM_BYTES") == str(8 << 20)
    monkeypatch.setenv("PYCOLL_CUDA_LL_MAX_KIB", "64")
    assert ps.read("PYCOLL_CUDA_LL_MAX_KIB") == "64"
    with pytest.raises(ValueError, match="no setting named PYCOLL_NOPE"):
        ps.read("PYCOLL_NOPE")


@pytest.mark.parametrize("name,bad,words", [
    ("PYCOLL_P2P_CHANNEL_BYTES", "12", ["PYCOLL_P2P_CHANNEL_BYTES=12", "4096.."]),
    ("PYCOLL_CPU_PEER_READ", "sometimes", ["PYCOLL_CPU_PEER_READ=sometimes", "auto, on, off"]),
    ("PYCOLL_CPU_SHARED_TENSORS", "auto", ["PYCOLL_CPU_SHARED_TENSORS=auto", "on, off"]),
])
def test_group_creation_raises_on_a_bad_cpu_engine_setting(tmp_path, name, bad, words):
    # The CPU engine reads its settings when the group is made: the user sees the setting's name there.
    code = textwrap.dedent(f"""
        import datetime, torch.distributed as dist, pycollectives
        try:
            dist.init_process_group("pycoll", init_method="file://{tmp_path}/store", rank=0, world_size=1,
                                    timeout=datetime.timedelta(seconds=20))
        except Exception as e:
            print(type(e).__name__, e)
        else:
            print("no error")
    """)
    env = dict(os.environ, **{name: bad})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert all(w in out.stdout for w in words), out.stdout + out.stderr


def test_docs_tables_are_generated_from_the_declarations():
    for path, text in ps.generated_files(ROOT).items():
        with open(path) as fh:
            assert fh.read() == text, f"{path} is stale: run python -m pycollectives.settings --write"


def test_package_settings_are_read_through_the_registry(monkeypatch):
    # The package's own settings (pycollectives/package_settings.py): the readers see what the registry reads.
    from pycollectives import hosts
    from pycollectives.hooks import _kernels

    monkeypatch.setenv("PYCOLL_HOSTID", " nodeA ")
    assert ps.read("PYCOLL_HOSTID") == " nodeA " and hosts.host_identity() == "nodeA"
    monkeypatch.delenv("PYCOLL_HOSTID")
    assert ps.read("PYCOLL_HOSTID") == "" and "/" in hosts.host_identity()  # hostname/boot id
    monkeypatch.delenv("PYCOLL_COMPRESSION_NATIVE", raising=False)
    assert ps.read("PYCOLL_COMPRESSION_NATIVE") == "1" and _kernels._native("pack_signs") is not None
    monkeypatch.setenv("PYCOLL_COMPRESSION_NATIVE", "0")
    assert _kernels._native("pack_signs") is None


# A PYCOLL_* variable read outside the registry (csrc/common/setting.cpp, pycollectives/package_settings.py),
# where the product and its tools live. tests/ is not scanned: its PYCOLL_TEST_* variables steer the harness.
_SCANNED = ("pycollectives", "csrc", "examples", "benchmarks", "scripts", "setup.py", "Makefile")
_SOURCE = (".py", ".cpp", ".h", ".cu", ".cuh", ".c", ".cc", ".sh")
# Not settings of the product: they are read where the extension cannot be.
_NOT_SETTINGS = {
    "PYCOLL_FORCE_CPU",  # setup.py, scripts/install.sh: build without CUDA (read before the extension exists)
    "PYCOLL_POOL_KEY",  # benchmarks/regression: the rank pool's key, handed to its own child processes
}
_READS = [
    re.compile(r"getenv\s*\(\s*[\"'](PYCOLL_\w+)"),  # std::getenv, getenv, os.getenv
    re.compile(r"environ\.(?:get|pop|setdefault)\s*\(\s*[\"'](PYCOLL_\w+)"),
    re.compile(r"environ\[\s*[\"'](PYCOLL_\w+)[\"']\s*\](?!\s*=[^=])"),  # not an assignment
    re.compile(r"[\"'](PYCOLL_\w+)[\"']\s+(?:not\s+)?in\s+(?:os\.)?environ"),
    re.compile(r"\$\{?(PYCOLL_\w+)"),  # shell
    re.compile(r"\$\((PYCOLL_\w+)\)"),  # make
]
# Reads by name through the registry: the name must be declared.
_REGISTRY_READS = re.compile(r"(?:read_setting|settings\.read)\(\s*[\"'](PYCOLL_\w+)")


def _env_reads(line):
    if line.lstrip().startswith("del "):
        return []
    return [m.group(1) for r in _READS for m in r.finditer(line)]


@pytest.mark.parametrize("line,names", [
    ('    hid = os.environ.get("PYCOLL_HOSTID", "").strip()', ["PYCOLL_HOSTID"]),
    ("  const char* v = std::getenv(\"PYCOLL_X\");", ["PYCOLL_X"]),
    ("if os.environ['PYCOLL_X'] == '1':", ["PYCOLL_X"]),
    ('if "PYCOLL_X" not in os.environ:', ["PYCOLL_X"]),
    ('x = os.getenv("PYCOLL_X")', ["PYCOLL_X"]),
    ('if [ "${PYCOLL_X:-0}" = 1 ]; then', ["PYCOLL_X"]),
    ('os.environ["PYCOLL_X"] = "off"  # a write', []),
    ('del os.environ["PYCOLL_X"]', []),
    ('env = dict(os.environ, PYCOLL_DEBUG="INFO")', []),
])
def test_the_scan_sees_reads_and_not_writes(line, names):
    assert _env_reads(line) == names


def _scanned_lines():
    for top in _SCANNED:
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, dirs, fs in os.walk(path) if "results" not in os.path.relpath(d, ROOT).split(os.sep)
            for f in fs if f.endswith(_SOURCE) or f == "Makefile"]
        for f in sorted(files):
            with open(f, errors="replace") as fh:
                for i, line in enumerate(fh, 1):
                    yield os.path.relpath(f, ROOT), i, line


def test_no_pycoll_variable_is_read_outside_the_registry():
    outside = [f"{f}:{i}: {line.strip()}" for f, i, line in _scanned_lines()
               if any(name not in _NOT_SETTINGS for name in _env_reads(line))]
    assert not outside, "read through the registry instead (pycollectives.settings.read, common/setting.h):\n" + \
        "\n".join(outside)


def test_reads_by_name_name_declared_settings():
    declared = {s["name"] for s in ps.settings()}
    reads = [(f, i, m.group(1)) for f, i, line in _scanned_lines() for m in _REGISTRY_READS.finditer(line)]
    assert len(reads) >= 3, reads  # the scan finds the reads of hosts.py, config.py and the benchmarks
    unknown = [f"{f}:{i}: {name}" for f, i, name in reads if name not in declared]
    assert not unknown, unknown
