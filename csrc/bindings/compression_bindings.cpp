// Argument checks and device dispatch of the compression kernels. Every check
// names the function and the argument; wrong dtypes raise TypeError, wrong
// shapes, sizes and devices ValueError. The checks run with the GIL held;
// the kernels run with it released. The kernels behind them assume
// checked arguments (cpu/kernels/compression.h, cuda/kernels/compression_cuda.h).
#include "bindings/compression_bindings.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include <optional>
#include <tuple>
#include <vector>

#include "cpu/kernels/compression.h"
#ifdef PYCOLL_WITH_CUDA
#include "cuda/kernels/compression_cuda.h"
#endif

namespace py = pybind11;

namespace {

bool is_floating(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16;
}

// True for CUDA tensors; raises for devices we have no kernels for.
bool on_cuda(const at::Tensor& t, const char* op, const char* arg) {
  if (t.device().is_cpu()) return false;
  if (t.device().is_cuda()) {
#ifdef PYCOLL_WITH_CUDA
    return true;
#else
    TORCH_CHECK_VALUE(false, op, ": ", arg, " is a CUDA tensor, but this build of pycollectives is CPU-only");
#endif
  }
  TORCH_CHECK_VALUE(false, op, ": ", arg, " must be a CPU or CUDA tensor, got device ", t.device());
  return false;
}

void check_floating(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_TYPE(is_floating(t), op, ": ", arg, " must be float32, float64, float16 or bfloat16, got ",
                   t.scalar_type());
}

void check_words(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, op, ": ", arg, " must be int32 (packed sign words), got ",
                   t.scalar_type());
}

// The float32 [numel] result tensor: `out` after checking it, or a new one.
at::Tensor result_tensor(const std::optional<at::Tensor>& out, const at::Tensor& like, int64_t numel, const char* op) {
  if (!out.has_value()) return at::empty({numel}, like.options().dtype(at::kFloat));
  const at::Tensor& o = *out;
  TORCH_CHECK_TYPE(o.scalar_type() == at::kFloat, op, ": out must be float32, got ", o.scalar_type());
  TORCH_CHECK_VALUE(o.device() == like.device(), op, ": out is on ", o.device(), ", the words on ", like.device());
  TORCH_CHECK_VALUE(o.is_contiguous() && o.numel() == numel, op, ": out must be contiguous with ", numel,
                    " elements, got shape ", o.sizes());
  return o;
}

at::Tensor pack_signs(const at::Tensor& x) {
  constexpr const char* op = "pycoll::pack_signs";
  check_floating(x, op, "tensor");
  const bool cuda = on_cuda(x, op, "tensor");
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) return pycoll::pack_signs_cuda(x);
#endif
  (void)cuda;
  return pycoll::pack_signs_cpu(x);
}

at::Tensor unpack_signs(const at::Tensor& packed, int64_t numel, double scale, const std::optional<at::Tensor>& out) {
  constexpr const char* op = "pycoll::unpack_signs";
  check_words(packed, op, "packed");
  TORCH_CHECK_VALUE(packed.dim() == 1, op, ": packed must be 1-D, got shape ", packed.sizes());
  TORCH_CHECK_VALUE(numel >= 0, op, ": numel must be >= 0, got ", numel);
  TORCH_CHECK_VALUE(packed.numel() >= pycoll::sign_words(numel), op, ": packed has ", packed.numel(), " words, numel ",
                    numel, " needs ", pycoll::sign_words(numel));
  const bool cuda = on_cuda(packed, op, "packed");
  at::Tensor result = result_tensor(out, packed, numel, op);
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) {
    pycoll::unpack_signs_cuda(packed, numel, scale, result);
    return result;
  }
#endif
  (void)cuda;
  pycoll::unpack_signs_cpu(packed, numel, scale, result);
  return result;
}

at::Tensor majority_vote(const at::Tensor& gathered, int64_t numel, double scale,
                         const std::optional<at::Tensor>& out) {
  constexpr const char* op = "pycoll::majority_vote";
  check_words(gathered, op, "gathered");
  TORCH_CHECK_VALUE(gathered.dim() == 2, op, ": gathered must be [world, words], got shape ", gathered.sizes());
  TORCH_CHECK_VALUE(gathered.size(0) >= 1, op, ": gathered must hold at least one rank's words");
  TORCH_CHECK_VALUE(numel >= 0, op, ": numel must be >= 0, got ", numel);
  TORCH_CHECK_VALUE(gathered.size(1) >= pycoll::sign_words(numel), op, ": gathered rows have ", gathered.size(1),
                    " words, numel ", numel, " needs ", pycoll::sign_words(numel));
  const bool cuda = on_cuda(gathered, op, "gathered");
  at::Tensor result = result_tensor(out, gathered, numel, op);
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) {
    pycoll::majority_vote_cuda(gathered, numel, scale, result);
    return result;
  }
#endif
  (void)cuda;
  pycoll::majority_vote_cpu(gathered, numel, scale, result);
  return result;
}

at::Tensor batched_orthogonalize_(const at::Tensor& m, double eps) {
  constexpr const char* op = "pycoll::batched_orthogonalize_";
  check_floating(m, op, "matrices");
  TORCH_CHECK_VALUE(m.dim() == 3, op, ": matrices must be [batch, n, r], got shape ", m.sizes());
  TORCH_CHECK_VALUE(m.size(2) <= m.size(1), op, ": matrices need r <= n (columns to orthogonalise), got shape ",
                    m.sizes());
  TORCH_CHECK_VALUE(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
  const bool cuda = on_cuda(m, op, "matrices");
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) {
    pycoll::batched_orthogonalize_cuda_(m, eps);
    return m;
  }
#endif
  (void)cuda;
  pycoll::batched_orthogonalize_cpu_(m, eps);
  return m;
}

// Shared checks of flatten_into / unflatten_from; returns true for CUDA.
bool check_bucket_args(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket, const char* op) {
  const bool cuda = on_cuda(bucket, op, "bucket");
  TORCH_CHECK_VALUE(bucket.is_contiguous(), op, ": bucket must be contiguous");
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK_TYPE(t.scalar_type() == bucket.scalar_type(), op, ": tensors[", i, "] is ", t.scalar_type(),
                     ", the bucket is ", bucket.scalar_type(), " (all must match)");
    TORCH_CHECK_VALUE(t.device() == bucket.device(), op, ": tensors[", i, "] is on ", t.device(), ", the bucket on ",
                      bucket.device());
    total += t.numel();
  }
  TORCH_CHECK_VALUE(total <= bucket.numel(), op, ": the tensors hold ", total, " elements, the bucket only ",
                    bucket.numel());
  return cuda;
}

void flatten_into(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket) {
  constexpr const char* op = "pycoll::flatten_into";
  const bool cuda = check_bucket_args(tensors, bucket, op);
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) return pycoll::flatten_into_cuda(tensors, bucket);
#endif
  (void)cuda;
  pycoll::flatten_into_cpu(tensors, bucket);
}

void unflatten_from(const at::Tensor& bucket, const std::vector<at::Tensor>& tensors) {
  constexpr const char* op = "pycoll::unflatten_from";
  const bool cuda = check_bucket_args(tensors, bucket, op);
  const py::gil_scoped_release nogil;
#ifdef PYCOLL_WITH_CUDA
  if (cuda) return pycoll::unflatten_from_cuda(bucket, tensors);
#endif
  (void)cuda;
  pycoll::unflatten_from_cpu(bucket, tensors);
}

// The signSGD hook's CPU fast path: float32, contiguous, 1-D, CPU only (the
// hook composes the general kernels on CUDA).
void check_fast_path_tensor(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor (CUDA uses the general kernels), got ",
                    t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, op, ": ", arg, " must be float32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.is_contiguous(), op, ": ", arg, " must be contiguous and 1-D, got shape ",
                    t.sizes());
}

void check_ends(const std::vector<int64_t>& ends, int64_t numel, const char* op) {
  TORCH_CHECK_VALUE(!ends.empty(), op, ": segment ends must not be empty");
  TORCH_CHECK_VALUE(ends.back() == numel, op, ": the last segment end must be the element count ", numel, ", got ",
                    ends.back());
  int64_t prev = 0;
  for (int64_t e : ends) {
    TORCH_CHECK_VALUE(e >= prev, op, ": segment ends must be non-decreasing and >= 0, got ", e, " after ", prev);
    prev = e;
  }
}

void check_scales(const at::Tensor& scales, size_t k, const char* op) {
  TORCH_CHECK_VALUE(scales.device().is_cpu(), op, ": scales must be a CPU tensor");
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, op, ": scales must be float32, got ", scales.scalar_type());
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.numel() == static_cast<int64_t>(k), op, ": scales must be 1-D with ", k,
                    " values (one per segment), got shape ", scales.sizes());
}

std::tuple<at::Tensor, at::Tensor> signsgd_encode_(const at::Tensor& e, const std::optional<at::Tensor>& g,
                                                   const std::vector<int64_t>& ends) {
  constexpr const char* op = "pycoll::signsgd_encode_";
  check_fast_path_tensor(e, op, "e");
  if (g) {
    check_fast_path_tensor(*g, op, "g");
    TORCH_CHECK_VALUE(g->numel() == e.numel(), op, ": g has ", g->numel(), " elements, e ", e.numel());
  }
  check_ends(ends, e.numel(), op);
  at::Tensor l1 = at::zeros({static_cast<int64_t>(ends.size())}, e.options().dtype(at::kDouble));
  const py::gil_scoped_release nogil;
  at::Tensor words = pycoll::signsgd_encode_cpu_(e, g ? *g : at::Tensor(), ends, l1);
  return {words, l1};
}

void signsgd_sub_signs_(const at::Tensor& e, const at::Tensor& words, const std::vector<int64_t>& ends,
                        const at::Tensor& scales) {
  constexpr const char* op = "pycoll::signsgd_sub_signs_";
  check_fast_path_tensor(e, op, "e");
  check_words(words, op, "words");
  TORCH_CHECK_VALUE(words.device().is_cpu() && words.dim() == 1 && words.numel() >= pycoll::sign_words(e.numel()), op,
                    ": words must be a 1-D CPU tensor of at least ", pycoll::sign_words(e.numel()), " words");
  check_ends(ends, e.numel(), op);
  check_scales(scales, ends.size(), op);
  const py::gil_scoped_release nogil;
  pycoll::signsgd_sub_signs_cpu_(e, words, ends, scales);
}

at::Tensor majority_vote_segments(const at::Tensor& gathered, int64_t numel, const std::vector<int64_t>& ends,
                                  const at::Tensor& scales, const at::Tensor& out) {
  constexpr const char* op = "pycoll::majority_vote_segments";
  check_words(gathered, op, "gathered");
  TORCH_CHECK_VALUE(gathered.device().is_cpu() && gathered.dim() == 2 && gathered.size(0) >= 1, op,
                    ": gathered must be a CPU tensor [world, words], got shape ", gathered.sizes());
  TORCH_CHECK_VALUE(gathered.size(1) >= pycoll::sign_words(numel), op, ": gathered rows have ", gathered.size(1),
                    " words, numel ", numel, " needs ", pycoll::sign_words(numel));
  check_fast_path_tensor(out, op, "out");
  TORCH_CHECK_VALUE(out.numel() == numel, op, ": out has ", out.numel(), " elements, numel is ", numel);
  check_ends(ends, numel, op);
  check_scales(scales, ends.size(), op);
  const py::gil_scoped_release nogil;
  pycoll::majority_vote_segments_cpu(gathered, numel, ends, scales, out);
  return out;
}

}  // namespace

void register_compression(pybind11::module& m) {
  using py::arg;
  // Each function checks its arguments with the GIL held (the errors become Python exceptions
  // there), then releases the GIL for the work.
  m.def("pack_signs", &pack_signs, arg("tensor"),
        "Signs of a float tensor as int32 words: bit i%32 of word i/32 is 1 where tensor.flatten()[i] < 0");
  m.def("unpack_signs", &unpack_signs, arg("packed"), arg("numel"), arg("scale") = 1.0, arg("out") = py::none(),
        "float32 [numel] (into `out` when given): -scale where the bit is 1, +scale where it is 0");
  m.def("majority_vote", &majority_vote, arg("gathered"), arg("numel"), arg("scale") = 1.0, arg("out") = py::none(),
        "float32 [numel] (into `out` when given): scale * the majority sign of gathered [world, words] (0 on a tie)");
  m.def("signsgd_encode_", &signsgd_encode_, arg("e"), arg("g"), arg("ends"),
        "CPU float32: e += g (g may be None), then (sign words of e, float64 L1 norm of each segment of e)");
  m.def("signsgd_sub_signs_", &signsgd_sub_signs_, arg("e"), arg("words"), arg("ends"), arg("scales"),
        "CPU float32: e -= scales[segment] * sign, the signs read from the words");
  m.def("majority_vote_segments", &majority_vote_segments, arg("gathered"), arg("numel"), arg("ends"), arg("scales"),
        arg("out"), "CPU float32: majority_vote into out with a scale per segment");
  m.def("batched_orthogonalize_", &batched_orthogonalize_, arg("matrices"), arg("eps") = 1e-8,
        "Modified Gram-Schmidt on the columns of every [n, r] matrix of [batch, n, r], in place; returns it");
  m.def("flatten_into", &flatten_into, arg("tensors"), arg("bucket"),
        "Copies the tensors one after another into the contiguous bucket (one parallel copy / one launch)");
  m.def("unflatten_from", &unflatten_from, arg("bucket"), arg("tensors"),
        "Copies consecutive slices of the bucket back into the tensors (inverse of flatten_into)");
}
