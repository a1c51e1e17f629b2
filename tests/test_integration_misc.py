"""Object collectives, torch.distributed.checkpoint, the two launchers
(torchrun and torch.multiprocessing.spawn) and the examples on the backend
under test, each checked against the same run on Gloo (CPU) or NCCL (GPU).

The launcher tests run the examples (examples/ddp_gpt.py under torchrun,
examples/ddp_cnn.py self-launching with mp.spawn), tiny and on the CPU, with
``--compare gloo``: each trains the same steps on "pycoll" and on "gloo" in
one launch and prints both runs' losses, which must agree.  The other
examples' training functions (FSDP2, pipeline) run inside run_ranks worlds
(no fresh interpreters: cheaper); on GPUs every example is launched for real
with ``--compare nccl``.

Where ranks share a GPU (PYCOLL_GPU_WORLD on one GPU), NCCL refuses them and
the reference is Gloo, which has no send/recv nor reduce_scatter of CUDA
tensors: on CPU copies for the object collectives (they send and receive)
and the checkpoint (FSDP2 reduce-scatters), and ``--compare gloo`` for the
examples that only use all_reduce, broadcast and all_gather (DDP); the other
examples (FSDP2, pipelining, MoE) are compared with pycoll's staged path in a
launch of its own.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import SAME_DEVICE_SETTING, shares_gpus
from integration_util import (
    DEVICES, MLP, assert_close, compare_backends, rank_device, randn, reference,
    require_device, run_tensors, to_cpu,
)
from ranks import BACKEND

WORLD = 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


# --------------------------------------------------------------------------
# object collectives


def _obj(rank, seed, what, big=False):
    """A picklable object whose size depends on the rank (all_gather_object
    pads to the largest) with a tensor, None, nesting and bytes inside."""
    n = (1 << 20) * (rank + 1) if big else 10 + 1000 * rank
    return {
        "from": rank,
        "what": what,
        "seed": seed,
        "text": "π" * (n // 8),
        "blob": bytes((seed + i) % 251 for i in range(256)) * (n // 256 + 1),
        "nested": [rank, (what, None), {"f": 1.5 * rank, "b": rank % 2 == 0}],
        "tensor": randn((3 + rank, 2), seed, what, rank),
    }


def _objects_rank(rank, ws, device, seed):
    dev = rank_device(rank, device)
    coll_dev = dev if device == "cuda" else None
    out = {}
    for big in (False, True):
        tag = "big" if big else "small"
        gathered = [None] * ws
        dist.all_gather_object(gathered, _obj(rank, seed, "all_gather", big))
        out[f"all_gather_{tag}"] = gathered

        objs = ([_obj(1, seed, f"bcast{i}", big) for i in range(3)] + [None, 42]
                if rank == 1 else [None] * 5)
        dist.broadcast_object_list(objs, src=1, device=coll_dev)
        out[f"broadcast_{tag}"] = objs

        # Point to point, both directions.
        for src, dst in ((0, 1), (1, 0)):
            if rank == src:
                dist.send_object_list([_obj(src, seed, f"p2p{dst}", big), "tail"], dst=dst,
                                      device=coll_dev)
            elif rank == dst:
                got = [None, None]
                sender = dist.recv_object_list(got, src=src, device=coll_dev)
                out[f"recv_from{src}_{tag}"] = (sender, got)

        gathered = [None] * ws if rank == 1 else None
        dist.gather_object(_obj(rank, seed, "gather", big), gathered, dst=1)
        out[f"gather_{tag}"] = gathered

        scattered = [None]
        inputs = [_obj(r, seed, "scatter", big) for r in range(ws)] if rank == 0 else None
        dist.scatter_object_list(scattered, inputs, src=0)
        out[f"scatter_{tag}"] = scattered[0]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_object_collectives(device, seed):
    res, ref = compare_backends(_objects_rank, seed, device=device, gloo_on_cuda=False)
    for rank in range(WORLD):
        assert_close(res[rank], ref[rank], what=f"rank {rank} vs reference", exact=True)
    for big in (False, True):
        tag = "big" if big else "small"
        for rank in range(WORLD):
            got = res[rank]
            assert_close(got[f"all_gather_{tag}"],
                         [_obj(r, seed, "all_gather", big) for r in range(WORLD)],
                         what=f"rank {rank} all_gather_object {tag}", exact=True)
            assert_close(got[f"broadcast_{tag}"],
                         [_obj(1, seed, f"bcast{i}", big) for i in range(3)] + [None, 42],
                         what=f"rank {rank} broadcast_object_list {tag}", exact=True)
            src = 1 - rank
            sender, objs = got[f"recv_from{src}_{tag}"]
            assert sender == src
            assert_close(objs, [_obj(src, seed, f"p2p{rank}", big), "tail"],
                         what=f"rank {rank} recv_object_list {tag}", exact=True)
            assert_close(got[f"scatter_{tag}"], _obj(rank, seed, "scatter", big),
                         what=f"rank {rank} scatter_object_list {tag}", exact=True)
        assert res[0][f"gather_{tag}"] is None
        assert_close(res[1][f"gather_{tag}"], [_obj(r, seed, "gather", big) for r in range(WORLD)],
                     what=f"gather_object {tag}", exact=True)


# --------------------------------------------------------------------------
# torch.distributed.checkpoint


def _sharded_mlp(seed, mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = MLP().to(mesh.device_type)
    fully_shard(model.fc1, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _train(model, opt, seed, steps, dev, first=0):
    for step in range(first, first + steps):
        x = randn((8, 16), seed, "x", dist.get_rank(), step, device=dev)
        y = randn((8, 4), seed, "y", dist.get_rank(), step, device=dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _full(model):
    return {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}


def _dcp_rank(rank, ws, device, save_dir, load_dir, seed):
    """Train a sharded (FSDP2) model 2 steps and save model + optimizer +
    extra state with DCP into `save_dir`; then load `load_dir` (written by
    this run or by another backend's) into a fresh sharded model, which
    trains one more step, and into an unsharded one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dev = rank_device(rank, device)
    mesh = init_device_mesh(device, (ws,))
    out = {}
    model = _sharded_mlp(seed, mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, seed, 2, dev)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "extra": {"step": 2, "note": "hi"}},
             checkpoint_id=save_dir)
    out["saved"] = _full(model)
    _train(model, opt, seed, 1, dev, first=2)  # the step after the checkpoint
    out["continued"] = _full(model)
    dist.barrier()  # load_dir may be the checkpoint just written

    # A fresh sharded model (different initial weights) resumes from the checkpoint.
    model2 = _sharded_mlp(seed + 1, mesh)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    msd2, osd2 = get_state_dict(model2, opt2)
    sd = {"model": msd2, "optim": osd2, "extra": {"step": 0, "note": ""}}
    dcp.load(sd, checkpoint_id=load_dir)
    set_state_dict(model2, opt2, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    out["extra"] = sd["extra"]
    out["loaded"] = _full(model2)
    _train(model2, opt2, seed, 1, dev, first=2)
    out["loaded_continued"] = _full(model2)

    # Resharding: every rank loads the whole model into a plain module.
    torch.manual_seed(seed + 2)
    plain = MLP().to(dev)
    psd = plain.state_dict()
    dcp.load({"model": psd}, checkpoint_id=load_dir)
    plain.load_state_dict(psd)
    out["plain"] = to_cpu(dict(plain.named_parameters()))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint(device, seed, tmp_path):
    require_device(device)
    mine, theirs = str(tmp_path / "tested"), str(tmp_path / "reference")
    res = run_tensors(WORLD, _dcp_rank, device, mine, mine, seed, timeout=180)
    # The reference backend trains and saves the same, then reads the
    # checkpoint that the tested backend wrote.
    ref_backend, ref_device = reference(device, WORLD, gloo_on_cuda=False)
    ref = run_tensors(WORLD, _dcp_rank, ref_device, theirs, mine, seed, timeout=180,
                      backend=ref_backend)
    rtol, atol = (1e-4, 1e-5) if device == "cuda" else (1e-5, 1e-6)
    for r in range(WORLD):
        got = res[r]
        assert_close(got["saved"], ref[r]["saved"], rtol, atol, what=f"rank {r} trained vs ref")
        assert_close(got["saved"], res[0]["saved"], what="replicas", exact=True)
        # Loading restores the saved weights exactly, sharded or not.
        assert_close(got["loaded"], got["saved"], what=f"rank {r} loaded (sharded)", exact=True)
        assert_close(got["plain"], got["saved"], what=f"rank {r} loaded (unsharded)", exact=True)
        assert got["extra"] == {"step": 2, "note": "hi"}
        # The optimizer state came back too: the next step is the same.
        assert_close(got["loaded_continued"], got["continued"], what=f"rank {r} step after load",
                     exact=True)
        # The checkpoint is readable by the reference backend, which resumes
        # training from it as the tested backend did.
        assert ref[r]["extra"] == {"step": 2, "note": "hi"}
        assert_close(ref[r]["loaded"], got["saved"], what=f"rank {r} ref loads ours", exact=True)
        assert_close(ref[r]["plain"], got["saved"], what=f"rank {r} ref loads ours unsharded",
                     exact=True)
        assert_close(ref[r]["loaded_continued"], got["continued"], rtol, atol,
                     what=f"rank {r} ref continues ours")
        assert_close(ref[r]["continued"], got["continued"], rtol, atol,
                     what=f"rank {r} continued vs ref")


# --------------------------------------------------------------------------
# launchers: torchrun and torch.multiprocessing.spawn, through the examples


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def _run(cmd, timeout=240, env=None):
    proc = subprocess.Popen(cmd, env={**_env(), **(env or {})}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s:\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _results(out):
    """The examples' machine-readable result lines: RESULT {json}."""
    res = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            res[r["backend"]] = r
    return res


def _check_launch(out, steps, ref_backend="gloo", rtol=1e-5, atol=1e-6):
    res = _results(out)
    assert set(res) == {BACKEND, ref_backend}, out[-3000:]
    return _check_same_training(res[BACKEND], res[ref_backend], steps, rtol, atol)


def _check_same_training(mine, ref, steps, rtol, atol):
    """Two runs' result lines: the same world, steps, losses and parameter norm."""
    assert mine["world_size"] == ref["world_size"] == WORLD
    assert len(mine["losses"]) == len(ref["losses"]) == steps
    torch.testing.assert_close(torch.tensor(mine["losses"]), torch.tensor(ref["losses"]),
                               rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.tensor(mine["param_norm"]), torch.tensor(ref["param_norm"]),
                               rtol=rtol, atol=atol)
    assert mine["ms_per_step"] > 0 and ref["ms_per_step"] > 0
    return mine, ref


@pytest.mark.pycoll_only  # compares "pycoll" with "gloo" in one launch
def test_torchrun_ddp_gpt():
    steps = 4
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={WORLD}", os.path.join(EXAMPLES, "ddp_gpt.py"),
                "--device", "cpu", "--backend", BACKEND, "--compare", "gloo",
                "--steps", str(steps), "--warmup", "1", "--accum", "2",
                "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
                "--batch", "2", "--result-line"])
    _check_launch(out, steps)
    assert "ms/step" in out


@pytest.mark.pycoll_only
def test_mp_spawn_ddp_cnn(tmp_path):
    steps = 4
    out = _run([sys.executable, os.path.join(EXAMPLES, "ddp_cnn.py"), "--device", "cpu",
                "--nproc", str(WORLD), "--backend", BACKEND, "--compare", "gloo",
                "--epochs", "1", "--steps", str(steps), "--warmup", "1", "--batch", "8",
                "--width", "8", "--samples", "128", "--result-line", "--profile", str(tmp_path)])
    mine, ref = _check_launch(out, steps)
    assert mine["test_accuracy"] == ref["test_accuracy"]
    assert "ms/step" in out and "test accuracy" in out
    # --profile: rank 0's table per backend, and every rank's trace.
    for b in (BACKEND, "gloo"):
        assert f"[{b}] rank 0, whole run, by self_cpu_time_total" in out, out[-3000:]
        for r in range(WORLD):
            trace = json.loads((tmp_path / f"{b}-rank{r}.json").read_text())
            assert trace["traceEvents"], (b, r)


# --------------------------------------------------------------------------
# the examples' training functions, in run_ranks worlds

TINY_GPT = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
            "--steps", "4", "--warmup", "1"]


def _example_rank(rank, ws, device, name, argv):
    import importlib

    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    mod = importlib.import_module(name)
    from common import Run

    args = mod.parse_args(["--device", device] + argv)
    dev = rank_device(rank, device)
    torch.manual_seed(args.seed)
    run = Run(rank, ws, rank, dev, dist.get_backend(), dist.group.WORLD)
    return mod.train(args, run)


TINY_CNN = ["--epochs", "1", "--steps", "4", "--warmup", "1", "--batch", "8", "--width", "8", "--samples", "128"]

EXAMPLE_CASES = {
    "fsdp_gpt": ("fsdp_gpt", TINY_GPT),
    "pipeline_gpt-1f1b": ("pipeline_gpt", TINY_GPT + ["--schedule", "1f1b"]),
    "pipeline_gpt-interleaved": ("pipeline_gpt", TINY_GPT[:-4] + ["--schedule", "interleaved",
                                                                  "--layers", "4", "--steps", "4",
                                                                  "--warmup", "1"]),
    "ddp_gpt-powersgd": ("ddp_gpt", TINY_GPT + ["--hook", "powersgd", "--accum", "2"]),
    # Uneven all_to_all_single token routing (top-2, capacity drops) forward and backward.
    "moe_gpt": ("moe_gpt", TINY_GPT + ["--capacity-factor", "0.75"]),
    "ddp_cnn-powersgd": ("ddp_cnn", TINY_CNN + ["--hook", "powersgd", "--powersgd-rank", "1"]),
    "ddp_cnn-signsgd": ("ddp_cnn", TINY_CNN + ["--hook", "signsgd"]),
}


@pytest.mark.parametrize("case", list(EXAMPLE_CASES))
def test_example_train(case):
    name, argv = EXAMPLE_CASES[case]
    res, ref = compare_backends(_example_rank, name, argv, device="cpu")
    rtol = 1e-5
    for r in range(WORLD):
        assert len(res[r]["losses"]) == 4
        assert_close(res[r]["losses"], ref[r]["losses"], rtol, 1e-6, what=f"rank {r} losses vs gloo")
        assert_close(res[r]["param_norm"], ref[r]["param_norm"], rtol, 1e-6,
                     what=f"rank {r} param norm vs gloo")
        assert res[r]["ms_per_step"] > 0
        if name == "ddp_cnn" and "--hook" in argv:  # the hook's counted payload: compressed, below the plain all_reduce's
            assert 0 < res[r]["hook_bytes_per_step"] < res[r]["plain_bytes_per_step"] / 2, res[r]
    assert res[0]["losses"] == res[1]["losses"]  # already averaged over ranks


GPU_EXAMPLE_ARGS = ["--layers", "2", "--dim", "256", "--heads", "4", "--seq", "128",
                    "--vocab", "1024", "--steps", "6", "--warmup", "2"]


# Examples whose collectives Gloo does not run on CUDA tensors (reduce_scatter, send/recv,
# all_to_all): where ranks share a GPU, NCCL refuses them too, so the reference is pycoll's staged
# path (host memory through the CPU engine, itself checked against Gloo) in a launch of its own.
NO_GLOO_CUDA = {"fsdp_gpt.py", "pipeline_gpt.py", "moe_gpt.py"}


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
@pytest.mark.parametrize("example,extra", [
    ("ddp_gpt.py", ["--accum", "2"]),
    ("ddp_gpt.py", ["--hook", "fp16"]),
    ("ddp_gpt.py", ["--hook", "powersgd"]),
    ("fsdp_gpt.py", []),
    ("pipeline_gpt.py", []),
    ("moe_gpt.py", []),
    ("ddp_cnn.py", None),
], ids=["ddp_gpt", "ddp_gpt-fp16", "ddp_gpt-powersgd", "fsdp_gpt", "pipeline_gpt", "moe_gpt", "ddp_cnn"])
def test_example_gpu(example, extra):
    require_device("cuda", WORLD)
    # NCCL refuses ranks that share a GPU: there the DDP examples compare with Gloo on CUDA tensors.
    ref_backend = "gloo" if shares_gpus(WORLD) else "nccl"
    if extra is None:  # the CNN
        args = ["--epochs", "1", "--steps", "6", "--warmup", "2", "--samples", "2048"]
        steps = 6
    else:
        args = GPU_EXAMPLE_ARGS + extra
        steps = 6
    cmd = [sys.executable, os.path.join(EXAMPLES, example), "--device", "cuda", "--nproc", str(WORLD),
           "--backend", BACKEND, "--result-line"] + args
    # bf16 autocast / bf16 FSDP parameters: the two runs may round differently.
    if shares_gpus(WORLD) and example in NO_GLOO_CUDA:
        mine = _results(_run(cmd))[BACKEND]
        ref = _results(_run(cmd, env={SAME_DEVICE_SETTING: "staged"}))[BACKEND]
        _check_same_training(mine, ref, steps, rtol=2e-2, atol=1e-3)
    else:
        _check_launch(_run(cmd + ["--compare", ref_backend]), steps, ref_backend=ref_backend, rtol=2e-2, atol=1e-3)
