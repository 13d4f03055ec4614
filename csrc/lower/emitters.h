/* emitters.h: the prototype of every emitter, made from the op table, so that
 * the compiler checks each emitter's definition (-Wmissing-prototypes) and
 * the table's initialiser in lower.c against the same declarations. */
#ifndef TPU_EMITTERS_H
#define TPU_EMITTERS_H

#include "lower.h"

#define TPU_OP(id, name, emit, flags) void emit(tpu_lower *L);
#include "ops.def"
#undef TPU_OP

#endif
