// TensorFlow bindings of the embedding hash table (hash_table.h): a resource holding one
// table (with its cache of hot rows, when it has one), the kernels that read, train,
// evict, export and import it, the cache's own three (flush, rebalance, stats), plus the
// fused dedup/partition op of Virtual Sparse Id.
#include <string>

#include "hash_table.h"
#include "kernel_support.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tensorflow/core/util/work_sharder.h"

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
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

class TableResource : public ::tensorflow::ResourceBase {
 public:
  explicit TableResource(const TableConfig& config) : table_(config) {}
  HashTable& table() { return table_; }
  std::string DebugString() const override { return table_.DebugString(); }
  int64_t MemoryUsed() const override { return 0; }

 private:
  HashTable table_;
};

Status GetTable(OpKernelContext* ctx, ::tensorflow::core::RefCountPtr<TableResource>* out) {
  return ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), out);
}

// Shape function helper: input `index` must be a vector; returns its length.
Status VectorLength(InferenceContext* c, int index, DimensionHandle* n) {
  ShapeHandle s;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 1, &s));
  *n = c->Dim(s, 0);
  return ::tensorflow::OkStatus();
}

// Shape function of the lookups: input 1 the ids [n]; outputs a [n, dim] row each and a
// [n] vector (row handles, or whether each id was found).
Status RowsOfIdsShape(InferenceContext* c) {
  DimensionHandle n;
  TF_RETURN_IF_ERROR(VectorLength(c, 1, &n));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(0, c->Matrix(n, dim));
  c->set_output(1, c->Vector(n));
  return ::tensorflow::OkStatus();
}

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaHashTable")
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
    .Attr("cache_capacity: int >= 0 = 0")
    .Attr("cache_min_count: int >= 1 = 2")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("An int64 -> float[dim] hash table with optimizer slots, counters and admission, "
         "and a cache of cache_capacity hot rows inside it when cache_capacity > 0.");

class HashTableOp : public ::tensorflow::ResourceOpKernel<TableResource> {
 public:
  explicit HashTableOp(OpKernelConstruction* c) : ResourceOpKernel(c) {
    OP_REQUIRES_OK(c, ReadTableConfig(c, &config_));
    OP_REQUIRES_OK(c, c->GetAttr("cache_capacity", &config_.cache_capacity));
    OP_REQUIRES_OK(c, c->GetAttr("cache_min_count", &config_.cache_min_count));
    OP_REQUIRES(c, config_.cache_capacity < (int64_t{1} << 31),
                InvalidArgument("cache_capacity must be below 2^31, got ", config_.cache_capacity));
  }

 private:
  Status CreateResource(TableResource** resource) override {
    *resource = new TableResource(config_);
    return ::tensorflow::OkStatus();
  }
  Status VerifyResource(TableResource* resource) override {
    const TableConfig& have = resource->table().config();
    if (have.dim != config_.dim || have.num_slots != config_.num_slots ||
        have.cache_capacity != config_.cache_capacity) {
      return InvalidArgument("a table named '", cinfo_.name(), "' already exists with dim ",
                             have.dim, ", ", have.num_slots, " slots and a cache of ",
                             have.cache_capacity, " rows; asked for dim ", config_.dim, ", ",
                             config_.num_slots, " slots and a cache of ",
                             config_.cache_capacity, " rows");
    }
    return ::tensorflow::OkStatus();
  }
  TableConfig config_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaHashTable").Device(DEVICE_CPU), HashTableOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableLookupOrInsert")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("counts: int64")
    .Input("step: int64")
    .Output("values: float")
    .Output("row_handles: int64")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(RowsOfIdsShape)
    .Doc("Rows of ids, inserting missing ids with their deterministic initial row (hot ids "
         "read the cache, which admits by exact frequency); row_handles let "
         "GmetaTableApplyGradients reach the rows without probing again.");

class LookupOrInsertOp : public OpKernel {
 public:
  explicit LookupOrInsertOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    HashTable& table = res->table();
    OP_REQUIRES_OK(ctx, CheckDim(table, dim_));
    const Tensor& ids = ctx->input(1);
    const Tensor& counts = ctx->input(2);
    const Tensor& step = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    OP_REQUIRES_OK(ctx, CheckScalar(step, "step"));
    const int64_t n = ids.dim_size(0);
    OP_REQUIRES(ctx, counts.NumElements() == 0 || (counts.dims() == 1 && counts.dim_size(0) == n),
                InvalidArgument("counts must be empty or have one entry per id (", n,
                                "), got shape ", counts.shape().DebugString()));
    Tensor* values = nullptr;
    Tensor* handles = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &handles));
    table.LookupOrInsert(ids.flat<int64_t>().data(),
                         counts.NumElements() ? counts.flat<int64_t>().data() : nullptr, n,
                         step.scalar<int64_t>()(), values->flat<float>().data(),
                         handles->flat<int64_t>().data(), MakeParallelFor(ctx));
  }

 private:
  int64_t dim_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableLookupOrInsert").Device(DEVICE_CPU), LookupOrInsertOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableLookup")
    .Input("table: resource")
    .Input("ids: int64")
    .Output("values: float")
    .Output("found: bool")
    .Attr("dim: int >= 1")
    .SetShapeFn(RowsOfIdsShape)
    .Doc("Read-only lookup (through the cache): ids without a row read the default row; "
         "nothing is inserted or counted.");

class LookupOp : public OpKernel {
 public:
  explicit LookupOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    const HashTable& table = res->table();
    OP_REQUIRES_OK(ctx, CheckDim(table, dim_));
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    const int64_t n = ids.dim_size(0);
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &found));
    table.Lookup(ids.flat<int64_t>().data(), n, values->flat<float>().data(),
                 found->flat<bool>().data(), MakeParallelFor(ctx));
  }

 private:
  int64_t dim_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableLookup").Device(DEVICE_CPU), LookupOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableApplyGradients")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("row_handles: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("epsilon: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("step: int64")
    .Output("updated: int64")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam'}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle n;
      TF_RETURN_IF_ERROR(VectorLength(c, 1, &n));
      ShapeHandle g;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &g));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(g, 0), &unused));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("One fused sparse optimizer step on the rows of ids (duplicates summed first; "
         "cached rows updated in the cache). row_handles: GmetaTableLookupOrInsert's for "
         "these ids, or empty (then every id is probed).");

class ApplyGradientsOp : public OpKernel {
 public:
  explicit ApplyGradientsOp(OpKernelConstruction* c) : OpKernel(c) {
    std::string kind;
    OP_REQUIRES_OK(c, c->GetAttr("optimizer", &kind));
    kind_ = kind == "sgd" ? Optimizer::kSgd : kind == "adagrad" ? Optimizer::kAdagrad
                                                                : Optimizer::kAdam;
    required_slots_ = kind_ == Optimizer::kSgd ? 0 : kind_ == Optimizer::kAdagrad ? 1 : 2;
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    HashTable& table = res->table();
    const int64_t dim = table.config().dim;
    OP_REQUIRES(ctx, table.config().num_slots >= required_slots_,
                InvalidArgument("this optimizer needs ", required_slots_,
                                " slots per row but the table was created with ",
                                table.config().num_slots));
    const Tensor& ids = ctx->input(1);
    const Tensor& handles = ctx->input(2);
    const Tensor& grads = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    const int64_t n = ids.dim_size(0);
    OP_REQUIRES(ctx, handles.NumElements() == 0 || (handles.dims() == 1 && handles.dim_size(0) == n),
                InvalidArgument("row_handles must be empty or have one entry per id (", n,
                                "), got shape ", handles.shape().DebugString()));
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(0) == n && grads.dim_size(1) == dim,
                InvalidArgument("grads must have shape [", n, ", ", dim,
                                "] (one row per id, table dim ", dim, "), got ",
                                grads.shape().DebugString()));
    for (int i = 4; i <= 8; ++i) OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(i), "hyper-parameter"));
    OptimizerParams p;
    p.kind = kind_;
    p.learning_rate = ctx->input(4).scalar<float>()();
    p.epsilon = ctx->input(5).scalar<float>()();
    p.beta1 = ctx->input(6).scalar<float>()();
    p.beta2 = ctx->input(7).scalar<float>()();
    p.step = ctx->input(8).scalar<int64_t>()();
    OP_REQUIRES(ctx, kind_ != Optimizer::kAdam || p.step >= 1,
                InvalidArgument("Adam's step must be >= 1, got ", p.step));
    Tensor* updated = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &updated));
    updated->scalar<int64_t>()() = table.ApplyGradients(
        ids.flat<int64_t>().data(),
        handles.NumElements() ? handles.flat<int64_t>().data() : nullptr,
        grads.flat<float>().data(), n, p, MakeParallelFor(ctx));
  }

 private:
  Optimizer kind_;
  int64_t required_slots_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableApplyGradients").Device(DEVICE_CPU), ApplyGradientsOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .Output("admitted: int64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Number of ids known to the table, and of those with a row (cached ids included).");

class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    Tensor* size = nullptr;
    Tensor* admitted = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &size));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &admitted));
    size->scalar<int64_t>()() = res->table().Size();
    admitted->scalar<int64_t>()() = res->table().AdmittedSize();
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableSize").Device(DEVICE_CPU), SizeOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableEvict")
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
    .Doc("Evicts ids not seen for max_age steps, then the least recently seen beyond "
         "max_size (after writing the cache back; evicted ids leave the cache too).");

class EvictOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    for (int i = 1; i <= 3; ++i) OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(i), "evict argument"));
    const std::vector<int64_t> evicted = res->table().Evict(
        ctx->input(1).scalar<int64_t>()(), ctx->input(2).scalar<int64_t>()(),
        ctx->input(3).scalar<int64_t>()());
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(evicted.size())}), &out));
    std::copy(evicted.begin(), evicted.end(), out->flat<int64_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableEvict").Device(DEVICE_CPU), EvictOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableExport")
    .Input("table: resource")
    .Output("ids: int64")
    .Output("values: float")
    .Output("slots: float")
    .Output("freq: int64")
    .Output("last_seen: int64")
    .Output("admitted: bool")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0")
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
    .SetIsStateful()
    .Doc("Every entry, sorted by id: rows, slots, frequency, last-seen step, admitted "
         "(after writing the cache back: exactly the trained state).");

class ExportOp : public OpKernel {
 public:
  explicit ExportOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(c, c->GetAttr("num_slots", &num_slots_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    OP_REQUIRES_OK(ctx, CheckDim(res->table(), dim_));
    OP_REQUIRES(ctx, res->table().config().num_slots == num_slots_,
                InvalidArgument("the table has ", res->table().config().num_slots,
                                " slots but the op was built for ", num_slots_));
    OP_REQUIRES_OK(ctx, WriteExport(ctx, res->table().Export(), dim_, num_slots_));
  }

 private:
  int64_t dim_, num_slots_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableExport").Device(DEVICE_CPU), ExportOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaTableImport")
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
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Loads exported entries (only those owned by shard_index of num_shards); the cache "
         "is written back and emptied first.");

class ImportOp : public OpKernel {
 public:
  explicit ImportOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("clear_first", &clear_first_));
  }
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &res));
    HashTable& table = res->table();
    const int64_t dim = table.config().dim;
    const int64_t sdim = table.config().num_slots * dim;
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    const int64_t n = ids.dim_size(0);
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(0) == n && values.dim_size(1) == dim,
                InvalidArgument("imported values must have shape [", n, ", ", dim,
                                "] to match the table's dim ", dim, ", got ",
                                values.shape().DebugString()));
    OP_REQUIRES(ctx, slots.dims() == 2 && slots.dim_size(0) == n && slots.dim_size(1) == sdim,
                InvalidArgument("imported slots must have shape [", n, ", ", sdim,
                                "] (", table.config().num_slots, " slots x dim ", dim,
                                "), got ", slots.shape().DebugString()));
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
    Tensor* imported = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &imported));
    imported->scalar<int64_t>()() = table.Import(
        ids.flat<int64_t>().data(), values.flat<float>().data(), slots.flat<float>().data(),
        ctx->input(4).flat<int64_t>().data(), ctx->input(5).flat<int64_t>().data(),
        admitted.data(), n, clear_first_, shard, shards);
  }

 private:
  bool clear_first_;
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableImport").Device(DEVICE_CPU), ImportOp);

// ---------------------------------------------------------------------------------------
// The cache's own: a table created without a cache refuses them.
Status GetCachedTable(OpKernelContext* ctx, ::tensorflow::core::RefCountPtr<TableResource>* out) {
  TF_RETURN_IF_ERROR(GetTable(ctx, out));
  if (!(*out)->table().HasCache()) {
    return InvalidArgument("the table has no cache (it was created with cache_capacity 0)");
  }
  return ::tensorflow::OkStatus();
}

REGISTER_OP("GmetaTableCacheFlush")
    .Input("table: resource")
    .Output("written: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Writes every cached entry changed since its last write-back to the table.");

class CacheFlushOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetCachedTable(ctx, &res));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = res->table().FlushCache();
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableCacheFlush").Device(DEVICE_CPU), CacheFlushOp);

REGISTER_OP("GmetaTableCacheRebalance")
    .Input("table: resource")
    .Output("cached: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Flushes the cache, then makes it hold the table's most frequent ids (ties by "
         "ascending id), found by one pass over the index; returns how many are cached.");

class CacheRebalanceOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetCachedTable(ctx, &res));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = res->table().RebalanceCache(MakeParallelFor(ctx));
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaTableCacheRebalance").Device(DEVICE_CPU), CacheRebalanceOp);

REGISTER_OP("GmetaTableCacheStats")
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

class CacheStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> res;
    OP_REQUIRES_OK(ctx, GetCachedTable(ctx, &res));
    const CacheStats s = res->table().GetCacheStats();
    const std::vector<int64_t> ids = res->table().CachedIds();
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
REGISTER_KERNEL_BUILDER(Name("GmetaTableCacheStats").Device(DEVICE_CPU), CacheStatsOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaDedup")
    .Input("ids: int64")
    .Input("num_partitions: int32")
    .Output("unique_ids: int64")
    .Output("inverse: int32")
    .Output("counts: int64")
    .Output("splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle n;
      TF_RETURN_IF_ERROR(VectorLength(c, 0, &n));
      const auto u = InferenceContext::kUnknownDim;
      c->set_output(0, c->Vector(u));
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->Vector(u));
      c->set_output(3, c->Vector(u));
      return ::tensorflow::OkStatus();
    })
    .Doc("Virtual Sparse Id: unique ids grouped by owner, inverse index, counts, splits.");

class DedupOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "num_partitions"));
    const int64_t parts = ctx->input(1).scalar<int32_t>()();
    OP_REQUIRES(ctx, parts >= 1,
                InvalidArgument("num_partitions must be >= 1, got ", parts));
    OP_REQUIRES(ctx, ids.dim_size(0) < (int64_t{1} << 31),
                InvalidArgument("at most 2^31 - 1 ids per call, got ", ids.dim_size(0)));
    const int64_t n = ids.dim_size(0);
    ::tensorflow::Status status;
    const auto allocate = [&](int64_t u) -> DedupOutputs {
      Tensor *unique, *inverse, *counts, *splits;
      status = ctx->allocate_output(0, TensorShape({u}), &unique);
      if (status.ok()) status = ctx->allocate_output(1, TensorShape({n}), &inverse);
      if (status.ok()) status = ctx->allocate_output(2, TensorShape({u}), &counts);
      if (status.ok()) status = ctx->allocate_output(3, TensorShape({parts}), &splits);
      if (!status.ok()) return DedupOutputs{};
      return DedupOutputs{unique->flat<int64_t>().data(), inverse->flat<int32_t>().data(),
                          counts->flat<int64_t>().data(), splits->flat<int32_t>().data()};
    };
    Dedup(ids.flat<int64_t>().data(), n, parts, allocate, MakeParallelFor(ctx));
    OP_REQUIRES_OK(ctx, status);
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaDedup").Device(DEVICE_CPU), DedupOp);

// ---------------------------------------------------------------------------------------
REGISTER_OP("GmetaPartitionOf")
    .Input("ids: int64")
    .Input("num_partitions: int32")
    .Output("owner: int32")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::OkStatus();
    })
    .Doc("Owner rank of each id, the same function the dedup op partitions by.");

class PartitionOfOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "num_partitions"));
    const int64_t parts = ctx->input(1).scalar<int32_t>()();
    OP_REQUIRES(ctx, parts >= 1, InvalidArgument("num_partitions must be >= 1, got ", parts));
    Tensor* owner = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &owner));
    const int64_t* in = ids.flat<int64_t>().data();
    int32_t* out = owner->flat<int32_t>().data();
    for (int64_t i = 0; i < ids.NumElements(); ++i) {
      out[i] = static_cast<int32_t>(OwnerOf(in[i], parts));
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("GmetaPartitionOf").Device(DEVICE_CPU), PartitionOfOp);

}  // namespace
}  // namespace gmeta
