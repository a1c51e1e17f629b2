"""The BASE side of `make bench-compare`: a git worktree of BASE with its extension built in place.

Worktrees live under .bench-compare/<commit>/ (git-ignored) and are reused: a second comparison
against the same BASE builds nothing. When BASE's native sources (csrc/, setup.py) are exactly the
working tree's and the working tree's extension is built, its binary is copied instead of
compiled again (the same sources make the same binary; this is what `BASE=HEAD` with Python-only
changes costs).
"""
import glob
import os
import shutil
import subprocess
import sys

from harness import REPO_ROOT

CACHE = os.path.join(REPO_ROOT, ".bench-compare")
NATIVE = ("csrc", "setup.py")


def _git(*args, cwd=REPO_ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _extension(tree):
    found = sorted(glob.glob(os.path.join(tree, "pycollectives", "_C*.so")))
    return found[0] if found else None


def _native_sources_match(commit):
    """True when csrc/ and setup.py of `commit` are byte for byte the working tree's."""
    changed = subprocess.run(["git", "diff", "--quiet", commit, "--", *NATIVE], cwd=REPO_ROOT).returncode != 0
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *NATIVE)
    return not changed and not untracked


def prepare_base(ref, log=print):
    """Path of a tree holding BASE's pycollectives, built. Raises on a failed build."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = os.path.join(CACHE, commit)
    if not os.path.isdir(os.path.join(tree, "pycollectives")):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO_ROOT, check=False)
        _git("worktree", "add", "--force", "--detach", tree, commit)
    if _extension(tree):
        log(f"bench-compare: BASE {ref} ({commit[:12]}): built already in {os.path.relpath(tree, REPO_ROOT)}")
        return tree, commit
    work_so = _extension(REPO_ROOT)
    if work_so and _native_sources_match(commit):
        shutil.copy2(work_so, os.path.join(tree, "pycollectives", os.path.basename(work_so)))
        log(f"bench-compare: BASE {ref} ({commit[:12]}) has the working tree's native sources: its extension is a copy")
        return tree, commit
    log(f"bench-compare: building BASE {ref} ({commit[:12]}) in {os.path.relpath(tree, REPO_ROOT)} ...")
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(1, os.cpu_count() or 1)))
    if not env.get("CUDA_HOME") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["CUDA_HOME"] = "/usr/local/cuda"
    logfile = os.path.join(tree, "bench-compare-build.log")
    with open(logfile, "w") as fh:
        rc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, env=env,
                            stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not _extension(tree):
        with open(logfile) as fh:
            tail = "".join(fh.readlines()[-30:])
        raise RuntimeError(f"bench-compare: building BASE failed (log: {logfile}):\n{tail}")
    return tree, commit
