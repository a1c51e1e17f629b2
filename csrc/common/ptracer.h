// Letting the ranks on this host read this process's memory with cross-memory attach under Yama's
// ptrace_scope=1, the default of Ubuntu and Debian.
//
// process_vm_readv needs ptrace *attach* access to the process read. With ptrace_scope=1 a process
// may attach only to its own descendants, unless the process to be read names a tracer with
// prctl(PR_SET_PTRACER): then that process and every descendant of it may attach. The ranks one
// torchrun or mp.spawn starts are siblings, so without a declaration no rank may read another and
// every large CPU op stages (cpu/peer_read.h). Each rank therefore names the nearest common
// ancestor of the ranks on its host (their launcher; a rank itself where it started the others):
// only that process's descendants gain access, which are the job's own processes.
//
// Never named: the init process of the host's initial PID namespace (that would let every process
// of the user read the rank, what ptrace_scope=1 exists to prevent); an ancestor that is neither a
// rank nor the parent of one (ranks started apart, whose common ancestor is a session manager,
// tmux or sshd: as wide); or one that cannot be found (a peer's /proc entry unreadable: another
// PID namespace, /proc mounted with hidepid). Scopes
// 0 (no restriction) and 2-3 (attach needs CAP_SYS_PTRACE, which a declaration does not replace)
// need no declaration and get none. A process holds one declaration: this replaces any earlier one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pycoll {

// /proc/sys/kernel/yama/ptrace_scope, or -1 where Yama is not loaded.
int yama_ptrace_scope();

// The nearest process that is an ancestor of, or one of, every pid in `pids` (walking each pid's
// parents in /proc); 0 when none is found.
int64_t nearest_common_ancestor(const std::vector<int64_t>& pids);

// What declare_ptracer_for did: `tracer` named (0 if none) and, for the debug log, why.
struct PtracerDeclaration {
  int64_t tracer = 0;
  std::string what;
};

// What declare_ptracer_for names for these pids under Yama scope `scope`, without naming it.
PtracerDeclaration choose_ptracer(const std::vector<int64_t>& host_pids, int scope);

// Under ptrace_scope=1, names the nearest common ancestor of `host_pids` (this process's among them)
// as this process's tracer (file comment); elsewhere, or where no suitable ancestor exists, does
// nothing.
PtracerDeclaration declare_ptracer_for(const std::vector<int64_t>& host_pids);

}  // namespace pycoll
