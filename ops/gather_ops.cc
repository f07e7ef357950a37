// Virtual Sparse Id's expand and fold: gather the unique rows to the batch layout, and its
// gradient, the sum of the batch's row gradients per unique row. TensorFlow's own
// gradient of tf.gather builds IndexedSlices that UnsortedSegmentSum folds on one thread;
// here both directions run on the whole intra-op pool.
#include <algorithm>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace gmeta {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Rows are read or written at scattered places: loops fetch the row this many indices
// ahead (memory latency, not arithmetic, bounds them).
constexpr int64_t kRowPrefetchDistance = 8;

// Checks 0 <= indices[i] < bound for all i; reports the first offender.
::tensorflow::Status CheckIndices(const int32_t* indices, int64_t n, int64_t bound) {
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= bound) {
      return InvalidArgument("index ", indices[i], " at position ", i, " is outside [0, ",
                             bound, ")");
    }
  }
  return ::tensorflow::OkStatus();
}

REGISTER_OP("GmetaGatherRows")
    .Input("params: float")
    .Input("indices: int32")
    .Output("rows: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle params, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &params));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      c->set_output(0, c->Matrix(c->Dim(indices, 0), c->Dim(params, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc("rows[i] = params[indices[i]], in parallel.");

class GatherRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, params.dims() == 2,
                InvalidArgument("params must be a matrix, got ", params.shape().DebugString()));
    OP_REQUIRES(ctx, indices.dims() == 1,
                InvalidArgument("indices must be a vector, got ", indices.shape().DebugString()));
    const int64_t n = indices.dim_size(0), dim = params.dim_size(1);
    const int32_t* idx = indices.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckIndices(idx, n, params.dim_size(0)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out));
    const float* src = params.flat<float>().data();
    float* dst = out->flat<float>().data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    workers->ParallelFor(n, 4 * dim, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kRowPrefetchDistance < end) {  // source rows are scattered: fetch ahead
          __builtin_prefetch(src + static_cast<int64_t>(idx[i + kRowPrefetchDistance]) * dim);
        }
        std::memcpy(dst + i * dim, src + static_cast<int64_t>(idx[i]) * dim, dim * sizeof(float));
      }
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaGatherRows").Device(DEVICE_CPU), GatherRowsOp);

REGISTER_OP("GmetaScatterAddRows")
    .Input("updates: float")
    .Input("indices: int32")
    .Input("num_rows: int32")
    .Output("rows: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle updates;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &updates));
      ::tensorflow::shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &rows));
      c->set_output(0, c->Matrix(rows, c->Dim(updates, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc("rows[k] = sum of updates[i] over i with indices[i] == k, in parallel.");

class ScatterAddRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& updates = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, updates.dims() == 2,
                InvalidArgument("updates must be a matrix, got ", updates.shape().DebugString()));
    OP_REQUIRES(ctx, indices.dims() == 1 && indices.dim_size(0) == updates.dim_size(0),
                InvalidArgument("indices must be a vector with one entry per update row (",
                                updates.dim_size(0), "), got ", indices.shape().DebugString()));
    const int64_t num_rows = ctx->input(2).scalar<int32_t>()();
    OP_REQUIRES(ctx, num_rows >= 0, InvalidArgument("num_rows must be >= 0, got ", num_rows));
    const int64_t n = indices.dim_size(0), dim = updates.dim_size(1);
    const int32_t* idx = indices.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckIndices(idx, n, num_rows));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_rows, dim}), &out));
    const float* src = updates.flat<float>().data();
    float* dst = out->flat<float>().data();
    // Each shard owns a contiguous range of output rows and scans every index: no two
    // threads ever add into the same row, and the index scan is a cheap sequential read.
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(workers->NumThreads(), num_rows));
    workers->ParallelFor(shards, int64_t{1} << 40, [&](int64_t first, int64_t last) {
      for (int64_t s = first; s < last; ++s) {
        const int64_t lo = num_rows * s / shards, hi = num_rows * (s + 1) / shards;
        std::fill(dst + lo * dim, dst + hi * dim, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          if (i + kRowPrefetchDistance < n) {  // target rows are scattered: fetch ahead
            const int64_t ahead = idx[i + kRowPrefetchDistance];
            if (ahead >= lo && ahead < hi) __builtin_prefetch(dst + ahead * dim, 1);
          }
          const int64_t k = idx[i];
          if (k < lo || k >= hi) continue;
          float* acc = dst + k * dim;
          const float* u = src + i * dim;
          for (int64_t j = 0; j < dim; ++j) acc[j] += u[j];
        }
      }
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaScatterAddRows").Device(DEVICE_CPU), ScatterAddRowsOp);

}  // namespace
}  // namespace gmeta
