// TensorFlow bindings of a hash table with a MixCache in front (mix_cache.h): one
// resource holding both, so every read, update, export and checkpoint goes through the
// cache and the table can never be seen without the cache's newer rows (export flushes
// first, import and eviction keep the cache coherent).
//
// A separate resource rather than a cache op on GmetaHashTable's handle: that resource
// type is private to table_ops.cc, and one lock domain for table plus cache is simpler.
#include <string>

#include "hash_table.h"
#include "kernel_support.h"
#include "mix_cache.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace gmeta {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;

class CachedTableResource : public ::tensorflow::ResourceBase {
 public:
  CachedTableResource(const TableConfig& config, int64_t capacity, int64_t min_count)
      : table_(config), cache_(config, capacity, min_count) {}
  HashTable& table() { return table_; }
  MixCache& cache() { return cache_; }
  std::string DebugString() const override {
    const MixCacheStats s = cache_.Stats();
    return table_.DebugString() + " + MixCache(" + std::to_string(s.size) + "/" +
           std::to_string(s.capacity) + ")";
  }

 private:
  HashTable table_;
  MixCache cache_;
};

using Ref = ::tensorflow::core::RefCountPtr<CachedTableResource>;

Status Get(OpKernelContext* ctx, Ref* out) {
  return ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), out);
}

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTable")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0 = 0")
    .Attr("slot_init: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("initializer: {'zeros', 'uniform', 'normal'} = 'uniform'")
    .Attr("init_scale: float = 0.05")
    .Attr("admit_after: int >= 0 = 1")
    .Attr("default_value: float = 0.0")
    .Attr("cache_capacity: int >= 1")
    .Attr("cache_min_count: int >= 1 = 2")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("A GmetaHashTable with a MixCache of cache_capacity hot rows in front.");

class CachedTableOp : public ::tensorflow::ResourceOpKernel<CachedTableResource> {
 public:
  explicit CachedTableOp(OpKernelConstruction* c) : ResourceOpKernel(c) {
    OP_REQUIRES_OK(c, ReadTableConfig(c, &config_));
    OP_REQUIRES_OK(c, c->GetAttr("cache_capacity", &capacity_));
    OP_REQUIRES_OK(c, c->GetAttr("cache_min_count", &min_count_));
    OP_REQUIRES(c, capacity_ < (int64_t{1} << 31),
                InvalidArgument("cache_capacity must be below 2^31, got ", capacity_));
  }


 private:
  Status CreateResource(CachedTableResource** resource) override {
    *resource = new CachedTableResource(config_, capacity_, min_count_);
    return ::tensorflow::OkStatus();
  }
  TableConfig config_;
  int64_t capacity_, min_count_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTable").Device(DEVICE_CPU), CachedTableOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableLookupOrInsert")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("counts: int64")
    .Input("step: int64")
    .Output("values: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(1), 0), dim));
      return ::tensorflow::OkStatus();
    })
    .Doc("GmetaTableLookupOrInsert through the cache (hot ids read the cache).");

class CachedLookupOrInsertOp : public OpKernel {
 public:
  explicit CachedLookupOrInsertOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    OP_REQUIRES_OK(ctx, CheckDim(res->table(), dim_));
    const Tensor& ids = ctx->input(1);
    const Tensor& counts = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(3), "step"));
    const int64_t n = ids.dim_size(0);
    OP_REQUIRES(ctx, counts.NumElements() == 0 || (counts.dims() == 1 && counts.dim_size(0) == n),
                InvalidArgument("counts must be empty or have one entry per id (", n,
                                "), got shape ", counts.shape().DebugString()));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    res->cache().LookupOrInsert(res->table(), ids.flat<int64_t>().data(),
                                counts.NumElements() ? counts.flat<int64_t>().data() : nullptr,
                                n, ctx->input(3).scalar<int64_t>()(),
                                values->flat<float>().data(), MakeParallelFor(ctx));
  }

 private:
  int64_t dim_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableLookupOrInsert").Device(DEVICE_CPU),
                        CachedLookupOrInsertOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableLookup")
    .Input("table: resource")
    .Input("ids: int64")
    .Output("values: float")
    .Output("found: bool")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(1), 0), dim));
      c->set_output(1, c->Vector(c->Dim(c->input(1), 0)));
      return ::tensorflow::OkStatus();
    })
    .Doc("Read-only lookup through the cache; nothing is inserted or counted.");

class CachedLookupOp : public OpKernel {
 public:
  explicit CachedLookupOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    OP_REQUIRES_OK(ctx, CheckDim(res->table(), dim_));
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    const int64_t n = ids.dim_size(0);
    Tensor *values = nullptr, *found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &found));
    res->cache().Lookup(res->table(), ids.flat<int64_t>().data(), n,
                        values->flat<float>().data(), found->flat<bool>().data(),
                        MakeParallelFor(ctx));
  }

 private:
  int64_t dim_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableLookup").Device(DEVICE_CPU), CachedLookupOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableApplyGradients")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam'}")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("GmetaTableApplyGradients through the cache (cached rows are updated in it).");

class CachedApplyGradientsOp : public OpKernel {
 public:
  explicit CachedApplyGradientsOp(OpKernelConstruction* c) : OpKernel(c) {
    std::string kind;
    OP_REQUIRES_OK(c, c->GetAttr("optimizer", &kind));
    kind_ = kind == "sgd" ? Optimizer::kSgd : kind == "adagrad" ? Optimizer::kAdagrad
                                                                : Optimizer::kAdam;
    required_slots_ = kind_ == Optimizer::kSgd ? 0 : kind_ == Optimizer::kAdagrad ? 1 : 2;
  }
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    const int64_t dim = res->table().config().dim;
    OP_REQUIRES(ctx, res->table().config().num_slots >= required_slots_,
                InvalidArgument("this optimizer needs ", required_slots_,
                                " slots per row but the table was created with ",
                                res->table().config().num_slots));
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    OP_REQUIRES_OK(ctx, CheckRows(ctx->input(2), ids.dim_size(0), dim, "grads"));
    for (int i = 3; i <= 7; ++i) OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(i), "hyper-parameter"));
    OptimizerParams p;
    p.kind = kind_;
    p.learning_rate = ctx->input(3).scalar<float>()();
    p.epsilon = ctx->input(4).scalar<float>()();
    p.beta1 = ctx->input(5).scalar<float>()();
    p.beta2 = ctx->input(6).scalar<float>()();
    p.step = ctx->input(7).scalar<int64_t>()();
    OP_REQUIRES(ctx, kind_ != Optimizer::kAdam || p.step >= 1,
                InvalidArgument("Adam's step must be >= 1, got ", p.step));
    Tensor* updated = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &updated));
    updated->scalar<int64_t>()() = res->cache().ApplyGradients(
        res->table(), ids.flat<int64_t>().data(), ctx->input(2).flat<float>().data(),
        ids.dim_size(0), p, MakeParallelFor(ctx));
  }

 private:
  Optimizer kind_;
  int64_t required_slots_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableApplyGradients").Device(DEVICE_CPU),
                        CachedApplyGradientsOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .Output("admitted: int64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Ids known to the host table, and of those with a row (cached ids included).");

class CachedSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    Tensor *size = nullptr, *admitted = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &size));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &admitted));
    size->scalar<int64_t>()() = res->table().Size();
    admitted->scalar<int64_t>()() = res->table().AdmittedSize();
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableSize").Device(DEVICE_CPU), CachedSizeOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableEvict")
    .Input("table: resource")
    .Input("step: int64")
    .Input("max_age: int64")
    .Input("max_size: int64")
    .Output("evicted_ids: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("Flushes the cache, evicts from the host table, drops evicted ids from the cache.");

class CachedEvictOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    for (int i = 1; i <= 3; ++i) OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(i), "evict argument"));
    res->cache().Flush(res->table());  // the table must judge by current last-seen steps
    const std::vector<int64_t> evicted = res->table().Evict(
        ctx->input(1).scalar<int64_t>()(), ctx->input(2).scalar<int64_t>()(),
        ctx->input(3).scalar<int64_t>()());
    res->cache().Drop(evicted.data(), static_cast<int64_t>(evicted.size()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(evicted.size())}), &out));
    std::copy(evicted.begin(), evicted.end(), out->flat<int64_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableEvict").Device(DEVICE_CPU), CachedEvictOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableExport")
    .Input("table: resource")
    .Output("ids: int64")
    .Output("values: float")
    .Output("slots: float")
    .Output("freq: int64")
    .Output("last_seen: int64")
    .Output("admitted: bool")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim, num_slots;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
      const auto n = InferenceContext::kUnknownDim;
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      c->set_output(2, c->Matrix(n, dim * num_slots));
      for (int i = 3; i <= 5; ++i) c->set_output(i, c->Vector(n));
      return ::tensorflow::OkStatus();
    })
    .Doc("Flushes the cache into the host table, then exports the table (sorted by id).");

class CachedExportOp : public OpKernel {
 public:
  explicit CachedExportOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(c, c->GetAttr("num_slots", &num_slots_));
  }
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    OP_REQUIRES(ctx, res->table().config().dim == dim_ &&
                         res->table().config().num_slots == num_slots_,
                InvalidArgument("the table has dim ", res->table().config().dim, " and ",
                                res->table().config().num_slots,
                                " slots; the op was built for dim ", dim_, " and ", num_slots_,
                                " slots"));
    res->cache().Flush(res->table());
    OP_REQUIRES_OK(ctx, WriteExport(ctx, res->table().Export(), dim_, num_slots_));
  }

 private:
  int64_t dim_, num_slots_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableExport").Device(DEVICE_CPU), CachedExportOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableImport")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("values: float")
    .Input("slots: float")
    .Input("freq: int64")
    .Input("last_seen: int64")
    .Input("admitted: bool")
    .Input("shard_index: int64")
    .Input("num_shards: int64")
    .Output("imported: int64")
    .Attr("clear_first: bool = true")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Writes the cache back, empties it, then imports like GmetaTableImport.");

class CachedImportOp : public OpKernel {
 public:
  explicit CachedImportOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("clear_first", &clear_first_));
  }
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    const int64_t dim = res->table().config().dim;
    const int64_t sdim = res->table().config().num_slots * dim;
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    const int64_t n = ids.dim_size(0);
    OP_REQUIRES_OK(ctx, CheckRows(ctx->input(2), n, dim, "imported values"));
    OP_REQUIRES_OK(ctx, CheckRows(ctx->input(3), n, sdim, "imported slots"));
    for (int i = 4; i <= 6; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).dims() == 1 && ctx->input(i).dim_size(0) == n,
                  InvalidArgument("imported freq, last_seen and admitted must be vectors of ",
                                  n, " entries, input ", i, " has shape ",
                                  ctx->input(i).shape().DebugString()));
    }
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(7), "shard_index"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(8), "num_shards"));
    const int64_t shard = ctx->input(7).scalar<int64_t>()();
    const int64_t shards = ctx->input(8).scalar<int64_t>()();
    OP_REQUIRES(ctx, shards >= 1 && shard >= 0 && shard < shards,
                InvalidArgument("shard_index must be in [0, num_shards) and num_shards >= 1, got ",
                                shard, " of ", shards));
    std::vector<uint8_t> admitted(n);
    const bool* adm = ctx->input(6).flat<bool>().data();
    for (int64_t i = 0; i < n; ++i) admitted[i] = adm[i] ? 1 : 0;
    // Cached rows must not shadow what is imported: write them back, then forget them.
    res->cache().Flush(res->table());
    res->cache().Clear();
    Tensor* imported = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &imported));
    imported->scalar<int64_t>()() = res->table().Import(
        ids.flat<int64_t>().data(), ctx->input(2).flat<float>().data(),
        ctx->input(3).flat<float>().data(), ctx->input(4).flat<int64_t>().data(),
        ctx->input(5).flat<int64_t>().data(), admitted.data(), n, clear_first_, shard, shards);
  }

 private:
  bool clear_first_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableImport").Device(DEVICE_CPU), CachedImportOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableRebalance")
    .Input("table: resource")
    .Output("cached: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Flushes the cache, then makes it hold the host table's most frequent ids (ties by "
         "ascending id), found by one pass over the host index; returns how many are cached.");

class CachedRebalanceOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = res->cache().Rebalance(res->table(), MakeParallelFor(ctx));
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableRebalance").Device(DEVICE_CPU), CachedRebalanceOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableFlush")
    .Input("table: resource")
    .Output("written: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Writes every cached entry changed since its last write-back to the host table.");

class CachedFlushOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = res->cache().Flush(res->table());
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableFlush").Device(DEVICE_CPU), CachedFlushOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaCachedTableStats")
    .Input("table: resource")
    .Output("stats: int64")
    .Output("cached_ids: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(9));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("[capacity, size, lookups, hits, unique_lookups, unique_hits, admitted, evicted, "
         "written_back] and the cached ids (sorted).");

class CachedStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Ref res;
    OP_REQUIRES_OK(ctx, Get(ctx, &res));
    const MixCacheStats s = res->cache().Stats();
    const std::vector<int64_t> ids = res->cache().CachedIds();
    Tensor *stats = nullptr, *cached = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({9}), &stats));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({static_cast<int64_t>(ids.size())}), &cached));
    const int64_t v[9] = {s.capacity, s.size, s.lookups, s.hits, s.unique_lookups,
                          s.unique_hits, s.admitted, s.evicted, s.written_back};
    std::copy(v, v + 9, stats->flat<int64_t>().data());
    std::copy(ids.begin(), ids.end(), cached->flat<int64_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaCachedTableStats").Device(DEVICE_CPU), CachedStatsOp);

}  // namespace
}  // namespace gmeta
