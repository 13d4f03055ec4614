/* explain.c: explaining recompiles of single ops (TORCHTPU_EXPLAIN_RECOMPILES=1).
 */
#include "bind.h"

#include <string.h>

/* ---- explaining recompiles (TORCHTPU_EXPLAIN_RECOMPILES=1) -------------------------------- */

static void tpu_put_dims(char *buf, size_t n, const int64_t *d, int rank) {
  size_t o = strlen(buf);
  o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "[");
  for (int i = 0; i < rank && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)d[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

static void tpu_describe_tensor(const tpu_tref *t, char *buf, size_t n) {
  if (t->host) {
    snprintf(buf, n, "CPU scalar %s", tpu_dtype_name(t->dtype));
    return;
  }
  if (!t->rec && !t->zero_size) {
    snprintf(buf, n, "None");
    return;
  }
  snprintf(buf, n, "%s", tpu_dtype_name(t->dtype));
  tpu_put_dims(buf, n, t->sizes, t->rank);
  int64_t expect = 1;
  bool contiguous = true;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->sizes[i] != 1 && t->strides[i] != expect) contiguous = false;
    expect *= t->sizes[i];
  }
  size_t o = strlen(buf);
  if (!contiguous && o < n) {
    snprintf(buf + o, n - o, " strides ");
    tpu_put_dims(buf, n, t->strides, t->rank);
  }
  o = strlen(buf);
  if (t->view != TPU_VIEW_WHOLE && o < n)
    snprintf(buf + o, n - o, " (a view of %lld elements)", (long long)t->rec_numel);
}

/* What the program key holds of one argument, as text (owned). */
static char *tpu_describe_arg(const tpu_arg *a, int op_id) {
  char buf[512];
  buf[0] = 0;
  switch (a->kind) {
    case TPU_ARG_NONE: snprintf(buf, sizeof buf, "None"); break;
    case TPU_ARG_TENSOR: tpu_describe_tensor(&a->t, buf, sizeof buf); break;
    case TPU_ARG_TENSORS: {
      size_t o = (size_t)snprintf(buf, sizeof buf, "%d tensors: ", a->nlist);
      for (int j = 0; j < a->nlist && o < sizeof buf - 64; j++) {
        char one[160];
        tpu_describe_tensor(&a->list[j], one, sizeof one);
        o += (size_t)snprintf(buf + o, sizeof buf - o, j ? ", %s" : "%s", one);
      }
      break;
    }
    case TPU_ARG_SCALAR: {
      static const char *kinds[] = {"bool", "int", "float", "complex"};
      if (tpu_op_table[op_id].flags & TPU_OP_SCALAR_ATTRS)
        snprintf(buf, sizeof buf, "%s %g", kinds[a->skind], a->f);
      else
        snprintf(buf, sizeof buf, "a Python %s", kinds[a->skind]);
      break;
    }
    case TPU_ARG_INT: snprintf(buf, sizeof buf, "%lld", (long long)a->i); break;
    case TPU_ARG_BOOL: snprintf(buf, sizeof buf, "%s", a->i ? "True" : "False"); break;
    case TPU_ARG_INTS: tpu_put_dims(buf, sizeof buf, a->ints, a->nints); break;
    case TPU_ARG_FLOAT: snprintf(buf, sizeof buf, "%g", a->f); break;
    case TPU_ARG_FLOATS: {
      size_t o = (size_t)snprintf(buf, sizeof buf, "[");
      for (int j = 0; j < a->nints && o < sizeof buf; j++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, j ? ", %g" : "%g", a->floats[j]);
      if (o < sizeof buf) snprintf(buf + o, sizeof buf - o, "]");
      break;
    }
    case TPU_ARG_DTYPE: snprintf(buf, sizeof buf, "%s", tpu_dtype_name(a->dtype)); break;
    case TPU_ARG_STR: snprintf(buf, sizeof buf, "'%s'", a->str); break;
    default: break;
  }
  if (a->is_default && a->kind != TPU_ARG_TENSOR) {
    size_t o = strlen(buf);
    snprintf(buf + o, sizeof buf - o, " (default)");
  }
  return strdup(buf);
}

/* A call compiled a new program: say what differs from the last program
 * compiled for the same op, and remember this call's arguments. */
int tpu_explain(tpu_mod_state *st, tpu_kernel *k, const tpu_arg *args) {
  int n = k->nparams, op = k->op_id;
  char **now = calloc((size_t)(n ? n : 1), sizeof *now);
  if (!now) return 0;
  for (int i = 0; i < n; i++) now[i] = tpu_describe_arg(&args[i], op);
  char **old = st->explained[op];
  int rc = 0;
  if (old) {
    char msg[4096];
    size_t o = (size_t)snprintf(
        msg, sizeof msg, "torchtpu: recompiling aten::%s (compiled before for other inputs):", tpu_op_table[op].name);
    int diffs = 0;
    for (int i = 0; i < n && i < st->nexplained[op] && o < sizeof msg; i++) {
      if (!now[i] || !old[i] || strcmp(now[i], old[i]) == 0) continue;
      const char *name = PyUnicode_AsUTF8(k->names[i]);
      o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s: %s -> %s", diffs++ ? ";" : "", name ? name : "?", old[i],
                            now[i]);
    }
    if (!diffs && o < sizeof msg)
      snprintf(msg + o, sizeof msg - o,
               " the same inputs (the program cache was emptied, or the matmul precision changed)");
    rc = tpu_stderr_line(msg);
    for (int i = 0; i < st->nexplained[op]; i++) free(old[i]);
    free(old);
  }
  st->explained[op] = now;
  st->nexplained[op] = n;
  return rc;
}
