// How fast one process can hand a GPU stream to another process on the same GPU with CUDA IPC
// events, with no kernel that spins on a flag the other process writes: the bound for ranks that
// share one GPU (docs/decisions/0039-ipc-event-handoff.md).
//
// Two processes (A, the parent, which measures; B, its child) are forked before any CUDA call and
// meet in a small POSIX shared-memory segment (host-side round counters, the IPC handles, a
// barrier, an abort flag). Each opens device 0, makes a non-blocking stream and an event created
// with cudaEventInterprocess | cudaEventDisableTiming, exports it with cudaIpcGetEventHandle and
// opens the peer's with cudaIpcOpenEventHandle. Times are taken on A with CLOCK_MONOTONIC and
// reported as microseconds per one-way handoff (round trip / 2): median, p90 and min over the
// repeats (each repeat's mean), and p50 / p99 over the single rounds.
//
// Variants (--variant, one per run):
//   host          (a) the shared-memory counters alone, both hosts spinning; no CUDA.
//   event-sync    (b1) no kernel. A: record eA on sA, publish round g. B: waits on the host for
//                 round g, cudaStreamWaitEvent(sB, eA), record eB on sB, publish. A: waits on the
//                 host for B's round, cudaStreamWaitEvent(sA, eB), then cudaEventSynchronize(eB):
//                 the round ends when A's host knows B's stream has passed the point that followed
//                 A's. One round: two host handoffs, one GPU dependency across the processes, one
//                 completion seen by a host.
//   event-query   (b2) the same, A spinning on cudaEventQuery(eB) instead of cudaEventSynchronize.
//   kernel-sync   (c1) as b1 with a tiny kernel (one CTA, one thread reads and writes one int)
//                 launched before each record, what a collective step costs: kernel + record +
//                 wait across the processes.
//   kernel-query  (c2) as c1 with cudaEventQuery spinning.
//   chain         (d0) the GPU-only chain, see run_chain_a: the hosts enqueue every step first,
//                 the GPU then runs 2 x C dependent steps across the two processes with no host in
//                 the loop.
//   chain-kernel  (d1) the same with the tiny kernel in every step.
// The kernel variants check the order: the int is a step counter in A's memory (opened by B with
// cudaIpcOpenMemHandle); A's kernel of round g expects 2g and writes 2g+1, B's expects 2g+1 and
// writes 2g+2; a kernel that finds another value counts an order error. The line says "order ok"
// or the count.
//
// Every CUDA call is checked (the failing call is printed, exit status 1); every host wait gives
// up after 10 s; a watchdog (alarm, --watchdog-s) ends a process stuck inside a CUDA call; the
// child dies with its parent (PR_SET_PDEATHSIG) and the parent reaps the child with a bound (then
// SIGKILL). The shared-memory name is unlinked right after it is mapped, so no exit path leaves it
// behind. Without a CUDA device the program says "no CUDA device" and exits with status 2.
//
//   nvcc -O2 -o /tmp/ipc_pingpong benchmarks/ipc_event_pingpong.cu
//   /tmp/ipc_pingpong --variant kernel-sync
//   bash benchmarks/ipc_event_pingpong.sh --both      # every variant, without then with MPS
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr double kWaitLimitS = 10.0;   // every host wait in the rounds gives up after this
constexpr double kSetupLimitS = 30.0;  // waits across the peer's CUDA start (driver start, MPS server)

struct alignas(64) Line {
  std::atomic<long> v;
};

// The shared segment. Each counter on its own cache line.
struct Shared {
  Line seq[2];      // seq[r]: rounds rank r has published (B: rounds whose record is enqueued)
  Line stop;        // A: no more rounds
  Line arrive[2];   // barrier generations
  Line abort_flag;  // set by the side that fails; the other exits
  Line go;          // A: 1 = a device is there, B may start CUDA; -1 = B exits
  Line ready[2];    // the handles below are written
  cudaIpcEventHandle_t event[2];
  cudaIpcMemHandle_t mem;
};

Shared* g_sh = nullptr;
int g_rank = 0;  // 0 = A (parent, measures), 1 = B (child)
pid_t g_parent = 0;
pid_t g_child = -1;
bool g_child_reaped = false;
int g_child_status = 0;
const char* const kName[2] = {"A", "B"};

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// A: waits at most `seconds` for the child to exit; true when it has.
bool reap_child(double seconds) {
  if (g_child <= 0 || g_child_reaped) return true;
  const double end = now() + seconds;
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(g_child, &st, WNOHANG);
    if (r == g_child || (r < 0 && errno == ECHILD)) {
      g_child_reaped = true;
      g_child_status = st;
      return true;
    }
    if (now() > end) return false;
    usleep(1000);
  }
}

// A: the child exits by itself once it sees the abort flag; else it is killed.
void stop_child() {
  if (g_rank != 0 || g_child <= 0 || g_child_reaped) return;
  if (reap_child(2.0)) return;
  kill(g_child, SIGKILL);
  if (!reap_child(5.0)) fprintf(stderr, "ipc_pingpong [A]: child %d did not exit after SIGKILL\n", (int)g_child);
}

[[noreturn]] void exit_failed(int status) {
  fflush(stdout);
  fflush(stderr);
  if (g_rank == 0) stop_child();
  _exit(status);
}

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...) {
  if (g_sh) g_sh->abort_flag.v.store(1);
  fprintf(stderr, "ipc_pingpong [%s] error: ", kName[g_rank]);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit_failed(1);
}

// The peer set the abort flag: it has printed why.
[[noreturn]] void peer_failed() {
  if (g_rank == 0) fprintf(stderr, "ipc_pingpong [A]: B failed (its message is above), stopping\n");
  exit_failed(1);
}

std::string describe_status(int st) {
  char b[64];
  if (WIFEXITED(st))
    snprintf(b, sizeof b, "exit status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(b, sizeof b, "signal %d", WTERMSIG(st));
  else
    snprintf(b, sizeof b, "wait status %d", st);
  return b;
}

void check_peer_alive() {
  if (g_sh->abort_flag.v.load()) peer_failed();
  if (g_rank == 1) {
    if (getppid() != g_parent) die("A exited");
  } else {
    int st = 0;
    if (waitpid(g_child, &st, WNOHANG) == g_child) {
      g_child_reaped = true;
      g_child_status = st;
      if (g_sh->abort_flag.v.load()) peer_failed();
      die("B exited unexpectedly (%s)", describe_status(st).c_str());
    }
  }
}

// Spins until done(); every 256 spins checks the abort flag and the clock, and after 50 us yields
// the CPU at each check; after 1 ms checks that the peer is still alive every 10 ms; gives up
// after `limit` seconds.
template <class Done>
void wait_until(Done done, const char* what, double limit = kWaitLimitS) {
  if (done()) return;
  const double t0 = now();
  double next_check = t0 + 1e-3;
  for (unsigned i = 1;; ++i) {
    if (done()) return;
    cpu_relax();
    if ((i & 255) == 0) {
      if (g_sh->abort_flag.v.load(std::memory_order_relaxed)) peer_failed();
      const double t = now();
      if (t - t0 > 50e-6) sched_yield();  // the peer may need this CPU (more spinners than CPUs)
      if (t > next_check) {
        check_peer_alive();
        next_check = t + 10e-3;
      }
      if (t - t0 > limit) die("timed out after %.0f s waiting for %s", limit, what);
    }
  }
}

long barrier_generation = 0;
void barrier(const char* what, double limit = kWaitLimitS) {
  const long gen = ++barrier_generation;
  g_sh->arrive[g_rank].v.store(gen, std::memory_order_release);
  wait_until([&] { return g_sh->arrive[1 - g_rank].v.load(std::memory_order_acquire) >= gen; }, what, limit);
}

void on_alarm(int) {
  static const char msg[] = "ipc_pingpong: watchdog expired (a CUDA call or wait did not return), exiting\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  if (g_sh) g_sh->abort_flag.v.store(1);
  if (g_rank == 0 && g_child > 0 && !g_child_reaped) kill(g_child, SIGKILL);
  _exit(3);
}

#define CK(call)                                                                                         \
  do {                                                                                                   \
    const cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                               \
      die("%s failed: %s (%s), line %d", #call, cudaGetErrorName(e_), cudaGetErrorString(e_), __LINE__); \
  } while (0)

// The tiny step of the kernel variants: one CTA; one thread reads the step counter, counts an order
// error unless it holds `expect`, writes `next`.
__global__ void step_kernel(volatile int* counter, int* errors, int expect, int next) {
  if (threadIdx.x == 0) {
    if (*counter != expect) atomicAdd(errors, 1);
    *counter = next;
    __threadfence();
  }
}

struct Options {
  std::string variant;
  long rounds = 2000;       // rounds per repeat (b, c, a); fewer if the budget asks
  long warmup = 200;        // rounds before the first repeat
  int repeats = 15;         // repeats (median and p90 over these)
  long chain_rounds = 128;  // rounds per chain repeat (d): 2 x this many dependent steps
  double budget_s = 3.0;    // measured seconds per variant, about
  int watchdog_s = 0;       // alarm: a process still running after this long exits (0: 40 + 3 x budget)
  int cpu[2] = {-1, -1};    // --cpus A,B: pin the two main threads
  bool header = true;
};

struct Variant {
  const char* name;
  const char* tag;
  bool cuda, kernel, query, chain;
};
const Variant kVariants[] = {
    {"host", "(a)", false, false, false, false},       {"event-sync", "(b1)", true, false, false, false},
    {"event-query", "(b2)", true, false, true, false}, {"kernel-sync", "(c1)", true, true, false, false},
    {"kernel-query", "(c2)", true, true, true, false}, {"chain", "(d0)", true, false, false, true},
    {"chain-kernel", "(d1)", true, true, false, true},
};

// Per-process CUDA state.
struct Cuda {
  cudaStream_t stream = nullptr;
  cudaEvent_t own = nullptr;   // this process's interprocess event
  cudaEvent_t peer = nullptr;  // the peer's, opened from its handle
  int* mem = nullptr;          // [0] step counter, [1] order errors: A's allocation, opened by B
};

// The chain's gate: a host function at the head of A's stream holds the whole chain (B's first
// step waits on A's first record, behind it) until A's host opens it.
struct Gate {
  std::atomic<long> open{0};
  std::atomic<long> want{0};
  std::atomic<int> timed_out{0};
};
void CUDART_CB gate_fn(void* p) {
  Gate* gate = static_cast<Gate*>(p);
  const long want = gate->want.load(std::memory_order_acquire);
  const double t0 = now();
  for (unsigned i = 1; gate->open.load(std::memory_order_acquire) < want; ++i) {
    cpu_relax();
    if ((i & 1023) == 0 && (g_sh->abort_flag.v.load() || now() - t0 > kWaitLimitS)) {
      gate->timed_out.store(1);
      return;
    }
  }
}

double percentile(std::vector<double> v, double p) {  // nearest rank
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = (size_t)(p * v.size() + 0.999999);
  if (k < 1) k = 1;
  if (k > v.size()) k = v.size();
  return v[k - 1];
}

std::string mps_state() {
  const char* env = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string dir = env && *env ? env : "/tmp/nvidia-mps";
  const bool pipe = access((dir + "/control").c_str(), F_OK) == 0;
  return pipe ? "daemon(" + dir + ")" : "off";
}

void print_cuda_header(const Options& o) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0, mode = 0, ipc_events = 0, count = 0;
  unsigned flags = 0;
  CK(cudaGetDeviceCount(&count));
  CK(cudaDriverGetVersion(&driver));
  CK(cudaRuntimeGetVersion(&runtime));
  CK(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0));
  CK(cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, 0));
  CK(cudaGetDeviceFlags(&flags));
  char bus[32] = "?";
  CK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  const char* modes[] = {"default", "exclusive-thread", "prohibited", "exclusive-process"};
  const unsigned sched = flags & cudaDeviceScheduleMask;
  printf("# gpu: device 0 of %d: %s, sm_%d%d, %s, compute mode %s, IPC events %s\n", count, prop.name, prop.major,
         prop.minor, bus, mode >= 0 && mode < 4 ? modes[mode] : "?", ipc_events ? "supported" : "NOT supported");
  printf("# cuda: driver API %d.%d, runtime %d.%d, host sync %s (device flags 0x%x)\n", driver / 1000,
         driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
         sched == cudaDeviceScheduleSpin           ? "spin"
         : sched == cudaDeviceScheduleYield        ? "yield"
         : sched == cudaDeviceScheduleBlockingSync ? "blocking"
                                                   : "auto",
         flags);
  fflush(stdout);
  (void)o;
}

void print_common_header(const Options& o) {
  timespec res;
  clock_getres(CLOCK_MONOTONIC, &res);
  const double t0 = now();
  for (int i = 0; i < 100000; ++i) now();
  const double read_ns = (now() - t0) * 1e9 / 100000;
  printf("# clock: CLOCK_MONOTONIC on A, resolution %ld ns, one read %.0f ns (one per round)\n", (long)res.tv_nsec,
         read_ns);
  char pin[64] = "unpinned";
  if (o.cpu[0] >= 0) snprintf(pin, sizeof pin, "A on CPU %d, B on CPU %d", o.cpu[0], o.cpu[1]);
  printf("# host: %ld CPUs online, %s; mps: %s (CUDA_MPS_PIPE_DIRECTORY=%s)\n", sysconf(_SC_NPROCESSORS_ONLN), pin,
         mps_state().c_str(), getenv("CUDA_MPS_PIPE_DIRECTORY") ? getenv("CUDA_MPS_PIPE_DIRECTORY") : "unset");
  printf("# one-way handoff = round trip / 2, microseconds; median/p90/min over repeats, p50/p99 over rounds\n");
}

struct Result {
  std::vector<double> repeat_us;  // per repeat: mean one-way
  std::vector<double> round_us;   // per round: one-way (b, c, a), or per host step (d)
  long n = 0;                     // rounds per repeat
};

void print_result(const Variant& v, const Result& r, const std::string& order) {
  const bool chain = v.chain;
  printf(
      "%-5s %-13s one-way us: median %8.2f  p90 %8.2f  min %8.2f | %s p50 %7.2f  p99 %7.2f | %s=%ld x %zu | "
      "order %s | mps=%s\n",
      v.tag, v.name, percentile(r.repeat_us, 0.5), percentile(r.repeat_us, 0.9),
      r.repeat_us.empty() ? 0.0 : *std::min_element(r.repeat_us.begin(), r.repeat_us.end()),
      chain ? "host step us" : "rounds", percentile(r.round_us, 0.5), percentile(r.round_us, 0.99), chain ? "C" : "N",
      r.n, r.repeat_us.size(), order.c_str(), mps_state().c_str());
  fflush(stdout);
}

// Runs warm-up then repeats of `round(g)` on A; one clock read per round. The rounds per repeat
// shrink (to at least 50) when the warm-up says the repeats would take more than the budget.
// Very slow rounds also end the warm-up early (after half the budget, 10 rounds at least) and the
// repeats (after twice the budget, 3 repeats at least).
template <class Round>
Result measure_rounds(const Options& o, Round round, long& g) {
  const double tw = now();
  double mid = tw;
  long warm = o.warmup;
  bool cut = false;
  for (long i = 0; i < warm; ++i) {
    if (i == warm / 2) mid = now();
    round(g++);
    if (i + 1 >= 10 && i + 1 < warm && now() - tw > o.budget_s / 2) {
      warm = i + 1;
      cut = true;
    }
  }
  const double per_round = cut ? (now() - tw) / warm : (now() - mid) / std::max(1L, warm - warm / 2);
  Result r;
  r.n = o.rounds;
  if (per_round * r.n * o.repeats > o.budget_s)
    r.n = std::max(50L, std::min(o.rounds, (long)(o.budget_s / (per_round * o.repeats))));
  r.round_us.reserve(r.n * o.repeats);
  const double begin = now();
  for (int rep = 0; rep < o.repeats; ++rep) {
    if (rep >= 3 && now() - begin > 2 * o.budget_s) break;
    const double start = now();
    double prev = start;
    for (long i = 0; i < r.n; ++i) {
      round(g++);
      const double t = now();
      r.round_us.push_back((t - prev) * 1e6 / 2);
      prev = t;
    }
    r.repeat_us.push_back((prev - start) * 1e6 / r.n / 2);
  }
  return r;
}

// B follows A's rounds until A says stop; `step(g)` is B's part of round g.
template <class Step>
long follow_rounds(Step step) {
  long g = 0;
  for (;; ++g) {
    wait_until(
        [&] {
          return g_sh->seq[0].v.load(std::memory_order_acquire) >= g + 1 ||
                 g_sh->stop.v.load(std::memory_order_acquire);
        },
        "A's next round");
    if (g_sh->seq[0].v.load(std::memory_order_acquire) < g + 1) return g;
    step(g);
    g_sh->seq[1].v.store(g + 1, std::memory_order_release);
  }
}

void wait_peer_round(long n, const char* what) {
  wait_until([&] { return g_sh->seq[1].v.load(std::memory_order_acquire) >= n; }, what);
}

// (a): the counters alone.
void run_host(const Options& o, const Variant& v) {
  if (g_rank == 1) {
    follow_rounds([](long) {});
    return;
  }
  long g = 0;
  Result r = measure_rounds(
      o,
      [&](long gg) {
        g_sh->seq[0].v.store(gg + 1, std::memory_order_release);
        wait_peer_round(gg + 1, "B's round");
      },
      g);
  g_sh->stop.v.store(1, std::memory_order_release);
  print_result(v, r, "n/a");
}

void launch_step(const Cuda& c, long g, int side) {
  // A's kernel of round g: 2g -> 2g+1; B's: 2g+1 -> 2g+2.
  step_kernel<<<1, 32, 0, c.stream>>>(c.mem, c.mem + 1, (int)(2 * g + side), (int)(2 * g + side + 1));
  CK(cudaGetLastError());
}

void spin_query(cudaEvent_t e) {
  double t0 = 0;
  for (unsigned i = 0;; ++i) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return;
    if (r != cudaErrorNotReady)
      die("cudaEventQuery(B's event) failed: %s (%s)", cudaGetErrorName(r), cudaGetErrorString(r));
    if ((i & 63) == 63) {
      if (g_sh->abort_flag.v.load(std::memory_order_relaxed)) peer_failed();
      const double t = now();
      if (t0 == 0)
        t0 = t;
      else if (t - t0 > kWaitLimitS)
        die("timed out after %.0f s in cudaEventQuery spin on B's event", kWaitLimitS);
    }
  }
}

// (b), (c): one host-closed round at a time.
Result run_rounds_a(const Options& o, const Variant& v, const Cuda& c, long& g) {
  return measure_rounds(
      o,
      [&](long gg) {
        if (v.kernel) launch_step(c, gg, 0);
        CK(cudaEventRecord(c.own, c.stream));
        g_sh->seq[0].v.store(gg + 1, std::memory_order_release);
        wait_peer_round(gg + 1, "B's round");
        CK(cudaStreamWaitEvent(c.stream, c.peer, 0));
        if (v.query)
          spin_query(c.peer);
        else
          CK(cudaEventSynchronize(c.peer));
      },
      g);
}

// (d): the GPU-only chain. cudaStreamWaitEvent waits for the event's most recent record at the
// time of the call (a wait on an event not yet recorded is no wait at all), so a dependency
// A-step k -> B-step k can only be enqueued after A's host has called the record of step k, and
// B-step k -> A-step k+1 after B's host has called its record: however the events are arranged
// (one per side here; one per step would change nothing), the hosts must alternate once per
// step. With strict alternation one event per side is enough: A records step k+1 only after B
// has enqueued its wait on step k, so every wait captures the intended record. What can be
// enqueued ahead is everything but the host alternation, and the GPU need not keep pace with it:
// a host function at the head of A's stream (the gate) holds the chain until both hosts have
// enqueued all C rounds; then A opens the gate and times until B's last event has completed. That
// time over 2 x C is the one-way handoff with no host in the loop; the gate's own release (a few
// microseconds, once) is in it. The hosts' enqueue time per round is reported beside it ("host
// step"): without the gate the chain would run at the slower of the two.
Result run_chain_a(const Options& o, const Variant& v, const Cuda& c, long& g) {
  Gate gate;
  Result r;
  r.n = o.chain_rounds;
  const double budget_end = now() + o.budget_s;
  const int warm_repeats = 2;
  for (int rep = 0; rep < warm_repeats + o.repeats; ++rep) {
    gate.want.store(rep + 1, std::memory_order_release);
    CK(cudaLaunchHostFunc(c.stream, gate_fn, &gate));
    const double start = now();
    for (long i = 0; i < o.chain_rounds; ++i, ++g) {
      // B's record of round g-1 is enqueued
      wait_peer_round(g,
                      "B's enqueue of the previous round (an enqueue blocked behind the gate? lower --chain-rounds)");
      CK(cudaStreamWaitEvent(c.stream, c.peer, 0));
      if (v.kernel) launch_step(c, g, 0);
      CK(cudaEventRecord(c.own, c.stream));
      g_sh->seq[0].v.store(g + 1, std::memory_order_release);
    }
    wait_peer_round(g, "B's enqueue of the last round");
    const double enqueued = now();
    gate.open.store(rep + 1, std::memory_order_release);
    CK(cudaEventSynchronize(c.peer));  // B's record of the last round
    const double end = now();
    if (gate.timed_out.load())
      die("the chain's gate was not opened within %.0f s: an enqueue blocked while the gate held the stream "
          "(queue full?); lower --chain-rounds",
          kWaitLimitS);
    if (rep < warm_repeats) continue;
    r.repeat_us.push_back((end - enqueued) * 1e6 / (2 * o.chain_rounds));
    r.round_us.push_back((enqueued - start) * 1e6 / o.chain_rounds);
    if (now() > budget_end && r.repeat_us.size() >= 3) break;
  }
  return r;
}

void run_cuda(const Options& o, const Variant& v) {
  if (g_rank == 0) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      fprintf(stderr, "ipc_pingpong: no CUDA device (cudaGetDeviceCount: %s: %s, count %d)\n",
              e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e), cudaGetErrorString(e), n);
      g_sh->go.v.store(-1);
      exit_failed(2);
    }
    g_sh->go.v.store(1);
  } else {
    wait_until([] { return g_sh->go.v.load() != 0; }, "A's device check", kSetupLimitS);
    if (g_sh->go.v.load() < 0) exit_failed(2);
  }

  Cuda c;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&c.own, cudaEventInterprocess | cudaEventDisableTiming));
  CK(cudaIpcGetEventHandle(&g_sh->event[g_rank], c.own));
  if (g_rank == 0 && o.header) print_cuda_header(o);
  if (g_rank == 0) {
    CK(cudaMalloc(&c.mem, 2 * sizeof(int)));
    CK(cudaMemset(c.mem, 0, 2 * sizeof(int)));
    CK(cudaDeviceSynchronize());
    CK(cudaIpcGetMemHandle(&g_sh->mem, c.mem));
  }
  g_sh->ready[g_rank].v.store(1, std::memory_order_release);
  wait_until([] { return g_sh->ready[1 - g_rank].v.load(std::memory_order_acquire) != 0; }, "the peer's handles",
             kSetupLimitS);
  CK(cudaIpcOpenEventHandle(&c.peer, g_sh->event[1 - g_rank]));
  if (g_rank == 1) {
    void* p = nullptr;
    CK(cudaIpcOpenMemHandle(&p, g_sh->mem, cudaIpcMemLazyEnablePeerAccess));
    c.mem = static_cast<int*>(p);
  }
  // Load the kernel now, in both processes: with lazy loading (CUDA's default) a kernel's first
  // launch may synchronize the context, which would deadlock behind the chain's closed gate.
  int* scratch = nullptr;
  CK(cudaMalloc(&scratch, 2 * sizeof(int)));
  CK(cudaMemsetAsync(scratch, 0, 2 * sizeof(int), c.stream));
  step_kernel<<<1, 32, 0, c.stream>>>(scratch, scratch + 1, 0, 1);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(c.stream));
  CK(cudaFree(scratch));
  barrier("the peer's setup", kSetupLimitS);

  Result r;
  long g = 0;
  if (g_rank == 1) {
    g = follow_rounds([&](long gg) {
      CK(cudaStreamWaitEvent(c.stream, c.peer, 0));
      if (v.kernel) launch_step(c, gg, 1);
      CK(cudaEventRecord(c.own, c.stream));
    });
  } else {
    r = v.chain ? run_chain_a(o, v, c, g) : run_rounds_a(o, v, c, g);
    g_sh->stop.v.store(1, std::memory_order_release);
  }
  CK(cudaStreamSynchronize(c.stream));
  barrier("the end of the rounds");

  std::string order = "n/a";
  if (g_rank == 0 && v.kernel) {
    int host[2] = {0, 0};
    CK(cudaMemcpy(host, c.mem, sizeof host, cudaMemcpyDeviceToHost));
    char b[160];
    if (host[1] == 0 && host[0] == (int)(2 * g))
      snprintf(b, sizeof b, "ok");
    else
      snprintf(b, sizeof b, "ERRORS: %d kernels ran out of order; counter %d, expected %ld", host[1], host[0], 2 * g);
    order = b;
  }
  // The imported event and memory go first, then (after the barrier) what was exported.
  if (g_rank == 1) CK(cudaIpcCloseMemHandle(c.mem));
  CK(cudaEventDestroy(c.peer));
  barrier("the peer's imports closed");
  CK(cudaEventDestroy(c.own));
  CK(cudaStreamDestroy(c.stream));
  if (g_rank == 0) {
    CK(cudaFree(c.mem));
    print_result(v, r, order);
    if (order != "ok" && order != "n/a") exit_failed(1);
  }
}

[[noreturn]] void usage(const char* msg) {
  if (msg) fprintf(stderr, "ipc_pingpong: %s\n", msg);
  fprintf(stderr,
          "usage: ipc_pingpong --variant NAME [--rounds N] [--warmup N] [--repeats R] [--chain-rounds C]\n"
          "                    [--budget-s S] [--watchdog-s S] [--cpus A,B] [--no-header]\n"
          "variants:");
  for (const Variant& v : kVariants) fprintf(stderr, " %s", v.name);
  fprintf(stderr, "\n");
  exit(2);
}

long parse_long(const char* s, const char* what, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long x = strtol(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi) {
    char b[128];
    snprintf(b, sizeof b, "bad %s '%s' (%ld..%ld)", what, s, lo, hi);
    usage(b);
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--variant")
      o.variant = value();
    else if (a == "--rounds")
      o.rounds = parse_long(value(), "--rounds", 1, 100000000);
    else if (a == "--warmup")
      o.warmup = parse_long(value(), "--warmup", 2, 100000000);
    else if (a == "--repeats")
      o.repeats = (int)parse_long(value(), "--repeats", 1, 100000);
    else if (a == "--chain-rounds")
      o.chain_rounds = parse_long(value(), "--chain-rounds", 1, 100000);
    else if (a == "--budget-s")
      o.budget_s = (double)parse_long(value(), "--budget-s", 1, 3600);
    else if (a == "--watchdog-s")
      o.watchdog_s = (int)parse_long(value(), "--watchdog-s", 1, 86400);
    else if (a == "--cpus") {
      const char* s = value();
      if (sscanf(s, "%d,%d", &o.cpu[0], &o.cpu[1]) != 2 || o.cpu[0] < 0 || o.cpu[1] < 0) usage("bad --cpus");
    } else if (a == "--no-header")
      o.header = false;
    else if (a == "-h" || a == "--help")
      usage(nullptr);
    else
      usage(("unknown argument " + a).c_str());
  }
  if ((2.0 * (o.rounds + o.warmup) + 2) * o.repeats >= 2e9 || 2.0 * o.chain_rounds * (o.repeats + 2) >= 2e9)
    usage("too many rounds for the kernels' int counter");
  const Variant* v = nullptr;
  for (const Variant& x : kVariants)
    if (o.variant == x.name) v = &x;
  if (!v) usage(o.variant.empty() ? "--variant is required" : ("unknown variant " + o.variant).c_str());
  if (o.watchdog_s == 0) o.watchdog_s = 40 + (int)(3 * o.budget_s);

  // The shared segment: mapped, then its name unlinked at once (the mapping stays, and is
  // inherited by the child), so that no exit path leaves the name behind.
  char name[64];
  snprintf(name, sizeof name, "/ipc_pingpong.%d", (int)getpid());
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    fprintf(stderr, "ipc_pingpong: shm_open(%s): %s\n", name, strerror(errno));
    return 1;
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, sizeof(Shared)) == 0) p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  close(fd);
  shm_unlink(name);
  if (p == MAP_FAILED) {
    fprintf(stderr, "ipc_pingpong: shared memory (%s, %zu bytes): %s\n", name, sizeof(Shared), strerror(map_errno));
    return 1;
  }
  g_sh = new (p) Shared();

  if (o.header) print_common_header(o);
  fflush(stdout);
  fflush(stderr);
  g_parent = getpid();
  // Fork before any CUDA call: a child may not use a CUDA context its parent created.
  const pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "ipc_pingpong: fork: %s\n", strerror(errno));
    return 1;
  }
  if (pid == 0) {
    g_rank = 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != g_parent) _exit(1);  // the parent died before the line above
  } else {
    g_child = pid;
  }
  signal(SIGALRM, on_alarm);
  alarm(o.watchdog_s);
  if (o.cpu[0] >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(o.cpu[g_rank], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
      die("sched_setaffinity(CPU %d): %s", o.cpu[g_rank], strerror(errno));
  }

  if (v->cuda)
    run_cuda(o, *v);
  else
    run_host(o, *v);

  if (g_rank == 1) {
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  alarm(0);
  if (!reap_child(10.0)) {
    fprintf(stderr, "ipc_pingpong [A]: B did not exit within 10 s of the end\n");
    exit_failed(1);
  }
  if (!WIFEXITED(g_child_status) || WEXITSTATUS(g_child_status) != 0) {
    fprintf(stderr, "ipc_pingpong [A]: B ended with %s\n", describe_status(g_child_status).c_str());
    return 1;
  }
  return 0;
}
