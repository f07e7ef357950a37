// What every kernel of the op library shares: the intra-op thread pool as a ParallelFor,
// argument checks with messages that name the argument, a table's config read from op
// attributes, and the outputs of an export.
#ifndef GMETA_OPS_KERNEL_SUPPORT_H_
#define GMETA_OPS_KERNEL_SUPPORT_H_

#include <algorithm>
#include <string>

#include "hash_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace gmeta {

inline ParallelFor MakeParallelFor(::tensorflow::OpKernelContext* ctx) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [workers](int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    workers->ParallelFor(n, cost, fn);
  };
}

inline ::tensorflow::Status CheckVector(const ::tensorflow::Tensor& t, const char* name) {
  if (t.dims() != 1) {
    return ::tensorflow::errors::InvalidArgument(name, " must be a vector (rank 1), got shape ",
                                                 t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// The table behind a handle must have the dim the op was built for.
inline ::tensorflow::Status CheckDim(const HashTable& table, int64_t dim) {
  if (table.config().dim != dim) {
    return ::tensorflow::errors::InvalidArgument("the table has dim ", table.config().dim,
                                                 " but the op was built for dim ", dim);
  }
  return ::tensorflow::OkStatus();
}

inline ::tensorflow::Status CheckScalar(const ::tensorflow::Tensor& t, const char* name) {
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return ::tensorflow::errors::InvalidArgument(name, " must be a scalar, got shape ",
                                                 t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

inline ::tensorflow::Status CheckRows(const ::tensorflow::Tensor& t, int64_t n, int64_t width,
                                      const char* name) {
  if (t.dims() != 2 || t.dim_size(0) != n || t.dim_size(1) != width) {
    return ::tensorflow::errors::InvalidArgument(name, " must have shape [", n, ", ", width,
                                                 "], got ", t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// The table attributes shared by every table-creating op (see REGISTER_OP("GmetaHashTable")).
inline ::tensorflow::Status ReadTableConfig(::tensorflow::OpKernelConstruction* c,
                                            TableConfig* config) {
  std::string init;
  float slot_init, init_scale, default_value;
  int64_t seed;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &config->dim));
  TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &config->num_slots));
  TF_RETURN_IF_ERROR(c->GetAttr("slot_init", &slot_init));
  TF_RETURN_IF_ERROR(c->GetAttr("seed", &seed));
  TF_RETURN_IF_ERROR(c->GetAttr("initializer", &init));
  TF_RETURN_IF_ERROR(c->GetAttr("init_scale", &init_scale));
  TF_RETURN_IF_ERROR(c->GetAttr("admit_after", &config->admit_after));
  TF_RETURN_IF_ERROR(c->GetAttr("default_value", &default_value));
  config->slot_init = slot_init;
  config->seed = static_cast<uint64_t>(seed);
  config->init_scale = init_scale;
  config->default_value = default_value;
  config->initializer = init == "zeros"    ? Initializer::kZeros
                        : init == "normal" ? Initializer::kNormal
                                           : Initializer::kUniform;
  return ::tensorflow::OkStatus();
}

// Writes an export to outputs 0..5: ids, values, slots, freq, last_seen, admitted.
inline ::tensorflow::Status WriteExport(::tensorflow::OpKernelContext* ctx,
                                        const ExportedTable& t, int64_t dim, int64_t num_slots) {
  using ::tensorflow::Tensor;
  using ::tensorflow::TensorShape;
  const int64_t n = static_cast<int64_t>(t.ids.size());
  Tensor* out[6];
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n}), &out[0]));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n, dim}), &out[1]));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({n, dim * num_slots}), &out[2]));
  for (int i = 3; i <= 5; ++i) TF_RETURN_IF_ERROR(ctx->allocate_output(i, TensorShape({n}), &out[i]));
  std::copy(t.ids.begin(), t.ids.end(), out[0]->flat<int64_t>().data());
  std::copy(t.values.begin(), t.values.end(), out[1]->flat<float>().data());
  std::copy(t.slots.begin(), t.slots.end(), out[2]->flat<float>().data());
  std::copy(t.freq.begin(), t.freq.end(), out[3]->flat<int64_t>().data());
  std::copy(t.last_seen.begin(), t.last_seen.end(), out[4]->flat<int64_t>().data());
  bool* adm = out[5]->flat<bool>().data();
  for (int64_t i = 0; i < n; ++i) adm[i] = t.admitted[i] != 0;
  return ::tensorflow::OkStatus();
}

}  // namespace gmeta

#endif  // GMETA_OPS_KERNEL_SUPPORT_H_
