// Gradient-compression kernels for CPU tensors: signSGD bit packing and
// majority vote, PowerSGD's batched Gram-Schmidt, and the fused bucket
// copies. The CUDA versions (cuda/kernels/compression_cuda.h) compute the same
// functions; pycollectives/hooks/_kernels.py holds the plain-torch reference
// that both are tested against.
//
// Terms and layouts (shared with the CUDA kernels)
//   packed signs: int32 words; element i is bit (i % 32) of word (i / 32),
//       least significant bit first; a bit is 1 when the element is negative
//       (x < 0). sign(0), sign(-0.0) and sign(NaN) count as +, so a bit is 0
//       for them. Bits past the last element are 0. ceil(numel / 32) words.
//   vote: for each element, neg = how many of the W ranks' bits are 1;
//       result = scale * (+1 if neg < W - neg, -1 if neg > W - neg, 0 on a
//       tie). Ties exist only for even W; 0 is the unbiased choice there (a
//       fixed +1 would push every disagreed-on coordinate the same way).
//   Gram-Schmidt: modified Gram-Schmidt over the r columns of each [n, r]
//       matrix of a [B, n, r] batch, with col_i /= (||col_i|| + eps), then
//       col_j -= <col_i, col_j> col_i for j > i. An all-zero column stays 0.
//
// Arguments are checked by the caller (bindings/compression_bindings.cpp):
// these functions assume the documented dtypes, shapes and devices.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace pycoll {

// Words needed for numel signs.
inline int64_t sign_words(int64_t numel) { return (numel + 31) / 32; }

// x: floating tensor (fp32, fp64, fp16, bf16), any shape, read in flattened
// (row-major) order. Returns int32 [sign_words(x.numel())].
at::Tensor pack_signs_cpu(const at::Tensor& x);

// packed: int32 [>= sign_words(numel)]. Writes float32 +-scale into out
// (contiguous float32 [numel]).
void unpack_signs_cpu(const at::Tensor& packed, int64_t numel, double scale, const at::Tensor& out);

// gathered: int32 [W, >= sign_words(numel)] (row stride free, unit column
// stride). Writes float32 {-scale, 0, +scale} into out (contiguous float32 [numel]).
void majority_vote_cpu(const at::Tensor& gathered, int64_t numel, double scale, const at::Tensor& out);

// The signSGD hook's CPU fast path (float32 only), in segments: ends are the
// cumulative segment ends (ends.back() == numel), one scale per segment.
// signsgd_encode_cpu_: e += g (when g is defined), then returns the sign words
// of e and writes the L1 norm of each segment of e into l1 (float64 [k]): one
// pass instead of add, pack and norm.
at::Tensor signsgd_encode_cpu_(const at::Tensor& e, const at::Tensor& g, const std::vector<int64_t>& ends,
                               const at::Tensor& l1);
// e -= scale[segment] * sign, the sign read from the words (error feedback's
// residual without unpacking the signs first). scales: float32 [k].
void signsgd_sub_signs_cpu_(const at::Tensor& e, const at::Tensor& words, const std::vector<int64_t>& ends,
                            const at::Tensor& scales);
// majority_vote_cpu with a scale per segment (the vote and its scaling in one pass).
void majority_vote_segments_cpu(const at::Tensor& gathered, int64_t numel, const std::vector<int64_t>& ends,
                                const at::Tensor& scales, const at::Tensor& out);

// m: floating [B, n, r] with r <= n, any strides; orthonormalises the columns
// of each matrix in place.
void batched_orthogonalize_cpu_(const at::Tensor& m, double eps);

// Copies tensors[i] (all of bucket's dtype) one after another into the
// contiguous bucket, starting at element 0. unflatten_from is the inverse.
void flatten_into_cpu(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket);
void unflatten_from_cpu(const at::Tensor& bucket, const std::vector<at::Tensor>& tensors);

}  // namespace pycoll
