// all_reduce of a sparse COO tensor: what DDP sends for the gradients of nn.Embedding(sparse=True),
// which Gloo reduces and NCCL does not. Every rank's nonzeros are gathered (the group's own uneven
// all_gather, issued and waited here, on the caller's thread) and summed; the tensor takes the sum in
// place, coalesced. Every rank adds the same entries in the same order, so the result is
// bitwise-identical everywhere. SUM only, as Gloo.
#include "backend/process_group.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "backend/work.h"

namespace pycoll {
namespace {

// FNV-1a of the sizes: ranks whose tensors differ in shape must not mix their entries.
int64_t shape_digest(at::IntArrayRef sizes) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t s : sizes) {
    h ^= static_cast<uint64_t>(s);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::sparse_allreduce(const at::Tensor& t,
                                                                    const c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce";
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, kOp, ": a sparse tensor is reduced with SUM only (as Gloo)");
  check_usable(kOp);
  const at::Tensor mine = t.coalesce();
  const int64_t sparse_dim = mine.sparse_dim();
  int64_t row = 1;  // elements per nonzero
  for (int64_t d = sparse_dim; d < t.dim(); ++d) row *= t.size(d);
  const int64_t nnz = mine._nnz();
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(t.device());

  // 1. Every rank's count of nonzeros, and its shape, to check.
  const int64_t digest = shape_digest(t.sizes());
  std::vector<at::Tensor> meta_in{at::tensor({nnz, sparse_dim, digest}, i64)};
  std::vector<std::vector<at::Tensor>> meta_out(1);
  for (int r = 0; r < size_; ++r) meta_out[0].push_back(at::empty({3}, i64));
  allgather(meta_out, meta_in)->wait();
  const at::Tensor meta = at::stack(meta_out[0]).cpu();  // one copy to the host, not one per rank
  const auto m = meta.accessor<int64_t, 2>();
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK_VALUE(m[r][1] == sparse_dim && m[r][2] == digest, kOp,
                      ": the sparse tensors differ in shape across ranks (rank ", rank_, " has ", t.sizes(), " with ",
                      sparse_dim, " sparse dims; rank ", r, " another)");
    counts[r] = m[r][0];
  }

  // 2. Indices and values, one block per rank of that rank's size.
  const auto gather = [&](const at::Tensor& flat, int64_t per_nonzero) {
    std::vector<at::Tensor> in{flat};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(at::empty({counts[r] * per_nonzero}, flat.options()));
    allgather(out, in)->wait();
    return at::cat(out[0]);
  };
  const at::Tensor indices = gather(mine.indices().t().contiguous().view({-1}), sparse_dim);
  const at::Tensor values = gather(mine.values().contiguous().view({-1}), row);

  // 3. The sum: duplicates added by coalesce, in the same order on every rank.
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> value_shape{total};
  for (int64_t d = sparse_dim; d < t.dim(); ++d) value_shape.push_back(t.size(d));
  const at::Tensor sum =
      at::sparse_coo_tensor(indices.view({total, sparse_dim}).t(), values.view(value_shape), t.sizes(), t.options())
          .coalesce();
  at::Tensor target = t;
  target.copy_(sum);

  std::vector<c10::Device> devices;
  if (!t.is_cpu()) devices.push_back(t.device());
  auto work = c10::make_intrusive<PycollWork>(rank_, c10d::OpType::ALLREDUCE, kOp, ++issued_,
                                              std::vector<at::Tensor>{t}, devices);
  work->mark_done(nullptr);
  work->settle_future();
  return work;
}

}  // namespace pycoll
