"""signSGD and PowerSGD hooks, compressed_all_reduce and GradientBucketer on 2 real ranks.

Every rank can make every rank's input (seeded by rank), so each rank checks
its result against a plain-torch simulation of the whole algorithm over all
ranks, written here independently of the hooks. DDP runs train a small MLP
with each hook, over the backend under test and over a Gloo subgroup, and
compare with the uncompressed run after the same steps.
"""
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import setup_device, shares_gpus
from ranks import BACKEND, IS_GLOO, run_ranks

WORLD = 2


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------
# plain-torch simulations of the algorithms over all ranks


def sim_signsgd(inputs, residuals, sizes):
    """inputs[w], residuals[w]: flat tensors of rank w, made of tensors of `sizes` elements.

    Returns (result, new residuals)."""
    ps = [g + e for g, e in zip(inputs, residuals)]
    # mean |p| per tensor, summed in float64 and rounded to float32 as the hook does (so that a sign
    # decided by the last bit agrees too)
    scales = [torch.cat([torch.full((k,), float((torch.linalg.vector_norm(seg, ord=1, dtype=torch.float64) / k)
                                                .to(torch.float32))) for seg, k in zip(p.split(sizes), sizes)])
              for p in ps]
    signs = [torch.where(p < 0, -1.0, 1.0) for p in ps]
    new_res = [p - s * sg for p, s, sg in zip(ps, scales, signs)]
    vote = torch.sign(torch.stack(signs).sum(0))
    return vote * torch.stack(scales).mean(0), new_res


def gram_schmidt(m, eps=1e-8):
    m = m.clone()
    for i in range(m.shape[-1]):
        norm = m[..., i : i + 1].norm(dim=-2, keepdim=True)
        m[..., i : i + 1] /= norm + eps
        for j in range(i + 1, m.shape[-1]):
            m[..., j : j + 1] -= (m[..., i : i + 1] * m[..., j : j + 1]).sum(-2, keepdim=True) * m[..., i : i + 1]
    return m


def sim_powersgd_matrix(ms, q):
    """One PowerSGD step of one matrix: ms[w] = G_w + E_w (n x m), q (m x r) shared.

    Returns (average approximation, new residual per rank, new q)."""
    p = gram_schmidt(sum(mw @ q for mw in ms))
    qs = [mw.t() @ p for mw in ms]
    q_avg = sum(qs) / len(ms)
    return p @ q_avg.t(), [mw - p @ qw.t() for mw, qw in zip(ms, qs)], q_avg


def _inputs(seed, step, rank, shapes):
    g = _gen(seed * 1000 + step * 10 + rank)
    return [torch.randn(s, generator=g) for s in shapes]


# ---------------------------------------------------------------------------
# rank functions (module level: pickled by reference)


def _signsgd_steps(rank, world, seed, sizes, steps, per_tensor_scale):
    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import SignSGDState

    state = SignSGDState(per_tensor_scale=per_tensor_scale)
    n = sum(sizes)
    residuals = [torch.zeros(n) for _ in range(world)]
    outs = []
    for step in range(steps):
        inputs = [_inputs(seed, step, w, [(n,)])[0] for w in range(world)]
        want, residuals = sim_signsgd(inputs, residuals, sizes if per_tensor_scale else [n])
        tensors = [t.clone() for t in inputs[rank].split(sizes)]
        arg = tensors[0] if len(sizes) == 1 else tensors
        assert compressed_all_reduce(arg, "signsgd", state) is arg
        got = torch.cat(tensors)
        # the vote is bit-exact; a scale may differ in the last bits of its sum
        assert torch.equal(torch.sign(got), torch.sign(want)), f"step {step}: votes differ"
        assert torch.allclose(got, want, rtol=1e-5, atol=0), f"step {step}: scale"
        (res,) = state.residuals.values()
        assert torch.allclose(res, residuals[rank], rtol=1e-5, atol=1e-6), f"step {step}: residual"
        outs.append(got)
    return torch.stack(outs).numpy(), state.stats.as_dict()  # numpy: tensors do not pickle across exits


SHAPES = [(32, 16), (12, 8, 3, 3), (32, 16), (16,), (3, 5), (40, 24)]


def _powersgd_steps(rank, world, seed, steps, rank_r):
    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import PowerSGDState, powersgd_bytes
    from pycollectives.hooks import _kernels as K

    state = PowerSGDState(start_powerSGD_iter=0, matrix_approximation_rank=rank_r)
    # The hook draws each group's first Q from its seeded generator, in the
    # order the groups first appear: (32,16) x2, (12,72), (40,24).
    rng = torch.Generator().manual_seed(0)
    groups = {(32, 16): [0, 2], (12, 72): [1], (40, 24): [5]}
    qs = {}
    for (n, m), idx in groups.items():
        q = torch.randn(len(idx), m, rank_r, generator=rng)
        K.ref_batched_orthogonalize_(q, 1e-8)
        qs[(n, m)] = [q[b] for b in range(len(idx))]
    errs = {(nm, b): [torch.zeros(nm) for _ in range(world)] for nm, idx in groups.items() for b in range(len(idx))}
    for step in range(steps):
        inputs = [_inputs(seed, step, w, SHAPES) for w in range(world)]
        tensors = [t.clone() for t in inputs[rank]]
        compressed_all_reduce(tensors, "powersgd", state)
        for (n, m), idx in groups.items():
            for b, i in enumerate(idx):
                ms = [inputs[w][i].reshape(n, m) + errs[((n, m), b)][w] for w in range(world)]
                want, errs[((n, m), b)], qs[(n, m)][b] = sim_powersgd_matrix(ms, qs[(n, m)][b])
                got = tensors[i].reshape(n, m)
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), f"step {step} tensor {i}"
                assert torch.allclose(state.residual(("default", i)), errs[((n, m), b)][rank], rtol=1e-4,
                                      atol=1e-5), f"step {step} residual {i}"
        for i in (3, 4):  # uncompressed: the exact average
            want = sum(inputs[w][i] for w in range(world)) / world
            assert torch.allclose(tensors[i], want, rtol=1e-6, atol=1e-7)
    analytic = powersgd_bytes(SHAPES, rank=rank_r)
    return [t.numpy() for t in tensors], state.stats.as_dict(), analytic


def _powersgd_low_rank(rank, world, seed, r):
    """Matrices that share an r-dimensional column space: one step reconstructs their mean exactly."""
    import pycollectives  # noqa: F401
    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import PowerSGDState

    g = _gen(seed)
    u = torch.linalg.qr(torch.randn(96, r, generator=g, dtype=torch.float64))[0]
    vs = [torch.randn(80, r, generator=g, dtype=torch.float64) for _ in range(world)]
    m = u @ vs[rank].t()
    want = u @ (sum(vs) / world).t()
    state = PowerSGDState(start_powerSGD_iter=0, matrix_approximation_rank=r, random_seed=seed,
                          orthogonalization_epsilon=0.0)
    out = compressed_all_reduce(m.clone(), "powersgd", state)
    (lay,) = state._layouts.values()
    p = lay.groups[0].P[0]
    return {
        "err": float((out - want).norm() / want.norm()),
        "residual": float(state.residual(("default", 0)).norm()),
        "orth": float((p.t() @ p - torch.eye(r, dtype=torch.float64)).abs().max()),
    }


# --- DDP training ---------------------------------------------------------


def _make_data(seed, rank, world, steps, batch=32, d_in=24, d_out=6):
    """Teacher regression task: each rank gets its own shard of every step's batch."""
    g = _gen(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(d_in, 48), torch.nn.Tanh(), torch.nn.Linear(48, d_out))
    for p in teacher.parameters():
        p.data = torch.randn(p.shape, generator=g) * 0.3
    xs = torch.randn(steps, world, batch, d_in, generator=g)
    with torch.no_grad():
        ys = teacher(xs)
    return xs[:, rank], ys[:, rank], xs.reshape(-1, d_in)[: 512], ys.reshape(-1, d_out)[: 512]


def _student(seed, d_in=24, d_out=6):
    torch.manual_seed(seed + 1)
    return torch.nn.Sequential(torch.nn.Linear(d_in, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, d_out))


def _train(method, group, seed, rank, world, steps, lr=0.05):
    from pycollectives.hooks import PowerSGDState, SignSGDState, powersgd_hook, signsgd_hook

    xs, ys, x_eval, y_eval = _make_data(seed, rank, world, steps)
    model = _student(seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    state = None
    if method == "signsgd":
        state = SignSGDState(process_group=group)
        ddp.register_comm_hook(state, signsgd_hook)
    elif method == "powersgd":
        state = PowerSGDState(start_powerSGD_iter=0, process_group=group, matrix_approximation_rank=2)
        ddp.register_comm_hook(state, powersgd_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs[step]), ys[step]).backward()
        opt.step()
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(x_eval), y_eval))
        loss0 = float(torch.nn.functional.mse_loss(_student(seed)(x_eval), y_eval))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return {"loss": loss, "loss0": loss0, "params": params,
            "stats": state.stats.as_dict() if state is not None else None}


def _ddp_all_methods(rank, world, seed, steps, with_gloo):
    groups = {BACKEND: None}
    if with_gloo:
        groups["gloo"] = dist.new_group(backend="gloo")
    out = {}
    for name, group in groups.items():
        for method in ("none", "signsgd", "powersgd"):
            out[(name, method)] = _train(method, group, seed, rank, world, steps)
    return out


# ---------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("sizes,per_tensor_scale", [([1000], True), ([640, 7, 353], True), ([640, 7, 353], False)])
def test_signsgd_matches_simulation_and_carries_error_feedback(sizes, per_tensor_scale, seed):
    res = run_ranks(WORLD, _signsgd_steps, seed, sizes, 3, per_tensor_scale)
    assert np.array_equal(res[0][0], res[1][0]), "ranks disagree"
    stats = res[0][1]
    n = sum(sizes)
    scales = len(sizes) if per_tensor_scale else 1
    assert stats["calls"] == 3
    assert stats["sent_bytes"] == 3 * (math.ceil(n / 32) + scales) * 4  # sign words + the scales
    assert stats["raw_bytes"] == 3 * n * 4


def test_powersgd_matches_simulation_and_carries_state(seed):
    res = run_ranks(WORLD, _powersgd_steps, seed, 3, 2)
    for a, b in zip(res[0][0], res[1][0]):
        assert np.array_equal(a, b), "ranks disagree"
    stats, analytic = res[0][1], res[0][2]
    assert stats["calls"] == 3
    assert stats["sent_bytes"] == 3 * analytic["sent"]
    assert stats["raw_bytes"] == 3 * analytic["raw"]


@pytest.mark.parametrize("r", [1, 3])
def test_powersgd_reconstructs_rank_r_exactly(r, seed):
    for out in run_ranks(WORLD, _powersgd_low_rank, seed, r):
        assert out["err"] < 1e-10, out
        assert out["residual"] < 1e-10, out  # nothing left for error feedback
        assert out["orth"] < 1e-12, out


# Stated tolerance: the eval loss after STEPS steps of each compressed run is
# at most LOSS_TOLERANCE times that of the uncompressed run (same data, same
# initial weights, SGD with momentum). Measured over seeds 1..11: signSGD
# 1.10-1.38x, PowerSGD (r=2) 1.09-1.26x; all runs cut the initial loss by
# about 8x. Over 45 more session seeds (2026-11-29, after seed 179091095 gave
# signSGD 1.64x and failed a CI run at 1.6): signSGD 1.07-1.67x (3 above 1.45),
# PowerSGD 1.07-1.23x. signSGD's bound is 2.0 for that tail.
STEPS = 60
LOSS_TOLERANCE = {"signsgd": 2.0, "powersgd": 1.5}


def test_ddp_trains_with_each_hook(seed):
    res = run_ranks(WORLD, _ddp_all_methods, seed, STEPS, not IS_GLOO, timeout=240)
    r0, r1 = res
    for key in r0:
        # replicas identical: bitwise, every backend and hook
        assert np.array_equal(r0[key]["params"], r1[key]["params"]), f"{key}: replicas differ"
    for backend in {k[0] for k in r0}:
        base = r0[(backend, "none")]
        assert base["loss"] < 0.25 * base["loss0"], base  # the task is learnt in STEPS steps
        for method, tol in LOSS_TOLERANCE.items():
            got = r0[(backend, method)]
            assert got["loss"] < 0.25 * got["loss0"], (backend, method, got["loss"], got["loss0"])
            assert got["loss"] <= tol * base["loss"], (backend, method, got["loss"], base["loss"])
    # the same hooks give the same training over pycoll and gloo (same math, same order)
    if not IS_GLOO:
        for method in ("none", "signsgd", "powersgd"):
            a, b = r0[(BACKEND, method)]["params"], r0[("gloo", method)]["params"]
            assert np.allclose(a, b, rtol=1e-4, atol=1e-5), method


# --- bytes ------------------------------------------------------------------


def _bytes_rank(rank, world):
    import pycollectives
    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import PowerSGDState, SignSGDState, powersgd_bytes

    out = {}
    n = 1 << 20  # a 4 MiB float32 bucket
    pycollectives.reset_stats()
    compressed_all_reduce(torch.randn(n), "signsgd", SignSGDState())
    out["signsgd"] = pycollectives.stats()
    t = torch.randn(n)
    pycollectives.reset_stats()
    dist.all_reduce(t)
    out["plain"] = pycollectives.stats()
    shapes = [(1024, 1024), (1024,), (256, 512), (10, 10)]
    pycollectives.reset_stats()
    compressed_all_reduce([torch.randn(s) for s in shapes], "powersgd", PowerSGDState(start_powerSGD_iter=0, matrix_approximation_rank=4))
    out["powersgd"] = pycollectives.stats()
    out["powersgd_analytic"] = powersgd_bytes(shapes, rank=4)
    return out


@pytest.mark.pycoll_only
def test_byte_counters_show_the_savings():
    out = run_ranks(WORLD, _bytes_rank)[0]
    plain = out["plain"]["allreduce"]["bytes"]
    sign = out["signsgd"]["allgather"]["bytes"]
    assert plain == 4 << 20
    assert sign == ((1 << 20) // 32 + 1) * 4
    assert plain / sign > 31.9  # 32x fewer bytes than a float32 all_reduce
    assert "allreduce" not in out["signsgd"]
    an = out["powersgd_analytic"]
    assert out["powersgd"]["allreduce"] == {"calls": 2, "bytes": an["sent"]}  # one call for P, one for Q
    # 1024x1024 at rank 4: 128x; 256x512: 42.7x; the 1-D and 10x10 tensors go uncompressed
    assert an["sent"] == 4 * (4 * 2048 + 1024 + 4 * 768 + 100)
    assert an["ratio"] == pytest.approx((1024 * 1024 + 1024 + 256 * 512 + 100) / (4 * 2048 + 1024 + 4 * 768 + 100))


# --- GradientBucketer ---------------------------------------------------------


def _bucketer_rank(rank, world, seed):
    from pycollectives.bucketing import GradientBucketer
    from pycollectives.hooks import PowerSGDState, powersgd_hook

    out = {}
    torch.manual_seed(seed + rank)  # different initial weights: the bucketer must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    bucketer = GradientBucketer(model, bucket_mb=600 * 4 / (1 << 20))  # about 600 floats per bucket
    out["sizes"] = bucketer.bucket_sizes()
    x = torch.randn(8, 16, generator=_gen(seed + 100 + rank))
    model(x).square().mean().backward()
    out["launched_in_backward"] = bucketer._next
    local = [p.grad.clone() for p in model.parameters()]
    bucketer.wait()
    for g in local:
        dist.all_reduce(g)
        g /= world
    out["plain_ok"] = all(torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7) for p, g in zip(model.parameters(), local))

    # no_sync accumulates locally; the next backward launches the sum
    model.zero_grad()
    with bucketer.no_sync():
        model(x).square().mean().backward()
    model(x).square().mean().backward()
    local = [p.grad.clone() for p in model.parameters()]
    bucketer.wait()
    for g in local:
        dist.all_reduce(g)
        g /= world
    out["no_sync_ok"] = all(torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7) for p, g in zip(model.parameters(), local))

    # with the PowerSGD hook: trains, replicas stay identical
    b2 = GradientBucketer(model, bucket_mb=600 * 4 / (1 << 20), hook=powersgd_hook,
                          state=PowerSGDState(start_powerSGD_iter=0, matrix_approximation_rank=2))
    bucketer.remove()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x_eval = torch.randn(256, 16, generator=_gen(seed * 3))

    def eval_loss():
        with torch.no_grad():
            return float((model(x_eval) - x_eval[:, :4]).square().mean())

    out["loss_before"] = eval_loss()
    for step in range(30):
        opt.zero_grad()
        xb = torch.randn(16, 16, generator=_gen(seed * 7 + step * 2 + rank))
        (model(xb) - xb[:, :4]).square().mean().backward()
        b2.wait()
        opt.step()
    out["loss_after"] = eval_loss()
    out["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return out


def test_gradient_bucketer(seed):
    r0, r1 = run_ranks(WORLD, _bucketer_rank, seed)
    assert len(r0["sizes"]) >= 3 and sum(r0["sizes"]) == 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4
    assert r0["launched_in_backward"] == len(r0["sizes"])  # every bucket launched during backward
    assert r0["plain_ok"] and r1["plain_ok"]
    assert r0["no_sync_ok"] and r1["no_sync_ok"]
    assert np.array_equal(r0["params"], r1["params"])
    assert r0["loss_after"] < 0.5 * r0["loss_before"], (r0["loss_before"], r0["loss_after"])


# --- bad input -----------------------------------------------------------------


def test_bad_input_without_ranks():
    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import PowerSGDState, SignSGDState

    with pytest.raises(ValueError, match="matrix_approximation_rank must be >= 1"):
        PowerSGDState(matrix_approximation_rank=0)
    with pytest.raises(ValueError, match=">= 1"):
        PowerSGDState(matrix_approximation_rank=-2)
    with pytest.raises(TypeError, match="int"):
        PowerSGDState(matrix_approximation_rank=2.5)
    with pytest.raises(ValueError, match="scaled"):
        SignSGDState(error_feedback=True, scaled=False)
    with pytest.raises(ValueError, match="method"):
        compressed_all_reduce(torch.ones(4), "topk")
    with pytest.raises(TypeError, match="PowerSGDState"):
        compressed_all_reduce(torch.ones(4), "powersgd", SignSGDState())
    with pytest.raises(TypeError, match="int64"):
        compressed_all_reduce(torch.ones(4, dtype=torch.int64), "signsgd")
    with pytest.raises(TypeError, match="int32"):
        compressed_all_reduce([torch.ones(4, 4), torch.ones(4, dtype=torch.int32)], "powersgd")


def test_unsupported_backend_device_pairs(monkeypatch):
    from pycollectives.hooks import _common

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    cases = {
        "nccl": (torch.device("cpu"), "cannot carry cpu tensors"),
        "gloo": (torch.device("cuda", 0), "cannot carry cuda tensors"),
        "mpi": (torch.device("cpu"), "not supported"),
        "cpu:mpi,cuda:nccl": (torch.device("cpu"), "'mpi' is not supported"),
    }
    for backend, (device, msg) in cases.items():
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        with pytest.raises(ValueError, match=msg):
            _common.check_backend("signsgd_hook", None, device)
    for backend, device in [("cpu:gloo,cuda:nccl", "cpu"), ("cpu:gloo,cuda:nccl", "cuda"), ("pycoll", "cpu"),
                            ("pycoll", "cuda"), ("gloo", "cpu"), ("nccl", "cuda")]:
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        _common.check_backend("signsgd_hook", None, torch.device(device))


def _bad_input_rank(rank, world):
    from pycollectives.hooks import PowerSGDState, SignSGDState, powersgd_hook, signsgd_hook
    from pycollectives.hooks._common import Bucket

    errors = {}
    ints = torch.ones(8, dtype=torch.int32)
    for name, hook, state in [("signsgd", signsgd_hook, SignSGDState()), ("powersgd", powersgd_hook, PowerSGDState())]:
        try:
            hook(state, Bucket(0, ints, [ints], keys=[0]))
        except Exception as e:  # noqa: BLE001
            errors[name] = (type(e).__name__, str(e))
        try:
            hook(None, Bucket(0, torch.ones(4), [torch.ones(4)], keys=[0]))
        except Exception as e:  # noqa: BLE001
            errors[name + "_state"] = (type(e).__name__, str(e))
    return errors


def test_bad_input_in_ranks():
    errors = run_ranks(WORLD, _bad_input_rank)[0]
    assert errors["signsgd"][0] == "TypeError" and "int32" in errors["signsgd"][1]
    assert errors["powersgd"][0] == "TypeError" and "int32" in errors["powersgd"][1]
    assert errors["signsgd_state"][0] == "TypeError" and "SignSGDState" in errors["signsgd_state"][1]
    assert errors["powersgd_state"][0] == "TypeError" and "PowerSGDState" in errors["powersgd_state"][1]


# --- GPU -----------------------------------------------------------------------


def _ddp_gpu_rank(rank, world, seed):
    from pycollectives.hooks import PowerSGDState, SignSGDState, powersgd_hook, signsgd_hook

    dev = setup_device(rank)
    # NCCL refuses ranks that share a GPU (and the hooks refuse Gloo for CUDA tensors): there, pycoll only.
    groups = {} if shares_gpus(world) else {"nccl": dist.new_group(backend="nccl")}
    if BACKEND == "pycoll":
        groups["pycoll"] = None  # the default group: pycoll serves CUDA tensors too
    out = {}
    for backend, group in groups.items():
        for name, hook, state in [("signsgd", signsgd_hook, SignSGDState(process_group=group)),
                                  ("powersgd", powersgd_hook,
                                   PowerSGDState(start_powerSGD_iter=0, process_group=group, matrix_approximation_rank=2))]:
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev], process_group=group)
            ddp.register_comm_hook(state, hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            gen = torch.Generator("cuda").manual_seed(seed + rank)
            for _ in range(10):
                opt.zero_grad()
                ddp(torch.randn(32, 64, device="cuda", generator=gen)).square().mean().backward()
                opt.step()
            out[(backend, name)] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
    return out


@pytest.mark.gpu
@pytest.mark.shares_gpus
def test_ddp_hooks_on_gpus(seed):
    """DDP with each hook on 2 GPUs over NCCL (and pycoll when it is the backend under test); on
    ranks sharing a GPU (PYCOLL_GPU_WORLD on one GPU) over pycoll only."""
    if IS_GLOO and shares_gpus(WORLD):
        pytest.skip("ranks sharing a GPU: NCCL refuses them and the hooks refuse Gloo for CUDA tensors")
    r0, r1 = run_ranks(WORLD, _ddp_gpu_rank, seed, timeout=300)
    assert r0 and r0.keys() == r1.keys(), (sorted(r0), sorted(r1))
    for k in r0:
        assert np.isfinite(r0[k]).all()
        assert np.array_equal(r0[k], r1[k]), f"{k}: replicas differ"


def test_powersgd_state_has_torchs_signature():
    """Switching from torch's PowerSGD hook is a change of import: the same parameter names, order and
    defaults (ours may add keyword-only extras, and give process_group a default)."""
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

    import pycollectives
    from pycollectives.hooks import PowerSGDState

    ours = inspect.signature(PowerSGDState.__init__).parameters
    theirs = inspect.signature(torch_powersgd.PowerSGDState.__init__).parameters
    positional = [n for n, p in ours.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == list(theirs), (positional, list(theirs))
    for name, p in theirs.items():
        if name in ("self", "process_group"):
            continue
        assert ours[name].default == p.default, (name, ours[name].default, p.default)
    extras = [n for n in ours if n not in theirs]
    assert all(ours[n].kind == inspect.Parameter.KEYWORD_ONLY for n in extras), extras
    assert pycollectives.powerSGD_hook is pycollectives.powersgd_hook
    assert list(inspect.signature(pycollectives.powerSGD_hook).parameters) == \
        list(inspect.signature(torch_powersgd.powerSGD_hook).parameters)
    state = PowerSGDState(None, 4, 10)  # torch's positional order: group, rank, start iteration
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (4, 10)
    with pytest.raises(ValueError, match="start_iter"):
        PowerSGDState(start_powerSGD_iter=5, start_iter=3)


def _powersgd_start_and_stats_rank(rank, world):
    import logging

    from pycollectives.compression import compressed_all_reduce
    from pycollectives.hooks import PowerSGDState

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("pycollectives.hooks.powersgd")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    state = PowerSGDState(None, 2, 2, compression_stats_logging_frequency=2)
    rates = []
    for step in range(4):
        g = torch.full((64, 48), float(rank + step))
        out = compressed_all_reduce(g, "powersgd", state)
        if step < 2:  # plain averaging before start_powerSGD_iter: exact
            assert torch.allclose(out, torch.full((64, 48), (world - 1) / 2 + step)), out[0, :3]
        rates.append(state.compression_stats()[0])
    log.removeHandler(handler)
    return rates, [r.getMessage() for r in records]


def test_powersgd_start_iter_and_compression_stats():
    for rates, messages in run_ranks(2, _powersgd_start_and_stats_rank):
        assert rates[0] == rates[1] == 1.0  # nothing compressed yet
        assert rates[3] > rates[2] > 1.0  # 64 x 48 at rank 2: 3072 elements -> 224
        assert len(messages) == 2 and "after 2 steps" in messages[0] and "after 4 steps" in messages[1], messages
