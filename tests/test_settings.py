"""The settings registry (csrc/common/setting.h, pycollectives.settings): every PYCOLL_* variable
declared once; bad values raise a ValueError naming the setting and its range; the README's and
docs/settings.md's tables are what the declarations say."""

import os
import subprocess
import sys
import textwrap

import pytest

import pycollectives.settings as ps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER = {"PYCOLL_ALGO", "PYCOLL_CPU_THREADS", "PYCOLL_DEBUG", "PYCOLL_SHM_BYTES", "PYCOLL_P2P_CHANNEL_BYTES", "PYCOLL_COST_MODEL",
        "PYCOLL_INTER_HOST_BACKEND", "PYCOLL_CHECK_ACROSS_HOSTS", "PYCOLL_COALESCE_P2P",
        "PYCOLL_CPU_PEER_READ", "PYCOLL_CPU_SHARED_TENSORS", "PYCOLL_CPU_ALLOCATOR", "PYCOLL_SHARED_CPU_MIN_BYTES",
        "PYCOLL_SHARED_CPU_CACHE_BYTES"}


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


def test_readme_and_docs_tables_are_generated_from_the_declarations():
    for path, text in ps.generated_files(ROOT).items():
        with open(path) as fh:
            assert fh.read() == text, f"{path} is stale: run python -m pycollectives.settings --write"
