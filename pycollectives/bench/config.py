"""The resolved settings of one benchmark run, shared by the launcher and every rank."""
import dataclasses
from typing import List, Optional

# What each PYCOLL_CUDA_SAME_DEVICE value runs for ranks that share a GPU (docs/using-gpus.md).
SAME_DEVICE_PATHS = {
    "auto": "all_reduce, reduce_scatter, all_gather and broadcast ordered by CUDA IPC events from a "
            "measured size up, everything else through host memory",
    "staged": "through host memory and the CPU engine",
    "kernels": "the CUDA engine's kernels on CUDA IPC mappings (correct, not fast)",
    "events": "all_reduce, reduce_scatter, all_gather and broadcast ordered by CUDA IPC events, "
              "no kernel waiting on another process; the other ops as kernels",
}


@dataclasses.dataclass
class BenchConfig:
    device: str                      # "cpu" or "cuda"
    nproc: int                       # ranks to spawn (ignored under torchrun)
    backends: List[str]              # first = default group; the others via new_group
    algos: List[str]                 # pycoll algorithms, one row each; [] = backend's default
    ops: List[str]
    sizes: List[int]                 # bytes of each op's largest buffer
    dtypes: List[str]
    reduce_op: str = "sum"
    root: int = 0
    warmup: Optional[int] = None     # None: 5 calls below 1 MiB, 2 below 16 MiB, 1 above
    prewarm_s: float = 1.0           # seconds of small all_reduces on every row's group first
    iters: Optional[int] = None      # None: adaptive, from ``budget``
    budget_s: float = 0.05           # adaptive: seconds of timed calls per (size, op, row)
    min_iters: int = 3
    rounds: int = 1                  # the whole sweep this many times; a row's time is the median
    max_iters: int = 5000
    inplace: bool = False
    shared_tensors: bool = False     # CPU buffers in shared memory (share_memory_())
    async_op: bool = False           # collectives issued with async_op=True, then waited on
    check: bool = False
    graph: bool = False
    inject_fault: str = ""           # tests only: comma-separated ops (or "all") whose result the last rank corrupts
    out_dir: str = "benchmarks/results"
    name: Optional[str] = None       # <what> in the file names
    save: bool = True
    plot: bool = True
    calibrate: bool = False
    calibrate_out: Optional[str] = None
    trace: Optional[str] = None      # --trace: a Perfetto timeline of the run from every rank's flight recorder
    timeout_s: float = 600.0
    hosts: int = 1                   # simulated hosts: rank r is on host r * hosts // nproc
    link: Optional[str] = None       # --link: the hosts' links shaped to this rate (pycoll-cluster)
    progress: bool = True
    command: str = ""
    argv: List[str] = dataclasses.field(default_factory=list)
    launcher: str = "spawn"          # "spawn", "torchrun" or "pycoll-cluster"
    gpu_layout: Optional[str] = None  # ranks that share GPUs: "N ranks on M GPU(s), ranks sharing GPUs"
    same_device: Optional[str] = None  # then pycoll's path for them: PYCOLL_CUDA_SAME_DEVICE (auto, staged, ...)
    notes: List[str] = dataclasses.field(default_factory=list)  # header lines: a backend left out, and why
    hint: Optional[str] = None       # header line of the default run on a one-GPU machine

    def to_json(self):
        d = dataclasses.asdict(self)
        d.pop("argv", None)
        return d
