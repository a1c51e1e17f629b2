#include "common/ptracer.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/check.h"

namespace pycoll {

namespace {

// The kernel's fixed inode number of the initial PID namespace (PROC_PID_INIT_INO): pid 1 there is
// the host's init, not a container's launcher.
constexpr const char* kInitialPidNamespace = "pid:[4026531836]";

// The parent of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces,
// parentheses and newlines, so the whole file is read and the fields taken after the last ')');
// 0 for a process whose parent lies outside this PID namespace (docker exec, nsenter); -1 when it
// cannot be read.
int64_t parent_of(int64_t pid) {
  std::ifstream f(str("/proc/", pid, "/stat"));
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 1));
  std::string state;
  int64_t ppid = -1;
  if (!(rest >> state >> ppid)) return -1;
  return ppid;
}

// pid, its parent, its parent's parent, ... up to 1 or to the last ancestor inside this PID
// namespace; empty when a link cannot be read.
std::vector<int64_t> lineage(int64_t pid) {
  std::vector<int64_t> chain;
  for (int64_t p = pid; p > 0;) {
    chain.push_back(p);
    if (p == 1) return chain;
    if (chain.size() > 4096) return {};  // a cycle can only come from pids reused while we walk
    p = parent_of(p);
    if (p == 0) return chain;
  }
  return {};
}

std::string comm_of(int64_t pid) {
  std::ifstream f(str("/proc/", pid, "/comm"));
  std::string name;
  std::getline(f, name);
  return name.empty() ? "?" : name;
}

bool in_initial_pid_namespace() {
  char link[64] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
  // Unreadable: assume the host's, so that init is never named by mistake.
  return n <= 0 || std::strcmp(link, kInitialPidNamespace) == 0;
}

}  // namespace

int yama_ptrace_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(f >> scope)) return -1;
  return scope;
}

int64_t nearest_common_ancestor(const std::vector<int64_t>& pids) {
  if (pids.empty()) return 0;
  std::vector<std::vector<int64_t>> chains;
  for (const int64_t pid : pids) {
    chains.push_back(lineage(pid));
    if (chains.back().empty()) return 0;
  }
  for (const int64_t candidate : chains[0]) {  // nearest first
    const bool shared = std::all_of(chains.begin() + 1, chains.end(), [&](const std::vector<int64_t>& c) {
      return std::find(c.begin(), c.end(), candidate) != c.end();
    });
    if (shared) return candidate;
  }
  return 0;
}

PtracerDeclaration choose_ptracer(const std::vector<int64_t>& host_pids, int scope) {
  if (scope != 1 || host_pids.size() < 2) return {};
  const int64_t ancestor = nearest_common_ancestor(host_pids);
  if (ancestor == 0) {
    return {0,
            "Yama ptrace_scope=1, and no common ancestor of the ranks on this host was found in /proc (another PID "
            "namespace, or /proc mounted with hidepid): no tracer named, so no peer may read this rank in place"};
  }
  if (ancestor == 1 && in_initial_pid_namespace()) {
    return {0,
            "Yama ptrace_scope=1, and the ranks on this host share no ancestor but init: not named as their tracer "
            "(that would let any process of the user read this rank), so no peer may read it in place"};
  }
  // Only a launcher: one of the ranks, or the parent of one. Ranks started apart (separate
  // terminals, tmux panes, ssh sessions) share only a session manager or server, whose
  // descendants are most of the user's processes.
  const bool launcher = std::any_of(host_pids.begin(), host_pids.end(),
                                    [&](int64_t pid) { return pid == ancestor || parent_of(pid) == ancestor; });
  if (!launcher) {
    return {0, str("Yama ptrace_scope=1, and the nearest common ancestor of the ranks on this host, process ", ancestor,
                   " (", comm_of(ancestor),
                   "), neither is a rank nor started one (ranks started apart): not named as "
                   "their tracer, so no peer may read this rank in place")};
  }
  return {ancestor, str("Yama ptrace_scope=1: named process ", ancestor, " (", comm_of(ancestor),
                        "), the nearest common ancestor of the ranks on this host, as this rank's tracer, so that its "
                        "peers may read its buffers in place (PYCOLL_CPU_PEER_READ=off names none)")};
}

PtracerDeclaration declare_ptracer_for(const std::vector<int64_t>& host_pids) {
  PtracerDeclaration d = choose_ptracer(host_pids, yama_ptrace_scope());
#ifdef PR_SET_PTRACER
  if (d.tracer != 0 && prctl(PR_SET_PTRACER, static_cast<unsigned long>(d.tracer), 0, 0, 0) != 0) {
    d = {0, str("Yama ptrace_scope=1, and naming process ", d.tracer, " as this rank's tracer failed (",
                std::strerror(errno), "): no peer may read it in place")};
  }
#else
  if (d.tracer != 0) d = {0, "Yama ptrace_scope=1, and this build has no PR_SET_PTRACER: no peer may read it in place"};
#endif
  return d;
}

}  // namespace pycoll
