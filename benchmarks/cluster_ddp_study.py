"""DDP steps with gradient compression between simulated hosts (docs/cluster.md's study).

Runs inside pycoll-cluster (torchrun's environment); rank 0 adds its rows to OUT, a JSON file it
makes when missing (rows of the same model, layout, link and method are replaced):

    pycoll-cluster --hosts 2 --nproc-per-host 1 --link 1gbit -- \\
        python benchmarks/cluster_ddp_study.py --model mlp --out benchmarks/results/FILE.json

Models: ``mlp``, benchmarks/compression_bench.py's CPU model (MLP 3 x 2048, 13.1 M parameters, one
fixed batch of 8 per rank, SGD with momentum); ``cnn``, examples/ddp_cnn.py (width 16, synthetic
CIFAR-10-shaped data, batch 32 per rank, 3 epochs of 16 steps). Methods, all on pycoll: no hook,
PowerSGD rank 1 and rank 4 (plain averaging for the first 2 steps), signSGD. Per method:

  step_ms            the slowest rank's step time, warm-up steps left out (mlp: the median over
                     the timed steps; cnn: the example's mean, the median over --rounds trainings)
  link_bytes_per_step  bytes each host sent on its link per timed step: the interface's transmit
                     counter (/proc/net/dev, packet headers included), the mean over the hosts
  hook_bytes_per_step  this rank's payload into the hook's collectives per timed step (its
                     CommStats); for no hook, 4 bytes x parameters (the all_reduce's payload)
  loss               mlp: the loss over every rank's batch after the same steps; cnn: the last
                     step's loss, the mean over the ranks (and the test accuracy)
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE, os.path.join(REPO, "examples")):
    if p not in sys.path:
        sys.path.insert(0, p)

import pycollectives  # noqa: E402  (registers "pycoll")
from pycollectives.package_settings import LINK, LINK_MEASURED  # noqa: E402

SCHEMA = "pycoll-cluster-ddp-study/1"
METHODS = [("none", 0), ("powersgd", 1), ("powersgd", 4), ("signsgd", 0)]


def link_tx_bytes(ifname="pcl0"):
    """Bytes this network namespace sent on `ifname` (its host's link), or None outside a cluster."""
    with open("/proc/net/dev") as fh:
        for line in fh:
            name, _, counters = line.partition(":")
            if name.strip() == ifname:
                return int(counters.split()[8])
    return None


def hosts_sent(before):
    """Bytes sent on the link since `before`, per host (local rank 0 of each host reads its counter)."""
    mine = None
    if int(os.environ.get("LOCAL_RANK", 0)) == 0 and before is not None:
        mine = link_tx_bytes() - before
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return [b for b in every if b is not None]


def mlp(method, r, args, rank, world):
    from compression_bench import make_data, make_model, setup_hook

    d_in, d_out = 256, 16
    model = make_model(2048, 3, d_in, d_out, args.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25.0)
    state = setup_hook(ddp, method, None, r, "cpu")
    xs, ys = make_data(args.seed, world, 8, d_in, d_out, "cpu")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    with torch.no_grad():
        loss0 = float(torch.nn.functional.mse_loss(model(xs.flatten(0, 1)), ys.flatten(0, 1)))
    times, before = [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if state is not None:
                state.stats.reset()
            dist.barrier()
            before = link_tx_bytes()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ddp(xs[rank]), ys[rank]).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    sent = hosts_sent(before)
    worst = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank at each step
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(xs.flatten(0, 1)), ys.flatten(0, 1)))
    params = sum(p.numel() for p in model.parameters())
    return {"step_ms": statistics.median(worst.tolist()) * 1e3, "step_ms_mean": float(worst.mean()) * 1e3,
            "steps": args.steps, "warmup": args.warmup, "params": params, "loss0": loss0, "loss": loss,
            "link_bytes_per_step": statistics.mean(sent) / args.steps if sent else None,
            "hook_bytes_per_step": state.stats.sent_bytes / args.steps if state else 4.0 * params}


def cnn(method, r, args, rank, world):
    import common
    import ddp_cnn

    argv = ["--device", "cpu", "--epochs", "3", "--steps", "16", "--samples", "2048", "--warmup", str(args.warmup),
            "--seed", str(args.seed), "--hook", method, "--powersgd-rank", str(max(r, 1))]
    cargs = ddp_cnn.parse_args(argv)
    marks = {}

    class Timer(common.StepTimer):  # the link counter at the first timed step and at the end
        def step(self, i):
            if i == self.warmup:
                marks["before"] = link_tx_bytes()
            super().step(i)

        def ms_per_step(self, run):
            marks["sent"] = hosts_sent(marks.get("before"))
            marks["timed"] = self.timed
            return super().ms_per_step(run)

    ddp_cnn.StepTimer = Timer
    torch.manual_seed(cargs.seed)
    run = common.Run(rank, world, int(os.environ.get("LOCAL_RANK", 0)), torch.device("cpu"), "pycoll",
                     dist.group.WORLD)
    res = ddp_cnn.train(cargs, run)
    params = sum(p.numel() for p in common.CNN(cargs.width).parameters())
    sent = marks["sent"]
    return {"step_ms": res["ms_per_step"], "steps": len(res["losses"]) - cargs.warmup, "warmup": cargs.warmup, "params": params,
            "loss": res["losses"][-1], "test_accuracy": res["test_accuracy"],
            "link_bytes_per_step": statistics.mean(sent) / marks["timed"] if sent else None,
            "hook_bytes_per_step": res.get("hook_bytes_per_step", 4.0 * params)}


def command(argv):
    hosts = int(os.environ["WORLD_SIZE"]) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return (f"pycoll-cluster --hosts {hosts} --nproc-per-host {os.environ.get('LOCAL_WORLD_SIZE', 1)} "
            f"--link {LINK.get()} -- python benchmarks/cluster_ddp_study.py " + " ".join(argv))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--out", required=True, help="JSON file the rows go into")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (mlp; cnn: 48 in all)")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=0,
                    help="train every method this many times, report the median step time (default: cnn 3, mlp 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("pycoll", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    link, measured_text = LINK.get(), LINK_MEASURED.get()
    measured = float(measured_text) if measured_text[:1].isdigit() else 0.0
    rounds = args.rounds if args.rounds else (3 if args.model == "cnn" else 1)
    runs = {m: [] for m in METHODS}
    for _ in range(rounds):  # every method once per round: a slow spell of the machine hits them alike
        for method, r in METHODS:
            runs[(method, r)].append((mlp if args.model == "mlp" else cnn)(method, r, args, rank, world))
    rows = []
    for (method, r), results in runs.items():
        row = {"model": args.model, "layout": f"{world // local}x{local}", "link": link,
               "link_measured_bps": measured, "method": method + (f" r={r}" if r else "")}
        row.update(results[0])
        if rounds > 1:  # the median step time; the losses are the same every round (same seed)
            row["step_ms_rounds"] = [x["step_ms"] for x in results]
            row["step_ms"] = statistics.median(row["step_ms_rounds"])
            row["loss_rounds"] = [x["loss"] for x in results]
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        from compression_bench import machine

        doc = {"schema": SCHEMA, "rows": []}
        if os.path.exists(args.out):
            with open(args.out) as fh:
                doc = json.load(fh)
        key = lambda x: (x["model"], x["layout"], x["link"], x["method"])  # noqa: E731
        new = {key(x) for x in rows}
        doc["rows"] = [x for x in doc["rows"] if key(x) not in new] + rows
        doc.setdefault("machine", machine())
        doc["machine"]["hostname"] = socket.gethostname()
        doc["runs"] = [x for x in doc.get("runs", [])
                       if (x["model"], x["layout"], x["link"]) != (args.model, rows[0]["layout"], link)]
        doc["runs"].append({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command(argv), "model": args.model, "layout": rows[0]["layout"], "link": link,
            "link_measured_bps": measured})
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
