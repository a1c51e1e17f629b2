#include "common/types.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace pycoll {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::Int16: return 2;
    case DType::Float8E4M3: return 1;
    case DType::Float8E5M2: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::Int16: return "int16";
    case DType::Float8E4M3: return "float8_e4m3fn";
    case DType::Float8E5M2: return "float8_e5m2";
  }
  return "unknown";
}

const char* reduce_name(ReduceKind r) {
  switch (r) {
    case ReduceKind::Sum: return "SUM";
    case ReduceKind::Avg: return "AVG";
    case ReduceKind::Product: return "PRODUCT";
    case ReduceKind::Min: return "MIN";
    case ReduceKind::Max: return "MAX";
    case ReduceKind::BAnd: return "BAND";
    case ReduceKind::BOr: return "BOR";
    case ReduceKind::BXor: return "BXOR";
    case ReduceKind::PremulSum: return "PREMUL_SUM";
  }
  return "unknown";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::Auto: return "auto";
    case Algo::Ring: return "ring";
    case Algo::Tree: return "tree";
    case Algo::OneShot: return "oneshot";
    case Algo::TwoShot: return "twoshot";
    case Algo::Direct: return "direct";
    case Algo::Hierarchical: return "hierarchical";
    case Algo::Flat: return "flat";
    case Algo::Schedule: return "schedule";
  }
  return "unknown";
}

const char* op_name(OpCode o) {
  switch (o) {
    case OpCode::AllReduce: return "allreduce";
    case OpCode::Reduce: return "reduce";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::AllGather: return "allgather";
    case OpCode::ReduceScatter: return "reduce_scatter";
    case OpCode::AllToAll: return "alltoall";
    case OpCode::Gather: return "gather";
    case OpCode::Scatter: return "scatter";
    case OpCode::Barrier: return "barrier";
  }
  return "unknown";
}

const std::vector<std::string>& forcible_algorithm_names() {
  static const std::vector<std::string> names = {"auto", "ring", "tree", "oneshot", "twoshot", "hierarchical", "flat"};
  return names;
}

Algo parse_algo(const std::string& s) {
  std::string v = s;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  v.erase(std::remove(v.begin(), v.end(), '-'), v.end());
  v.erase(std::remove(v.begin(), v.end(), '_'), v.end());
  if (v.empty() || v == "auto") return Algo::Auto;
  if (v == "ring") return Algo::Ring;
  if (v == "tree") return Algo::Tree;
  if (v == "oneshot") return Algo::OneShot;
  if (v == "twoshot") return Algo::TwoShot;
  if (v == "hierarchical") return Algo::Hierarchical;
  if (v == "flat") return Algo::Flat;
  throw std::invalid_argument("unknown algorithm '" + s +
                              "': expected one of ring, tree, oneshot, twoshot, hierarchical, flat, auto");
}

}  // namespace pycoll
