"""Rank 0's output: metadata, ratios to the baseline row, the table on stdout, the JSON and
PNG files, the calibration constants, and the exit status."""
import datetime
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

import torch

from . import calibrate
from .config import SAME_DEVICE_PATHS
from .sizes import format_size

SCHEMA = "pycoll-bench/1"


# -- metadata --------------------------------------------------------------------------------
def _cpuinfo_fields():
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model():
    """The CPU's model name. A hypervisor may report only the vendor's family name ("AMD EPYC",
    no number): then the family and model numbers are added, so that results from different
    generations behind that name do not read as one card (the 2-core CI-class VM came as two
    EPYCs on 2026-12-01 and 12-02, one 1.3-1.8x faster than the other at 1-64 MiB)."""
    fields = _cpuinfo_fields()
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown-cpu"
    if not re.search(r"\d", name) and "cpu family" in fields:
        name += f" family {fields['cpu family']} model {fields.get('model', '?')}"
    return name


def cpu_caches():
    """{'L1d': '48K', 'L2': '1024K', 'L3': '32768K', ...} of the CPU this process runs on, from sysfs."""
    base = f"/sys/devices/system/cpu/cpu{min(os.sched_getaffinity(0))}/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return {}
    def read(entry, name):
        with open(os.path.join(base, entry, name)) as fh:
            return fh.read().strip()

    caches = {}
    for entry in entries:
        try:
            level, kind, size = (read(entry, name) for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            caches[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return caches


def card_name(device):
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_model()


def driver_version():
    """NVIDIA driver version from nvidia-smi, or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def slugify(text):
    """'Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz' -> 'intel-xeon-platinum-8480'."""
    text = re.sub(r"\((r|tm|c)\)", "", text, flags=re.IGNORECASE)
    text = text.split("@")[0]
    text = re.sub(r"\b(cpu|processor)\b", "", text, flags=re.IGNORECASE)
    text = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return text or "unknown"


def link_info(cfg):
    """The links between hosts: the rate they are shaped to (--link, or PYCOLL_LINK as pycoll-cluster
    sets it) and the TCP rate pycoll-cluster measured on them (PYCOLL_LINK_MEASURED), else None."""
    from ..package_settings import LINK, LINK_MEASURED
    link = cfg.link or LINK.get() or None
    try:
        measured = float(LINK_MEASURED.get()) or None
    except ValueError:
        measured = None
    return link, measured


def metadata(cfg, world):
    link, measured = link_info(cfg)
    now = datetime.datetime.now().astimezone()
    try:
        import pycollectives
        pyc_version = getattr(pycollectives, "__version__", None)
    except Exception:
        pyc_version = None
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("PYCOLL_", "NCCL_", "GLOO_")) or k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
    if cfg.link:  # set by pycoll-cluster for --link, which the command names; "link" below says both
        for k in ("PYCOLL_LINK", "PYCOLL_LINK_MEASURED", "PYCOLL_HOSTID", "NCCL_HOSTID", "GLOO_SOCKET_IFNAME",
                  "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"):
            env.pop(k, None)
    return {
        "card": card_name(cfg.device),
        "device": cfg.device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "driver": driver_version(),
        "hostname": socket.gethostname(),
        "date": now.isoformat(timespec="seconds"),
        "nproc": world,
        "world_size": world,
        "hosts": cfg.hosts,
        "link": link,
        "link_measured_bps": measured,
        "command": cfg.command,
        "argv": list(cfg.argv),
        "launcher": cfg.launcher,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_caches": cpu_caches(),
        "torch_threads": torch.get_num_threads(),
        "pycollectives_version": pyc_version,
        "env": env,
    }


# -- figures ---------------------------------------------------------------------------------
def _key(r):
    return (r["op"], r["bytes"], r["dtype"], r["mode"])


def add_ratios(rows, baseline):
    """time_ratio = time / baseline time and busbw_ratio = busbw / baseline busbw (the same
    number inverted: >1 means faster than the baseline) at the same op, size, dtype, mode."""
    base = {_key(r): r for r in rows if r["label"] == baseline}
    floor = {_key(r): r for r in rows if r["label"] == "floor"}
    for r in rows:
        f = floor.get(_key(r))
        # CPU runs: the memory floor's time over this row's (bench/floor.py; 1.0 = memory speed)
        r["floor_fraction"] = f["time_us"] / r["time_us"] if f is not None and r["time_us"] and f["time_us"] else None
        b = base.get(_key(r))
        r["baseline"] = baseline
        r["time_ratio"] = r["busbw_ratio"] = None
        if b is not None and r["time_us"] and b["time_us"]:
            r["time_ratio"] = r["time_us"] / b["time_us"]
            r["busbw_ratio"] = b["time_us"] / r["time_us"]


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def format_table(rows, meta, cfg, baseline):
    mode = "in-place" if cfg.inplace else "out-of-place"
    iters = f"{cfg.iters} iterations" if cfg.iters else f"adaptive iterations ({cfg.budget_s:g} s per row)"
    if cfg.rounds > 1:
        iters += f", median of {cfg.rounds} rounds"
    ratio_head = f"x {baseline}"
    lines = [
        f"# pycoll-bench: {meta['world_size']} ranks"
        + (f" as {cfg.hosts} simulated hosts of {meta['world_size'] // cfg.hosts}" if cfg.hosts > 1 else "")
        + f", {meta['device']} ({meta['card']}), torch {meta['torch']}, "
        f"{','.join(cfg.dtypes)}, op {cfg.reduce_op}, {mode} where the op allows, "
        + ("buffers in shared memory, " if cfg.shared_tensors else "")
        + ("issued with async_op=True and waited on, " if cfg.async_op else "") + f"{iters}",
        "# time: mean per call, max over ranks" + (", median over the rounds" if cfg.rounds > 1 else "")
        + "; algbw = size / time; busbw = algbw * nccl-tests factor;",
        f"# {ratio_head} = busbw / busbw of {baseline} at the same size (>1: faster than {baseline})",
    ]
    if cfg.gpu_layout:
        path = ""
        if cfg.same_device:
            path = (f"; pycoll runs their CUDA ops {cfg.same_device} (PYCOLL_CUDA_SAME_DEVICE): "
                    + SAME_DEVICE_PATHS.get(cfg.same_device, ""))
        lines.append(f"# {cfg.gpu_layout}{path}")
    lines.extend(f"# {note}" for note in cfg.notes)
    if cfg.hint:
        lines.append(f"# {cfg.hint}")
    if meta.get("link"):
        measured = meta.get("link_measured_bps")
        lines.insert(1, f"# link between hosts: {meta['link']} each way (pycoll-cluster, tc tbf)"
                        + (f"; measured {measured / 1e6:.0f} Mbit/s (one TCP stream)" if measured else ""))
    label_w = max([len("backend")] + [len(r["label"]) + (8 if r["mode"] == "graph" else 0) for r in rows])
    head = (f"{'op':<15}{'size':>9}{'count':>12}  {'backend':<{label_w}}{'time_us':>12}"
            f"{'algbw GB/s':>12}{'busbw GB/s':>12}{ratio_head:>{max(9, len(ratio_head) + 2)}}  check")
    ratio_w = max(9, len(ratio_head) + 2)
    has_floor = any(r.get("floor_fraction") is not None for r in rows)
    if has_floor:
        lines.insert(3, "# of floor = time of the memory floor / time (bench/floor.py: every rank's one-pass "
                        "torch op over the bytes it must touch; 1 = memory speed)")
        head = head.replace("  check", f"{'of floor':>10}  check")
    multi_dtype = len(cfg.dtypes) > 1
    prev = None
    for r in rows:
        group = (r["dtype"], r["op"])
        if group != prev:
            lines.append("")
            if multi_dtype:
                lines.append(f"## {r['dtype']}")
            lines.append(head)
            prev = group
        label = r["label"] + (" (graph)" if r["mode"] == "graph" else "")
        if r["error"]:
            status = "error (see below)"
        else:
            status = r["check"] or ""
        lines.append(f"{r['op']:<15}{format_size(r['bytes']):>9}{r['count']:>12}  {label:<{label_w}}"
                     f"{_fmt(r['time_us'], '.2f'):>12}{_fmt(r['algbw_gbps'], '.3f'):>12}"
                     f"{_fmt(r['busbw_gbps'], '.3f'):>12}{_fmt(r['busbw_ratio'], '.2f'):>{ratio_w}}"
                     + (f"{_fmt(r.get('floor_fraction'), '.2f'):>10}" if has_floor else "") + f"  {status}")
    return "\n".join(lines)


# -- files -----------------------------------------------------------------------------------
def output_stem(cfg, meta):
    """<out>/<YYYY-MM-DD>-<card-slug>-<what>, with -2, -3 ... appended rather than overwrite."""
    date = meta["date"][:10]
    what = cfg.name or ("-vs-".join(cfg.backends) + f"-np{meta['world_size']}")
    what = re.sub(r"[^A-Za-z0-9_.+-]+", "-", what).strip("-") or "bench"
    base = os.path.join(cfg.out_dir, f"{date}-{slugify(meta['card'])}-{what}")
    stem, n = base, 1
    while os.path.exists(stem + ".json") or os.path.exists(stem + ".png"):
        n += 1
        stem = f"{base}-{n}"
    return stem


def finish(cfg, world, data):
    """Print, write, and return the exit status (1 on a wrong result or a failed op)."""
    meta = metadata(cfg, world)
    meta["host_layout"] = data.get("host_layout")  # [hosts, ranks per host] across hosts, else None
    rows, baseline = data["results"], data["baseline"]
    add_ratios(rows, baseline)
    print(format_table(rows, meta, cfg, baseline), flush=True)

    failures = [r for r in rows if r.get("check") == "fail"]
    errors = [r for r in rows if r.get("error")]
    for r in failures:
        print(f"pycoll-bench: WRONG RESULT {r['label']} {r['op']} {r['bytes']} B {r['dtype']}: {r['check_error']}",
              file=sys.stderr)
    grouped = {}
    for r in errors:
        grouped.setdefault((r["label"], r["mode"], r["op"], r["dtype"], r["error"]), []).append(r["bytes"])
    for (label, mode, op, dtype, msg), sizes in grouped.items():
        where = format_size(sizes[0]) if len(sizes) == 1 else \
            f"{len(sizes)} sizes from {format_size(min(sizes))} to {format_size(max(sizes))}"
        print(f"pycoll-bench: ERROR {label} {op} {dtype}{' graph' if mode == 'graph' else ''} at {where}: {msg}",
              file=sys.stderr)

    files = {"json": None, "png": None, "calibration": None}
    doc = {
        "schema": SCHEMA,
        "metadata": meta,
        "config": cfg.to_json(),
        "baseline": baseline,
        "labels": data["labels"],
        "results": rows,
        "skipped": data["skipped"],
        "summary": {"rows": len(rows), "check_failures": len(failures), "errors": len(errors),
                    "elapsed_s": data["elapsed_s"]},
        "backend_stats": data.get("backend_stats"),
        "files": files,
    }
    if cfg.calibrate:
        entries, reference = calibrate.fit_entries(rows, cfg.dtypes[0], calibrate.backend_cost_pairs(cfg.device))
        cdoc = calibrate.constants_document(entries, reference, meta, cfg.dtypes[0])
        choices = None
        _C = calibrate.extension() if cfg.device == "cuda" else None
        if _C is not None:  # the engine's built-in choice is kept where nothing clearly beats it
            choices = calibrate.add_cuda_choices(
                cdoc, rows, cfg.dtypes[0], meta["world_size"],
                lambda op, nb, world: _C.cuda_algorithm(op, nb, world, builtin=True))
        existing = calibrate.read_existing(cfg.calibrate_out)
        host_forms = []
        layout = data.get("host_layout")
        hosts_C = calibrate.extension() if layout else None
        if hosts_C is not None:
            # A layout across hosts adds its forms to the file and keeps the one-host constants there.
            host_forms = calibrate.fit_host_forms(
                rows, cfg.dtypes[0], cfg.device, layout[0], layout[1],
                lambda op, nb: hosts_C.host_form(cfg.device, op, layout[0], layout[1], nb, builtin=True),
                link=meta.get("link"))
            if existing:
                cdoc = existing
        cdoc["host_forms"] = calibrate.merge_host_forms(existing.get("host_forms"), host_forms)
        calibrate.write_constants(cfg.calibrate_out, cdoc)
        files["calibration"] = cfg.calibrate_out
        doc["calibration"] = cdoc
        print(f"\n# calibration ({cfg.dtypes[0]}): time_us = alpha_us + beta_us_per_byte * bytes", flush=True)
        print(f"#   {calibrate.how_it_is_used(cfg.calibrate_out)}", flush=True)
        if layout:
            if not host_forms:
                print("#   across hosts: no op measured in both forms (--algo flat,hierarchical): no table of forms",
                      flush=True)
            for t in host_forms:
                steps = ", ".join(f"{f} from {format_size(b)}" for b, f in t["steps"])
                on = f" on links of {t['link']}" if t.get("link") else ""
                print(f"#   {t['device']} {t['num_hosts']}x{t['local_size']}{on} {t['op']}: auto runs {steps} "
                      f"(up to {format_size(t['max_bytes'])})", flush=True)
        elif not entries:
            print("#   no pycoll row with a forced algorithm (ring, tree, oneshot, twoshot): "
                  "\"entries\" is empty; fits of the other rows are under \"reference_entries\"", flush=True)
        for op, t in (choices or {}).items():
            steps = ", ".join(f"{a} from {format_size(b)}" for b, a in t["steps"])
            print(f"#   CUDA auto, {op}: {steps} (up to {format_size(t['max_bytes'])})", flush=True)
        for kind, group in (("", entries), ("(reference) ", reference)):
            for e in group:
                print(f"#   {kind}{e['backend']:<8}{e['algo']:<13}{e['op']:<16}alpha {e['alpha_us']:10.2f} us  "
                      f"beta {e['beta_us_per_byte'] * 1e3:10.5f} ns/B  "
                      f"({e['points']} sizes, rel rms {e['rel_rms_error']:.2f})", flush=True)
    if cfg.save:
        os.makedirs(cfg.out_dir, exist_ok=True)
        stem = output_stem(cfg, meta)
        files["json"] = stem + ".json"
        if cfg.plot:
            try:
                from . import plot
                plot.plot(rows, meta, cfg, stem + ".png")
                files["png"] = stem + ".png"
            except ImportError as exc:
                print(f"pycoll-bench: no plot ({exc}); install matplotlib for the PNG", file=sys.stderr)
        with open(files["json"], "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    print("", flush=True)
    for kind, path in files.items():
        if path:
            print(f"# wrote {kind}: {path}", flush=True)
    return 1 if failures or errors else 0
