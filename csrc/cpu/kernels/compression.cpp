#include "cpu/kernels/compression.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PYCOLL_HAVE_AVX2_PATH 1
#endif

#include "common/bucket_copy.h"
#include "common/batched_copy.h"

namespace pycoll {

namespace {

// Grain sizes for at::parallel_for, in loop iterations: below them a call
// runs on the calling thread (a rank of a 2-core CI machine uses one thread).
constexpr int64_t kWordGrain = 4096;  // words: 128 Ki elements
constexpr int64_t kChunkGrain = 4;    // copy chunks: 256 KiB
constexpr int64_t kMatrixGrain = 1;   // Gram-Schmidt: one matrix is already a lot of work

// Bit b of a word as a mask: `word & kBit[b]` vectorises with SSE2 (a
// variable shift `word >> b` does not before AVX2), 5x faster unpack/vote.
alignas(64) constexpr uint32_t kBit[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,  1u << 8,  1u << 9,  1u << 10,
    1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21,
    1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

// Writes the n <= 32 values of one word: -pos where the bit is set, else pos.
inline void unpack_word(uint32_t bits, float pos, float* dst, int64_t n) {
  const float neg = -pos;
  if (n == 32) {
    for (int b = 0; b < 32; ++b) dst[b] = (bits & kBit[b]) ? neg : pos;
  } else {
    for (int64_t b = 0; b < n; ++b) dst[b] = (bits & kBit[b]) ? neg : pos;
  }
}

// The vote of one word from `world` rows: pos, -pos or 0 per element.
inline void vote_word(const uint32_t* words, int64_t row, int64_t world, float pos, float* dst, int64_t n) {
  int32_t neg[32] = {0};
  for (int64_t r = 0; r < world; ++r) {
    const uint32_t bits = words[r * row];
    for (int b = 0; b < 32; ++b) neg[b] += (bits & kBit[b]) != 0;
  }
  for (int64_t b = 0; b < n; ++b) {
    const int64_t twice = 2 * static_cast<int64_t>(neg[b]);
    dst[b] = static_cast<float>(static_cast<int>(twice < world) - static_cast<int>(twice > world)) * pos;
  }
}

#ifdef PYCOLL_HAVE_AVX2_PATH
// AVX2 majority vote over whole words (the build targets baseline x86-64;
// picked at run time). A variable per-lane shift puts bit b of a word in lane
// b, 8 lanes at a time, so the per-element counts are vector adds: 64 MiB
// with 2 ranks in 10.6 ms instead of 41 ms (2-core EPYC VM), i.e. at memory
// speed like unpack, whose scalar loop already is. Bit-identical to the
// scalar code: the same float expressions, only chosen by mask.
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

__attribute__((target("avx2"))) void vote_words_avx2(const uint32_t* words, int64_t row, int64_t world, int64_t nwords,
                                                     float pos, float* dst) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i w = _mm256_set1_epi32(static_cast<int>(world));
  const __m256 vpos = _mm256_set1_ps(1.0f * pos), vneg = _mm256_set1_ps(-1.0f * pos), vtie = _mm256_set1_ps(0.0f * pos);
  for (int64_t j = 0; j < nwords; ++j) {
    for (int k = 0; k < 4; ++k) {
      const __m256i sh = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k));
      __m256i cnt = _mm256_setzero_si256();
      for (int64_t r = 0; r < world; ++r) {
        const __m256i bits = _mm256_set1_epi32(static_cast<int>(words[r * row + j]));
        cnt = _mm256_add_epi32(cnt, _mm256_and_si256(_mm256_srlv_epi32(bits, sh), one));
      }
      const __m256i twice = _mm256_add_epi32(cnt, cnt);
      const __m256 more_neg = _mm256_castsi256_ps(_mm256_cmpgt_epi32(twice, w));
      const __m256 more_pos = _mm256_castsi256_ps(_mm256_cmpgt_epi32(w, twice));
      const __m256 v = _mm256_blendv_ps(_mm256_blendv_ps(vtie, vneg, more_neg), vpos, more_pos);
      _mm256_storeu_ps(dst + j * 32 + 8 * k, v);
    }
  }
}
#endif

template <typename T>
void pack_loop(const T* x, uint32_t* out, int64_t numel) {
  using Acc = at::opmath_type<T>;
  const int64_t words = sign_words(numel);
  at::parallel_for(0, words, kWordGrain, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const T* p = x + w * 32;
      const int64_t n = std::min<int64_t>(32, numel - w * 32);
      uint32_t bits = 0;
      if (n == 32) {
        for (int b = 0; b < 32; ++b) bits |= static_cast<uint32_t>(static_cast<Acc>(p[b]) < Acc(0)) << b;
      } else {
        for (int64_t b = 0; b < n; ++b) bits |= static_cast<uint32_t>(static_cast<Acc>(p[b]) < Acc(0)) << b;
      }
      out[w] = bits;
    }
  });
}

// One matrix of the batch: base points at element [0, 0]; sr and sc are the
// row and column strides in elements. dots has room for r values.
template <typename T>
void gram_schmidt_one(T* base, int64_t n, int64_t r, int64_t sr, int64_t sc, double eps, double* dots) {
  for (int64_t i = 0; i < r; ++i) {
    // Pass 1: the squared norm of column i and its (unnormalised) dot
    // products with the columns after it.
    double nrm2 = 0.0;
    std::fill(dots + i + 1, dots + r, 0.0);
    for (int64_t k = 0; k < n; ++k) {
      const T* row = base + k * sr;
      const double xi = static_cast<double>(row[i * sc]);
      nrm2 += xi * xi;
      for (int64_t j = i + 1; j < r; ++j) dots[j] += xi * static_cast<double>(row[j * sc]);
    }
    // inv normalises column i; <col_i / (|col_i| + eps), col_j> = dots[j] * inv.
    const double inv = nrm2 > 0.0 ? 1.0 / (std::sqrt(nrm2) + eps) : 0.0;
    for (int64_t j = i + 1; j < r; ++j) dots[j] *= inv;
    // Pass 2: normalise column i and remove it from the later columns.
    for (int64_t k = 0; k < n; ++k) {
      T* row = base + k * sr;
      const T qi = static_cast<T>(static_cast<double>(row[i * sc]) * inv);
      row[i * sc] = qi;
      const double q = static_cast<double>(qi);
      for (int64_t j = i + 1; j < r; ++j) row[j * sc] = static_cast<T>(static_cast<double>(row[j * sc]) - dots[j] * q);
    }
  }
}

// Calls whole(ja, jb, seg) for each run of whole words [ja, jb) inside one
// segment, and edge(j) for each word that holds elements of two segments or
// the last, partial word. ends: cumulative segment ends (ends.back() == numel).
template <typename Whole, typename Edge>
void for_each_run(int64_t w0, int64_t w1, int64_t numel, const std::vector<int64_t>& ends, Whole whole, Edge edge) {
  size_t seg = std::upper_bound(ends.begin(), ends.end(), w0 * 32) - ends.begin();
  int64_t j = w0;
  while (j < w1) {
    while (seg < ends.size() && ends[seg] <= j * 32) ++seg;
    const int64_t stop = std::min<int64_t>(w1, std::min<int64_t>(ends[seg], numel) / 32);  // whole words in seg
    if (stop > j) {
      whole(j, stop, seg);
      j = stop;
    } else {
      edge(j);
      ++j;
    }
  }
}

// The segment of element i, searching forward from seg.
inline size_t segment_of(int64_t i, const std::vector<int64_t>& ends, size_t seg) {
  while (ends[seg] <= i) ++seg;
  return seg;
}

#ifdef PYCOLL_HAVE_AVX2_PATH
// e += g; sign words; sum |e| of the words (float per word, as in the
// scalar path). 8 lanes: movemask of (e < 0) gives 8 sign bits at once.
__attribute__((target("avx2"))) void encode_words_avx2(float* e, const float* g, int64_t nwords, uint32_t* out,
                                                       double* l1) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  double acc = 0.0;
  for (int64_t j = 0; j < nwords; ++j) {
    uint32_t bits = 0;
    __m256 sum = zero;
    for (int k = 0; k < 4; ++k) {
      float* p = e + j * 32 + 8 * k;
      __m256 v = _mm256_loadu_ps(p);
      if (g) {
        v = _mm256_add_ps(v, _mm256_loadu_ps(g + j * 32 + 8 * k));
        _mm256_storeu_ps(p, v);
      }
      bits |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ))) << (8 * k);
      sum = _mm256_add_ps(sum, _mm256_and_ps(v, absmask));
    }
    out[j] = bits;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    acc += static_cast<double>(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                               ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])));
  }
  *l1 += acc;
}

// e -= (bit ? -s : s), i.e. e - s * sign, for whole words of one segment.
__attribute__((target("avx2"))) void sub_signs_words_avx2(float* e, const uint32_t* w, int64_t nwords, float s) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vpos = _mm256_set1_ps(s), vneg = _mm256_set1_ps(-s);
  for (int64_t j = 0; j < nwords; ++j) {
    const __m256i bits = _mm256_set1_epi32(static_cast<int>(w[j]));
    for (int k = 0; k < 4; ++k) {
      const __m256i b = _mm256_srlv_epi32(bits, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k)));
      const __m256 set = _mm256_castsi256_ps(_mm256_slli_epi32(b, 31));
      float* p = e + j * 32 + 8 * k;
      _mm256_storeu_ps(p, _mm256_sub_ps(_mm256_loadu_ps(p), _mm256_blendv_ps(vpos, vneg, set)));
    }
  }
}
#endif

void run_plan(const std::vector<CopyChunk>& plan) {
  at::parallel_for(0, static_cast<int64_t>(plan.size()), kChunkGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const CopyChunk& k = plan[c];
      if (k.src != k.dst) std::memcpy(k.dst, k.src, static_cast<size_t>(k.bytes));
    }
  });
}

}  // namespace

at::Tensor pack_signs_cpu(const at::Tensor& x) {
  const at::Tensor src = x.contiguous();
  const int64_t numel = src.numel();
  at::Tensor out = at::empty({sign_words(numel)}, src.options().dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "pycoll::pack_signs", [&] {
    pack_loop<scalar_t>(src.const_data_ptr<scalar_t>(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), numel);
  });
  return out;
}

void unpack_signs_cpu(const at::Tensor& packed, int64_t numel, double scale, const at::Tensor& out) {
  const at::Tensor words = packed.contiguous();
  const uint32_t* w = reinterpret_cast<const uint32_t*>(words.const_data_ptr<int32_t>());
  float* o = out.data_ptr<float>();
  const float pos = static_cast<float>(scale);
  at::parallel_for(0, sign_words(numel), kWordGrain, [&](int64_t w0, int64_t w1) {
    for (int64_t j = w0; j < w1; ++j) unpack_word(w[j], pos, o + j * 32, std::min<int64_t>(32, numel - j * 32));
  });
}

void majority_vote_cpu(const at::Tensor& gathered, int64_t numel, double scale, const at::Tensor& out) {
  const at::Tensor g = gathered.stride(1) == 1 ? gathered : gathered.contiguous();
  const int64_t world = g.size(0);
  const int64_t row = g.stride(0);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(g.const_data_ptr<int32_t>());
  float* o = out.data_ptr<float>();
  const float pos = static_cast<float>(scale);
  at::parallel_for(0, sign_words(numel), kWordGrain / 4, [&](int64_t w0, int64_t w1) {
#ifdef PYCOLL_HAVE_AVX2_PATH
    if (cpu_has_avx2()) {
      const int64_t full = std::max<int64_t>(w0, std::min<int64_t>(w1, numel / 32));  // whole words end here
      vote_words_avx2(words + w0, row, world, full - w0, pos, o + w0 * 32);
      w0 = full;
    }
#endif
    for (int64_t j = w0; j < w1; ++j) {
      vote_word(words + j, row, world, pos, o + j * 32, std::min<int64_t>(32, numel - j * 32));
    }
  });
}

void batched_orthogonalize_cpu_(const at::Tensor& m, double eps) {
  const int64_t batch = m.size(0), n = m.size(1), r = m.size(2);
  const int64_t sb = m.stride(0), sr = m.stride(1), sc = m.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, m.scalar_type(), "pycoll::batched_orthogonalize_", [&] {
    scalar_t* base = m.data_ptr<scalar_t>();
    at::parallel_for(0, batch, kMatrixGrain, [&](int64_t b0, int64_t b1) {
      std::vector<double> dots(static_cast<size_t>(r));
      for (int64_t b = b0; b < b1; ++b) gram_schmidt_one<scalar_t>(base + b * sb, n, r, sr, sc, eps, dots.data());
    });
  });
}

void flatten_into_cpu(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket) {
  run_plan(bucket_copy_plan(tensors, bucket, BucketCopy::Flatten));
}

void unflatten_from_cpu(const at::Tensor& bucket, const std::vector<at::Tensor>& tensors) {
  run_plan(bucket_copy_plan(tensors, bucket, BucketCopy::Unflatten));
}

at::Tensor signsgd_encode_cpu_(const at::Tensor& e, const at::Tensor& g, const std::vector<int64_t>& ends,
                               const at::Tensor& l1) {
  const int64_t numel = e.numel();
  const int64_t nwords = sign_words(numel);
  at::Tensor out = at::empty({nwords}, e.options().dtype(at::kInt));
  float* pe = e.data_ptr<float>();
  const float* pg = g.defined() ? g.const_data_ptr<float>() : nullptr;
  uint32_t* pw = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  const size_t k = ends.size();
  std::vector<double> partial(static_cast<size_t>(at::get_num_threads()) * k, 0.0);
  at::parallel_for(0, nwords, kWordGrain, [&](int64_t w0, int64_t w1) {
    double* acc = partial.data() + static_cast<size_t>(at::get_thread_num()) * k;
    auto scalar_word = [&](int64_t j) {
      const int64_t n = std::min<int64_t>(32, numel - j * 32);
      uint32_t bits = 0;
      size_t seg = segment_of(j * 32, ends, 0);
      for (int64_t b = 0; b < n; ++b) {
        const int64_t i = j * 32 + b;
        float v = pe[i];
        if (pg) {
          v = v + pg[i];
          pe[i] = v;
        }
        bits |= static_cast<uint32_t>(v < 0.0f) << b;
        seg = segment_of(i, ends, seg);
        acc[seg] += static_cast<double>(std::fabs(v));
      }
      pw[j] = bits;
    };
    for_each_run(
        w0, w1, numel, ends,
        [&](int64_t ja, int64_t jb, size_t seg) {
#ifdef PYCOLL_HAVE_AVX2_PATH
          if (cpu_has_avx2()) {
            encode_words_avx2(pe + ja * 32, pg ? pg + ja * 32 : nullptr, jb - ja, pw + ja, &acc[seg]);
            return;
          }
#endif
          for (int64_t j = ja; j < jb; ++j) scalar_word(j);
        },
        scalar_word);
  });
  double* l = l1.data_ptr<double>();
  for (size_t s = 0; s < k; ++s) {
    double sum = 0.0;
    for (size_t t = 0; t < partial.size() / k; ++t) sum += partial[t * k + s];
    l[s] = sum;
  }
  return out;
}

void signsgd_sub_signs_cpu_(const at::Tensor& e, const at::Tensor& words, const std::vector<int64_t>& ends,
                            const at::Tensor& scales) {
  const int64_t numel = e.numel();
  float* pe = e.data_ptr<float>();
  const at::Tensor wc = words.contiguous();
  const uint32_t* pw = reinterpret_cast<const uint32_t*>(wc.const_data_ptr<int32_t>());
  const at::Tensor sc = scales.contiguous();
  const float* ps = sc.const_data_ptr<float>();
  at::parallel_for(0, sign_words(numel), kWordGrain, [&](int64_t w0, int64_t w1) {
    auto scalar_word = [&](int64_t j) {
      const int64_t n = std::min<int64_t>(32, numel - j * 32);
      size_t seg = segment_of(j * 32, ends, 0);
      for (int64_t b = 0; b < n; ++b) {
        const int64_t i = j * 32 + b;
        seg = segment_of(i, ends, seg);
        pe[i] = pe[i] - ((pw[j] & kBit[b]) ? -ps[seg] : ps[seg]);
      }
    };
    for_each_run(
        w0, w1, numel, ends,
        [&](int64_t ja, int64_t jb, size_t seg) {
#ifdef PYCOLL_HAVE_AVX2_PATH
          if (cpu_has_avx2()) {
            sub_signs_words_avx2(pe + ja * 32, pw + ja, jb - ja, ps[seg]);
            return;
          }
#endif
          for (int64_t j = ja; j < jb; ++j) scalar_word(j);
        },
        scalar_word);
  });
}

void majority_vote_segments_cpu(const at::Tensor& gathered, int64_t numel, const std::vector<int64_t>& ends,
                                const at::Tensor& scales, const at::Tensor& out) {
  const at::Tensor g = gathered.stride(1) == 1 ? gathered : gathered.contiguous();
  const int64_t world = g.size(0);
  const int64_t row = g.stride(0);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(g.const_data_ptr<int32_t>());
  float* o = out.data_ptr<float>();
  const at::Tensor sc = scales.contiguous();
  const float* ps = sc.const_data_ptr<float>();
  at::parallel_for(0, sign_words(numel), kWordGrain / 4, [&](int64_t w0, int64_t w1) {
    auto edge = [&](int64_t j) {  // vote at scale 1, then each element times its segment's scale
      const int64_t n = std::min<int64_t>(32, numel - j * 32);
      vote_word(words + j, row, world, 1.0f, o + j * 32, n);
      size_t seg = segment_of(j * 32, ends, 0);
      for (int64_t b = 0; b < n; ++b) {
        seg = segment_of(j * 32 + b, ends, seg);
        o[j * 32 + b] *= ps[seg];
      }
    };
    for_each_run(
        w0, w1, numel, ends,
        [&](int64_t ja, int64_t jb, size_t seg) {
#ifdef PYCOLL_HAVE_AVX2_PATH
          if (cpu_has_avx2()) {
            vote_words_avx2(words + ja, row, world, jb - ja, ps[seg], o + ja * 32);
            return;
          }
#endif
          for (int64_t j = ja; j < jb; ++j) vote_word(words + j, row, world, ps[seg], o + j * 32, 32);
        },
        edge);
  });
}

}  // namespace pycoll
