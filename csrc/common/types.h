// Plain enums shared by every engine (CPU and CUDA). No torch includes here so
// kernels and transports can use them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pycoll {

// Element types the engines move and reduce. Values are stable: they travel in
// the per-op header that ranks compare to detect mismatched calls.
enum class DType : int32_t {
  Float32 = 0,
  Float64 = 1,
  Float16 = 2,
  BFloat16 = 3,
  Int8 = 4,
  UInt8 = 5,
  Int32 = 6,
  Int64 = 7,
  Bool = 8,
  Int16 = 9,
  Float8E4M3 = 10,  // torch.float8_e4m3fn
  Float8E5M2 = 11,  // torch.float8_e5m2
};

// Reduction applied element-wise. AVG and PREMUL_SUM are carried explicitly so
// an engine can fold the scaling into its final store instead of an extra pass.
enum class ReduceKind : int32_t {
  Sum = 0,
  Avg = 1,
  Product = 2,
  Min = 3,
  Max = 4,
  BAnd = 5,
  BOr = 6,
  BXor = 7,
  PremulSum = 8,
};

// Algorithm names are the same on both engines. Auto asks the cost model.
enum class Algo : int32_t {
  Auto = 0,
  Ring = 1,
  Tree = 2,
  OneShot = 3,
  TwoShot = 4,
  // Not a choice: what ran when an op has one schedule only (every rank reads or writes each
  // peer once: gather, scatter, all_to_all, barrier).
  Direct = 5,
  // Across hosts (engines/hierarchical_engine.h): our engine inside each host and the inter-host
  // engine between hosts, or every rank on the inter-host engine. PYCOLL_ALGO may force either;
  // engines of one host run their auto choice for them.
  Hierarchical = 6,
  Flat = 7,
  // A schedule program (pycollectives.schedule) that PYCOLL_ALGO or set_algo names: never auto's
  // choice; the CPU engine runs it (cpu/schedule_run.h).
  Schedule = 8,
};

// True for the algorithms an engine of one host runs (the rest mean auto there).
inline bool is_single_host_algo(Algo a) {
  return a == Algo::Ring || a == Algo::Tree || a == Algo::OneShot || a == Algo::TwoShot;
}

// Operation codes carried in the per-op header (mismatch detection, logging).
enum class OpCode : int32_t {
  AllReduce = 1,
  Reduce = 2,
  Broadcast = 3,
  AllGather = 4,
  ReduceScatter = 5,
  AllToAll = 6,
  Gather = 7,
  Scatter = 8,
  Barrier = 9,
};

inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16 ||
         t == DType::Float8E4M3 || t == DType::Float8E5M2;
}

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* reduce_name(ReduceKind r);
const char* algo_name(Algo a);
const char* op_name(OpCode o);
// The names a user may force (PYCOLL_ALGO, pycollectives.set_algo), "auto" first: the one list
// that Python reads (pycollectives.config.ALGORITHMS).
const std::vector<std::string>& forcible_algorithm_names();
// Parses one of forcible_algorithm_names() (case-insensitive, '-' and '_' ignored);
// throws std::invalid_argument naming the accepted values otherwise.
Algo parse_algo(const std::string& s);

}  // namespace pycoll
