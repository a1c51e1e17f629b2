"""Gradient compression for DDP and for plain training loops.

DDP communication hooks (``ddp.register_comm_hook(state, hook)``), usable
over pycoll (CPU and CUDA tensors), NCCL (CUDA) and Gloo (CPU):

* :func:`signsgd_hook` / :class:`SignSGDState`: 1-bit signs packed 32 to an
  int32 word, one all_gather, majority vote, scale ``mean |g|``, error
  feedback; 32x fewer bytes than a float32 all_reduce.
* :func:`powersgd_hook` / :class:`PowerSGDState`: rank-r PowerSGD with error
  feedback and warm start; same-shape matrices batched so that each step is
  one all_reduce for all P and one for all Q; :func:`powersgd_bytes` gives
  the analytic byte ratio.

Each state's ``stats`` (:class:`CommStats`) counts the bytes its hook put
into collectives next to what plain all_reduces would have; on pycoll
``pycollectives.stats()`` shows the same per op ("allgather" for signSGD,
"allreduce" for PowerSGD). The kernels (``pycollectives.hooks._kernels``)
are the native ones of ``pycollectives._C`` when built, plain torch otherwise.
"""
from ._common import Bucket, CommStats
from .powersgd import PowerSGDState, powerSGD_hook, powersgd_bytes, powersgd_hook
from .signsgd import SignSGDState, signsgd_hook

__all__ = ["signsgd_hook", "SignSGDState", "powersgd_hook", "powerSGD_hook", "PowerSGDState", "powersgd_bytes", "CommStats", "Bucket"]
