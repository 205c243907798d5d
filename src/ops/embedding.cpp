// embedding_fwd / embedding_bwd: argument checks and dispatch by device.
#include "lowbit/ops.h"
#include "ops/embedding_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

using namespace ops_detail;

namespace {

// Shared by both directions: rows [N, D] (out or dout) against tokens [N] and the table [V, D].
void check_embedding(const char* op, const char* rows_name, const TensorView& rows,
                     const TensorView& tokens, const char* table_name, const TensorView& table) {
  check_rank(op, rows_name, "[N, D]", rows, 2);
  check_rank(op, "tokens", "[N]", tokens, 1);
  check_rank(op, table_name, "[V, D]", table, 2);
  check_dtype(op, "tokens", tokens, DType::kI32);
  LOWBIT_USER_CHECK(rows.size(0) == tokens.size(0),
                    "{}: {} [N, D] has N = {} rows but tokens [N] has {} entries", op, rows_name,
                    rows.size(0), tokens.size(0));
  LOWBIT_USER_CHECK(rows.size(1) == table.size(1),
                    "{}: {} [N, D] has D = {} but {} [V, D] has D = {}", op, rows_name,
                    rows.size(1), table_name, table.size(1));
  check_contiguous(op, rows_name, rows);
  check_contiguous(op, "tokens", tokens);
  check_contiguous(op, table_name, table);
}

}  // namespace

void embedding_fwd(Context& ctx, const TensorView& out, const TensorView& tokens,
                   const TensorView& table) {
  const char* op = "embedding_fwd";
  check_devices(op, ctx, {{"out", &out}, {"tokens", &tokens}, {"table", &table}});
  check_embedding(op, "out", out, tokens, "table", table);
  check_float(op, "out", out, DType::kBF16);
  check_float(op, "table", table, DType::kBF16);
  if (out.numel() == 0) return;
  LOWBIT_USER_CHECK(table.size(0) > 0, "{}: table {} has no rows", op, table.str());
  if (ctx.on_gpu()) {
    embedding_fwd_cuda(ctx, out, tokens, table);
  } else {
    embedding_fwd_cpu(out, tokens, table);
  }
}

void embedding_bwd(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                   const TensorView& dout) {
  const char* op = "embedding_bwd";
  check_devices(op, ctx, {{"dtable", &dtable}, {"tokens", &tokens}, {"dout", &dout}});
  check_embedding(op, "dout", dout, tokens, "dtable", dtable);
  check_dtype(op, "dtable", dtable, DType::kF32);
  check_float(op, "dout", dout, DType::kBF16);
  if (dout.numel() == 0) return;
  if (ctx.on_gpu()) {
    embedding_bwd_cuda(ctx, dtable, tokens, dout);
  } else {
    embedding_bwd_cpu(dtable, tokens, dout);
  }
}

}  // namespace lowbit
