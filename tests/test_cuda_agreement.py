"""What keeps the ranks' CUDA launches consistent, checked without a GPU: the check word every
collective message carries (transport/cuda_ipc/check_word.h) and the comparison of the engine
settings every rank publishes when its CUDA engine starts (common/settings_agreement.h)."""
import itertools

import pytest

import pycollectives

C = pycollectives._C
ALL_REDUCE, REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = 1, 2, 3, 4, 5, 6  # common/types.h: OpCode
FLOAT32, BFLOAT16 = 0, 3  # DType
# The built-in plans, then the registered protocols' codes (cuda/all_reduce_registry.h).
PLANS = {1: "one-shot", 2: "two-shot", 3: "ring", 4: "tree", 5: "split one-shot (static ranges)",
         6: "split one-shot (claimed chunks)", 7: "one-shot (LL protocol)", 8: "direct"}
PLANS.update({p["check_code"]: p["check_plan"] for p in C.cuda_all_reduce_protocols() if p["check_code"]})


def test_every_field_changes_the_word():
    base = dict(op=ALL_REDUCE, dtype=FLOAT32, reduce_op=0, root=0, count=1031, plan=2)
    w0 = C.cuda_check_word(**base)
    for field, other in (("op", REDUCE_SCATTER), ("dtype", BFLOAT16), ("reduce_op", 3), ("root", 1),
                         ("count", 1032), ("plan", 3)):
        assert C.cuda_check_word(**dict(base, **{field: other})) != w0, field


def test_all_to_all_pairs_carry_their_size():
    # Each pair of an all_to_all checks its own byte count (cuda/kernels/entry.cuh, with_pair_bytes):
    # the words of two sizes differ, and the error names both.
    w1 = C.cuda_check_word(ALL_TO_ALL, 0, 0, 0, 4096, 0)
    w2 = C.cuda_check_word(ALL_TO_ALL, 0, 0, 0, 8192, 0)
    assert w1 != w2
    assert C.describe_cuda_check_word(w1) == "alltoall sending 4096 bytes from one rank to the other"
    assert C.describe_cuda_check_word(C.cuda_check_word(ALL_TO_ALL, 0, 0, 0, 0, 0)) == "alltoall"


def test_plans_are_distinct_and_named():
    words = {p: C.cuda_check_word(ALL_REDUCE, FLOAT32, 0, 0, 4096, p) for p in [0, *PLANS]}
    assert len(set(words.values())) == len(PLANS) + 1 and len(set(PLANS.values())) == len(PLANS)
    for p, name in PLANS.items():
        text = C.describe_cuda_check_word(words[p])
        assert text == f"allreduce of 4096 elements of float32 (sum), {name}", text
    assert C.describe_cuda_check_word(words[0]) == "allreduce of 4096 elements of float32 (sum)"


@pytest.mark.parametrize("count", [0, 1, 1031, (1 << 40) - 1])
def test_count_and_root_round_trip(count):
    text = C.describe_cuda_check_word(C.cuda_check_word(REDUCE, BFLOAT16, 3, 7, count, 8))
    assert text == f"reduce of {count} elements of bfloat16 (max) with root 7, direct", text
    text = C.describe_cuda_check_word(C.cuda_check_word(ALL_GATHER, 0, 0, 0, count, 3))
    assert text == f"allgather of {count} bytes, ring", text


def test_fields_do_not_bleed_into_each_other():
    # The largest value of each field leaves every other field as it was.
    seen = set()
    for op, dt, rop, root, plan in itertools.product((1, 255), (0, 15), (0, 15), (0, 15), (0, 15)):
        w = C.cuda_check_word(op, dt, rop, root, (1 << 40) - 1, plan)
        assert w & ((1 << 40) - 1) == (1 << 40) - 1
        assert (w >> 40) & 0xF == plan and (w >> 44) & 0xF == root and (w >> 48) & 0xF == rop
        assert (w >> 52) & 0xF == dt and w >> 56 == op
        seen.add(w)
    assert len(seen) == 2 ** 5


def _enc(**kv):
    return "".join(f"{k}={v}\n" for k, v in kv.items())


def test_settings_agree():
    same = _enc(PYCOLL_CUDA_MAX_BLOCKS=64, PYCOLL_CUDA_SLOT_KIB=0)
    assert C.settings_disagreement([same] * 4) == ""
    assert C.settings_disagreement([same]) == ""
    assert C.settings_disagreement([]) == ""


def test_settings_disagreement_names_setting_and_ranks():
    a = _enc(GPU_SMS=132, PYCOLL_CUDA_MAX_BLOCKS=64, PYCOLL_CUDA_SLOT_KIB=0)
    b = _enc(GPU_SMS=132, PYCOLL_CUDA_MAX_BLOCKS=32, PYCOLL_CUDA_SLOT_KIB=0)
    c = _enc(GPU_SMS=114, PYCOLL_CUDA_MAX_BLOCKS=64, PYCOLL_CUDA_SLOT_KIB=0)
    text = C.settings_disagreement([a, b, c])
    assert text.splitlines() == [
        "GPU_SMS: rank 0 has 132, rank 1 has 132, rank 2 has 114",
        "PYCOLL_CUDA_MAX_BLOCKS: rank 0 has 64, rank 1 has 32, rank 2 has 64",
    ], text


def test_settings_missing_on_a_rank():
    text = C.settings_disagreement([_enc(A=1, B=2), _enc(A=1)])
    assert text == "B: rank 0 has 2, rank 1 has (unset)\n", text
