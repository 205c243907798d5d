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

// The sort plan, when given: [2, N] i32, contiguous, on the tokens' device.
void check_plan(const char* op, const TensorView& plan, const TensorView& tokens) {
  if (plan.data == nullptr) return;
  check_rank(op, "sort_plan", "[2, N]", plan, 2);
  check_dtype(op, "sort_plan", plan, DType::kI32);
  check_contiguous(op, "sort_plan", plan);
  LOWBIT_USER_CHECK(plan.size(0) == 2 && plan.size(1) == tokens.size(0),
                    "{}: sort_plan must be [2, N] = [2, {}] for tokens [N]; got {}", op,
                    tokens.size(0), plan.str());
  LOWBIT_USER_CHECK(tokens.size(0) < (int64_t(1) << 31),
                    "{}: a sort plan holds i32 positions; {} tokens are too many (pass none)", op,
                    tokens.size(0));
}

}  // namespace

void embedding_fwd(Context& ctx, const TensorView& out, const TensorView& tokens,
                   const TensorView& table, const TensorView& sort_plan) {
  const char* op = "embedding_fwd";
  check_devices(op, ctx, {{"out", &out}, {"tokens", &tokens}, {"table", &table}});
  if (sort_plan.data != nullptr) check_devices(op, ctx, {{"sort_plan", &sort_plan}});
  check_embedding(op, "out", out, tokens, "table", table);
  check_float(op, "out", out, DType::kBF16);
  check_float(op, "table", table, DType::kBF16);
  check_plan(op, sort_plan, tokens);
  if (out.numel() == 0) return;
  LOWBIT_USER_CHECK(table.size(0) > 0, "{}: table {} has no rows", op, table.str());
  if (ctx.on_gpu()) {
    embedding_fwd_cuda(ctx, out, tokens, table, sort_plan);
  } else {
    embedding_fwd_cpu(out, tokens, table);
    if (sort_plan.data != nullptr) embedding_sort_plan_cpu(sort_plan, tokens, table.size(0));
  }
}

void embedding_bwd(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                   const TensorView& dout, const TensorView& sort_plan) {
  const char* op = "embedding_bwd";
  check_devices(op, ctx, {{"dtable", &dtable}, {"tokens", &tokens}, {"dout", &dout}});
  if (sort_plan.data != nullptr) check_devices(op, ctx, {{"sort_plan", &sort_plan}});
  check_embedding(op, "dout", dout, tokens, "dtable", dtable);
  check_dtype(op, "dtable", dtable, DType::kF32);
  check_float(op, "dout", dout, DType::kBF16);
  check_plan(op, sort_plan, tokens);
  if (dout.numel() == 0) return;
  if (ctx.on_gpu()) {
    embedding_bwd_cuda(ctx, dtable, tokens, dout, EmbeddingSort::kAuto, sort_plan);
  } else {
    embedding_bwd_cpu(dtable, tokens, dout, sort_plan);
  }
}

}  // namespace lowbit
