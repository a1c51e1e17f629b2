"""pycoll-bench: nccl-tests-style benchmark of torch.distributed collectives, pycoll beside
NCCL or Gloo in the same launch.  ``main`` parses and checks the arguments, then either runs
as one rank of a torchrun job (RANK and WORLD_SIZE in the environment) or spawns its own
ranks around a TCPStore on a free port."""
import argparse
import datetime
import os
import shlex
import sys
import tempfile

import torch
import torch.distributed as dist

from ..cache import cost_model_path
from . import checker
from .config import BenchConfig
from .ops import COLLECTIVES, DEFAULT_OPS
from .sizes import parse_size, size_range

from ..config import ALGORITHMS as KNOWN_ALGOS  # noqa: E402  (the extension's one list)
# What --calibrate measures when --algo is not given: every algorithm the cost model chooses
# between (both engines implement all four).
CALIBRATE_ALGOS = {"cpu": ["ring", "tree", "oneshot", "twoshot"], "cuda": ["oneshot", "twoshot", "ring", "tree"]}
# With --hosts: the two forms of a group across hosts (csrc/engines/host_form_model.h).
CALIBRATE_HOST_FORMS = ["flat", "hierarchical"]

EXAMPLES = """\
examples:
  pycoll-bench                                   # pycoll vs gloo on 2 CPU ranks (vs nccl, one rank per GPU)
  pycoll-bench --device cuda --nproc 2           # 2 ranks sharing one GPU, vs gloo (NCCL refuses that layout)
  pycoll-bench --ops all_reduce -b 8 -e 1G -f 2 --check
  pycoll-bench --backends pycoll,gloo --algo ring,tree,auto --nproc 4
  pycoll-bench --calibrate --rounds 3            # calibrate auto on this machine -> ~/.cache/pycollectives/cost_model.json
  pycoll-bench --hosts 2 --nproc 4 --calibrate --rounds 3   # + when auto runs flat or hierarchical across hosts
  pycoll-bench --hosts 2 --nproc 4 --link 1gbit  # hosts in network namespaces, links shaped to 1 Gbit/s (root)
  torchrun --nproc-per-node 8 -m pycollectives.bench --backends pycoll,nccl

ranks sharing GPUs (--device cuda, more ranks than GPUs): rank r runs on GPU r % (GPUs visible)
and pycoll runs their CUDA ops as PYCOLL_CUDA_SAME_DEVICE says (auto, the default, staged,
kernels or events; docs/using-gpus.md). NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the
comparison is Gloo: nccl named in --backends is left out with a note, or refused when it is the
only backend. The table's header says the layout and pycoll's path.

sizes are bytes of the op's largest buffer (all_gather: output, reduce_scatter: input), with
K/M/G suffixes (powers of 1024); all_gather, reduce_scatter and all_to_all run the largest
multiple of world-size elements that fits each size (as nccl-tests does), and the rows say the
bytes that ran.
exit status: 0 ok, 1 a wrong result (--check) or a failed op, 2 bad arguments.
"""


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _size_arg(text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _nonneg_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _rate_arg(text):
    from ..cluster.rates import canonical
    try:
        return canonical(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def build_parser():
    p = argparse.ArgumentParser(
        prog="pycoll-bench", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Benchmark torch.distributed collectives (nccl-tests style: mean time per call, "
                    "max over ranks, algbw and busbw) for pycoll beside NCCL or Gloo.")
    g = p.add_argument_group("what to run")
    g.add_argument("--backends", type=_csv, default=None,
                   help="comma list of backends, one process group each, run in alternation on the same "
                        "tensors; ratios refer to the first that is not pycoll "
                        "(default: pycoll,nccl on GPUs, one rank per GPU; pycoll,gloo on CPU and where ranks "
                        "share GPUs, which NCCL refuses: there nccl is left out with a note, see below)")
    g.add_argument("--algo", type=_csv, default=None,
                   help="pycoll algorithms, one row each (pycollectives.set_algo on every rank): "
                        + ",".join(KNOWN_ALGOS) + ", or a schedule program's name (docs/schedules.md)")
    g.add_argument("--ops", type=_csv, default=None,
                   help=f"comma list from {','.join(COLLECTIVES)}, or 'all' (default: {','.join(DEFAULT_OPS)})")
    g.add_argument("-d", "--dtype", type=_csv, default=["float32"],
                   help=f"comma list from {','.join(checker.DTYPES)} (default: float32)")
    g.add_argument("-o", "--op", dest="reduce_op", default="sum", choices=checker.REDUCE_OPS,
                   help="reduce op of all_reduce, reduce, reduce_scatter (default: sum)")
    g.add_argument("-r", "--root", type=_nonneg_int, default=0, help="root of broadcast and reduce (default: 0)")
    g.add_argument("--inplace", action="store_true",
                   help="in-place all_gather / reduce_scatter (input is the rank's chunk of the output / "
                        "output is the rank's chunk of the input); default out-of-place. all_reduce, "
                        "broadcast, reduce are in place by definition, all_to_all, sendrecv, send and pingpong never")
    g.add_argument("--shared-tensors", action="store_true",
                   help="CPU: put every row's buffers in shared memory (tensor.share_memory_()), where pycoll's "
                        "large ops read the peers' in place (PYCOLL_CPU_SHARED_TENSORS); every backend gets the "
                        "same buffers, the memory floor private ones")
    g.add_argument("--async-op", action="store_true",
                   help="issue each collective with async_op=True and wait on its Work (as DDP and overlapping "
                        "code do) instead of a blocking call; sendrecv is always issued that way, send and "
                        "pingpong are blocking calls either way")
    g = p.add_argument_group("sizes (nccl-tests flags)")
    g.add_argument("-b", "--minbytes", type=_size_arg, default=8, help="smallest size (default: 8)")
    g.add_argument("-e", "--maxbytes", type=_size_arg, default=None,
                   help="largest size (default: 64M on CPU, 1G on GPU)")
    g.add_argument("-f", "--stepfactor", type=_positive_int, default=None, help="multiply size by this (default: 2)")
    g.add_argument("-i", "--stepbytes", type=_size_arg, default=None, help="add this many bytes instead of -f")
    g = p.add_argument_group("timing")
    g.add_argument("-w", "--warmup", type=_nonneg_int, default=None,
                   help="warmup calls per row (default: 5 below 1 MiB, 2 below 16 MiB, 1 above)")
    g.add_argument("--prewarm", type=float, default=1.0,
                   help="seconds of small all_reduces on every row's group before the first size, so that "
                        "clocks have ramped up and lazy set-up is done when the smallest sizes are timed "
                        "(default: 1; 0 skips it)")
    g.add_argument("-n", "--iters", type=_positive_int, default=None,
                   help="timed calls per row (default: adaptive, --budget seconds per row, 3 to 5000 calls)")
    g.add_argument("--budget", type=_positive_float, default=0.05,
                   help="adaptive iterations: seconds of timed calls per (size, op, row) (default: 0.05)")
    g.add_argument("--rounds", type=_positive_int, default=1,
                   help="run the whole sweep this many times, rows still in alternation at each size, and "
                        "report each row's median time over the rounds (each round's time stays in the "
                        "JSON); damps host noise that can move one round's ratio by 10%% (default: 1)")
    g.add_argument("-c", "--check", action="store_true",
                   help="verify every result against a plain torch reference; exit 1 on a wrong result")
    g.add_argument("--graph", action="store_true",
                   help="CUDA only: also time CUDA-graph replay of the calls (extra rows)")
    # Tests only (hidden): the last rank corrupts one element of these ops' results before --check
    # compares them, to prove that a wrong result fails the run.
    g.add_argument("--inject-fault", default="", help=argparse.SUPPRESS)
    g = p.add_argument_group("ranks")
    g.add_argument("--nproc", type=_positive_int, default=None,
                   help="ranks to spawn (default: one per GPU with >= 2 GPUs, else 2); with --device cuda, "
                        "more ranks than GPUs share them (rank r on GPU r %% count); ignored under torchrun")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="tensor device (default: cuda with >= 2 GPUs, else cpu; on one GPU, --device cuda "
                        "--nproc 2 runs two ranks on it)")
    g.add_argument("--hosts", type=_positive_int, default=1,
                   help="simulate this many hosts on one machine: consecutive blocks of ranks get their own "
                        "PYCOLL_HOSTID and NCCL_HOSTID, for pycoll and the comparison backend alike (default: 1)")
    g.add_argument("--link", type=_rate_arg, default=None,
                   help="with --hosts: run the simulated hosts as a pycoll-cluster, each in its own network "
                        "namespace, joined by links shaped to this rate each way (100mbit, 1gbit, 10gbit); the "
                        "link's measured rate is printed beside the table and --calibrate's table of forms is "
                        "keyed by it. Needs root or user namespaces (docs/cluster.md)")
    # Set by --link on the ranks it starts inside the cluster (hidden).
    g.add_argument("--in-cluster", action="store_true", help=argparse.SUPPRESS)
    g.add_argument("--timeout", type=_positive_float, default=600.0,
                   help="seconds before a collective or the rendezvous times out (default: 600)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=os.path.join("benchmarks", "results"),
                   help="directory of the JSON and PNG files (default: benchmarks/results/)")
    g.add_argument("--name", default=None,
                   help="<what> in <date>-<card>-<what>.json (default: <backends>-np<N>, e.g. pycoll-vs-gloo-np2)")
    g.add_argument("--no-save", action="store_true", help="print the table only, write no files")
    g.add_argument("--no-plot", action="store_true", help="write no PNG")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g.add_argument("--calibrate", action="store_true",
                   help="fit alpha (us) and beta (us/byte) per (op, algorithm) and write them for the auto "
                        "cost model; on GPUs also which algorithm won at each size, which the CUDA engine's "
                        f"auto then follows (default algorithms: {','.join(CALIBRATE_ALGOS['cuda'])}); with "
                        "--hosts, alpha and beta of the flat and the hierarchical form per op, added to the file, "
                        "which auto then chooses between for that layout")
    g.add_argument("--trace", default=None, metavar="PATH",
                   help="write a Perfetto/Chrome timeline of every pycoll op of the run to PATH (from each rank's "
                        "flight recorder, docs/tracing.md); the ranks' dumps go to PATH.dumps/")
    g.add_argument("--calibrate-out", default=None,
                   help="constants file (default: this user's cache, $XDG_CACHE_HOME/pycollectives/cost_model.json "
                        "or ~/.cache/pycollectives/cost_model.json, which import pycollectives loads; "
                        "another path takes PYCOLL_COST_MODEL=PATH to be used)")
    return p


def _torchrun_env():
    """(rank, world, local_rank) when launched by torchrun or a similar launcher, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        return rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank))
    return None


def _pycollectives(device, shared=False):
    """(module, problem): problem is None when the 'pycoll' backend is registered."""
    try:
        import pycollectives
    except Exception as exc:  # the package failed to import
        return None, f"import pycollectives failed: {type(exc).__name__}: {exc}"
    if "pycoll" not in dist.Backend.backend_list:
        harness = "nccl,nccl" if device == "cuda" and not shared else "gloo,gloo"
        return pycollectives, ("import pycollectives did not register the 'pycoll' backend (is the C++ "
                               f"extension built?); try --backends {harness} to exercise the harness")
    return pycollectives, None


def _prog():
    return "python -m pycollectives.bench" if sys.argv and sys.argv[0].endswith("__main__.py") else "pycoll-bench"


def _command(argv):
    return " ".join([_prog()] + [shlex.quote(a) for a in argv])


def same_device_path():
    """PYCOLL_CUDA_SAME_DEVICE as the extension reads it (trimmed, lower case), from the settings
    registry; ValueError when it is none of the registry's values."""
    from .. import settings

    value = "".join(settings.read("PYCOLL_CUDA_SAME_DEVICE").split()).lower()
    info = next(s for s in settings.settings() if s["name"] == "PYCOLL_CUDA_SAME_DEVICE")
    allowed = [v.strip() for v in info["range"].split(",")]
    if value not in allowed:
        raise ValueError(f"PYCOLL_CUDA_SAME_DEVICE={value!r} is not valid: it must be one of {', '.join(allowed)}")
    return value


def gpu_hint(device_arg, device, ngpu, launched):
    """The one line that the default run (make bench) prints on a machine with exactly one GPU,
    where --device auto stays on CPU: how to run ranks that share that GPU.  None elsewhere."""
    if device_arg != "auto" or device != "cpu" or ngpu != 1 or launched:
        return None
    return (f"one GPU visible: {_prog()} --device cuda --nproc 2 runs two ranks on it, pycoll against gloo "
            "(NCCL refuses two ranks on one GPU)")


def parse_config(argv, parser=None):
    """Checked BenchConfig and the torchrun triple (or None).  Bad arguments -> parser.error
    (exit status 2)."""
    parser = parser or build_parser()
    a = parser.parse_args(argv)
    err = parser.error
    launched = _torchrun_env()
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0

    device = a.device
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) if launched else 0
    if device == "auto":
        device = "cuda" if ngpu >= 2 or (launched and ngpu >= max(1, local_world)) else "cpu"
    if device == "cuda" and ngpu == 0:
        err("--device cuda: no GPU is visible")
    if a.shared_tensors and device != "cpu":
        err("--shared-tensors puts CPU tensors in shared memory; this run is on " + device)
    if a.graph and device != "cuda":
        err("--graph times CUDA graph replay and needs GPUs (--device cuda); this run is on CPU"
            + ("" if ngpu else ": no GPU is visible"))

    world = launched[1] if launched else (a.nproc or (ngpu if device == "cuda" else 2))
    if a.root >= world:
        err(f"--root {a.root}: must be below the number of ranks ({world})")
    # Ranks that share GPUs: more ranks on this host than GPUs visible (rank r runs on GPU r % count).
    # Under a launcher, the ranks on this host are LOCAL_WORLD_SIZE; without it, one rank per GPU.
    local_ranks = local_world if launched else world
    shared = device == "cuda" and local_ranks > ngpu
    gpu_layout = None
    if shared:
        per_host = " per host" if launched and local_ranks != world else ""
        gpu_layout = f"{local_ranks} ranks{per_host} on {ngpu} GPU(s), ranks sharing GPUs"
        if a.link:
            err(f"--link gives every simulated host its own GPUs; {gpu_layout}: give --nproc at most {ngpu}")

    backends = [b.lower() for b in (a.backends or ["pycoll", "nccl" if device == "cuda" and not shared else "gloo"])]
    if not backends:
        err("--backends: give at least one backend")
    notes = []
    if shared and "nccl" in backends:
        why = f'nccl left out: {gpu_layout}, which NCCL refuses ("Duplicate GPU detected")'
        kept = [b for b in backends if b != "nccl"]
        if not kept:
            err(f"--backends {','.join(backends)}: {why}; compare pycoll with gloo (--backends pycoll,gloo), "
                f"or run at most {ngpu} rank(s) per host")
        notes.append(why)
        if not launched or launched[0] == 0:
            print(f"pycoll-bench: {why}; running {','.join(kept)}", file=sys.stderr)
        backends = kept
    pyc, problem = (None, None)
    if "pycoll" in backends or a.algo:
        pyc, problem = _pycollectives(device, shared)
    for b in backends:
        if b == "pycoll":
            if problem:
                err(f"--backends pycoll: {problem}")
        elif b not in dist.Backend.backend_list or b in ("undefined",):
            err(f"--backends: unknown backend {b!r} (known: pycoll, "
                f"{', '.join(x for x in dist.Backend.backend_list if x != 'undefined')})")
        if b == "nccl" and device != "cuda":
            err("--backends nccl needs GPUs (--device cuda); on CPU compare with gloo")
    same_device = None
    if shared and "pycoll" in backends:
        try:
            same_device = same_device_path()
        except ValueError as exc:
            err(str(exc))

    algos = a.algo or []
    if algos:
        if "pycoll" not in backends:
            err("--algo selects pycoll algorithms: add pycoll to --backends")
        known = tuple(getattr(pyc, "ALGORITHMS", None) or getattr(getattr(pyc, "config", None), "ALGORITHMS", None)
                      or KNOWN_ALGOS)
        for name in algos:
            if name in known:
                continue
            try:  # a schedule program's name (docs/schedules.md): it must resolve here
                from ..schedule.registry import resolve

                resolve(name)
            except (ImportError, ValueError) as exc:
                err(f"--algo: unknown algorithm {name!r} (built in: {', '.join(known)}; "
                    f"not a schedule program either: {exc})")
        if not hasattr(pyc, "set_algo"):
            err("--algo: this pycollectives has no set_algo()")
        if len(set(algos)) != len(algos):
            err("--algo: an algorithm is named twice")

    ops = a.ops or list(DEFAULT_OPS)
    if ops == ["all"]:
        ops = list(COLLECTIVES)
    for op in ops:
        if op not in COLLECTIVES:
            err(f"--ops: unknown op {op!r} (known: {', '.join(COLLECTIVES)}, all)")
    if len(set(ops)) != len(ops):
        err("--ops: an op is named twice")

    dtypes = []
    for name in a.dtype:
        try:
            key, dt = checker.resolve_dtype(name)
        except KeyError:
            err(f"--dtype: unknown dtype {name!r} (known: {', '.join(checker.DTYPES)})")
        if a.reduce_op == "avg" and not dt.is_floating_point:
            err(f"--op avg needs a floating-point --dtype, not {key}")
        dtypes.append(key)
    if not dtypes:
        err("--dtype: give at least one dtype")

    maxbytes = a.maxbytes if a.maxbytes is not None else (1 << 30 if device == "cuda" else 64 << 20)
    try:
        sizes = size_range(a.minbytes, maxbytes, a.stepfactor, a.stepbytes)
    except ValueError as exc:
        err(f"sizes: {exc}")

    if a.calibrate and not algos and "pycoll" in backends and hasattr(pyc, "set_algo"):
        # Across hosts the choice calibrated is the form; one host, the engine's algorithm.
        # (Under torchrun across real hosts, pass --algo flat,hierarchical.)
        algos = list(CALIBRATE_HOST_FORMS if a.hosts > 1 else CALIBRATE_ALGOS[device])
    calibrate_out = a.calibrate_out
    if a.calibrate_out is not None and not a.calibrate:
        err("--calibrate-out names the file --calibrate writes: add --calibrate")
    if a.calibrate:
        # Never into the installed package: a file there would change every later import's auto.
        calibrate_out = os.path.abspath(calibrate_out or cost_model_path())

    if world % a.hosts != 0:
        err(f"--hosts {a.hosts}: {world} ranks do not split evenly into {a.hosts} hosts")
    if a.link and a.hosts < 2:
        err("--link shapes the links between simulated hosts: add --hosts N (N >= 2)")
    if a.in_cluster and not launched:
        err("--in-cluster is set by --link on the ranks it starts")
    if launched and a.link and not a.in_cluster:
        err("--link builds a cluster for the ranks pycoll-bench starts; under torchrun or pycoll-cluster leave it out")
    if launched and a.hosts > 1 and not a.in_cluster:
        err("--hosts simulates hosts for spawned ranks; under torchrun give each agent its own PYCOLL_HOSTID")
    if launched and a.nproc and a.nproc != world:
        print(f"pycoll-bench: --nproc {a.nproc} ignored: launched with WORLD_SIZE={world}", file=sys.stderr)
    cfg = BenchConfig(
        device=device, nproc=world, backends=backends, algos=algos, ops=ops, sizes=sizes, dtypes=dtypes,
        reduce_op=a.reduce_op, root=a.root, warmup=a.warmup, prewarm_s=max(0.0, a.prewarm), iters=a.iters,
        budget_s=a.budget, rounds=a.rounds,
        inplace=a.inplace, shared_tensors=a.shared_tensors, async_op=a.async_op, check=a.check, graph=a.graph, inject_fault=a.inject_fault, out_dir=a.out, name=a.name,
        save=not a.no_save, plot=not a.no_plot, calibrate=a.calibrate, calibrate_out=calibrate_out, trace=a.trace,
        timeout_s=a.timeout, progress=not a.no_progress,
        command=_command([x for x in argv if x != "--in-cluster"]), argv=[x for x in argv if x != "--in-cluster"],
        launcher="pycoll-cluster" if a.in_cluster else "torchrun" if launched else "spawn", hosts=a.hosts, link=a.link,
        gpu_layout=gpu_layout, same_device=same_device, notes=notes, hint=gpu_hint(a.device, device, ngpu, launched))
    return cfg, launched


def _spawn(cfg):
    import torch.multiprocessing as mp
    from .runner import spawn_entry

    host = "127.0.0.1"
    store = dist.TCPStore(host, 0, None, True, timeout=datetime.timedelta(seconds=cfg.timeout_s),
                          wait_for_workers=False)
    fd, status_path = tempfile.mkstemp(prefix="pycoll-bench-status-")
    os.close(fd)
    try:
        mp.start_processes(spawn_entry, args=(cfg, cfg.nproc, host, store.port, status_path),
                           nprocs=cfg.nproc, join=True, start_method="spawn")
        with open(status_path) as fh:
            text = fh.read().strip()
        return int(text) if text else 1
    except mp.ProcessRaisedException as exc:
        print(f"pycoll-bench: rank {exc.error_index} failed:\n{exc}", file=sys.stderr)
        return 1
    except mp.ProcessExitedException as exc:
        print(f"pycoll-bench: rank {exc.error_index} exited with status {exc.exit_code}", file=sys.stderr)
        return 1
    finally:
        del store
        os.unlink(status_path)


def _cluster(cfg, argv):
    """--link: the same command once per rank, on simulated hosts of a pycoll-cluster."""
    from ..cluster import cli as cluster_cli
    per_host = cfg.nproc // cfg.hosts
    args = ["--hosts", str(cfg.hosts), "--nproc-per-host", str(per_host), "--link", cfg.link]
    if cfg.device == "cuda":
        args += ["--gpus-per-host", str(per_host)]   # one GPU per rank, as without --link
    return cluster_cli.main(args + ["--", sys.executable, "-m", "pycollectives.bench"] + list(argv) + ["--in-cluster"])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, launched = parse_config(argv)
    os.environ["NCCL_NVLS_ENABLE"] = "0"   # never NVLink multicast, in every rank we start
    if cfg.link and not launched:
        return _cluster(cfg, argv)
    if launched:
        from .runner import run_rank
        rank, world, local_rank = launched
        return run_rank(cfg, rank, world, local_rank)
    return _spawn(cfg)


if __name__ == "__main__":
    sys.exit(main())
