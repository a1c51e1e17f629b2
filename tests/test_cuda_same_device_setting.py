"""PYCOLL_CUDA_SAME_DEVICE (csrc/cuda/cuda_settings.cpp): what ranks that share a GPU run, declared in
the settings registry in every build (CPU-only ones too), and described in docs/using-gpus.md. The
behaviour itself needs a GPU (tests/test_gpu_*.py with PYCOLL_GPU_WORLD on one GPU)."""

import os
import subprocess
import sys
import textwrap

import pycollectives.settings as ps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "PYCOLL_CUDA_SAME_DEVICE"


def test_declared_in_the_registry():
    found = [s for s in ps.settings() if s["name"] == NAME]
    assert len(found) == 1, [s["name"] for s in ps.settings()]
    s = found[0]
    assert s["default"] == "auto", s
    assert s["range"] == "auto, staged, kernels, events", s
    assert s["scope"] == "cuda engine", s
    assert s["ranks_agree"] is True, s
    assert s["audience"] == "user", s
    assert "docs/using-gpus.md" in s["doc"], s


def test_read_gives_the_default_and_the_value_set(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert ps.read(NAME) == "auto"
    monkeypatch.setenv(NAME, "staged")
    assert ps.read(NAME) == "staged"
    monkeypatch.setenv(NAME, "kernels")
    assert ps.read(NAME) == "kernels"
    monkeypatch.setenv(NAME, "events")
    assert ps.read(NAME) == "events"


def test_the_size_switch_is_declared():
    found = [s for s in ps.settings() if s["name"] == "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB"]
    assert len(found) == 1
    s = found[0]
    assert s["default"] == "-1 (measured)" and s["ranks_agree"] is True and s["scope"] == "cuda engine", s
    assert "docs/using-gpus.md" in s["doc"], s


def test_documented_with_mps_and_the_cta_caps():
    with open(os.path.join(ROOT, "docs", "using-gpus.md")) as fh:
        text = fh.read()
    for words in (NAME, "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "PYCOLL_CUDA_MAX_BLOCKS", "PYCOLL_CUDA_P2P_MAX_BLOCKS",
                  "local_rank % torch.cuda.device_count()"):
        assert words in text, words
    # Every setting the section names is declared.
    names = {s["name"] for s in ps.settings()}
    for n in ("PYCOLL_CUDA_MAX_BLOCKS", "PYCOLL_CUDA_SMALL_MAX_BLOCKS", "PYCOLL_CUDA_TWO_SHOT_BLOCKS",
              "PYCOLL_CUDA_P2P_MAX_BLOCKS"):
        assert n in names and n in text, n


def test_gpu_harness_without_gpus_asks_for_none(tmp_path):
    # tests/gpu_collectives_util.py where no GPU is visible: the GPU tests skip, and a set
    # PYCOLL_GPU_WORLD turns nothing on (the same-device setting stays unset).
    code = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        import torch
        import gpu_collectives_util as g
        assert g.GPUS == 0 and not g.SHARE_GPUS, (g.GPUS, g.SHARE_GPUS)
        assert g.gpus_missing(2) == "needs CUDA GPUs, none visible", g.gpus_missing(2)
        assert "PYCOLL_CUDA_SAME_DEVICE" not in os.environ
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != NAME}
    env.update(CUDA_VISIBLE_DEVICES="", PYCOLL_GPU_WORLD="2")
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "tests")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
