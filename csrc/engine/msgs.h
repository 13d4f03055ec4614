/* msgs.h: the messages the engine keeps for the binding (msgs.c), which
 * takes them after each call: warnings (Python warnings), notes (explained
 * recompiles) and compile log lines. The bottom of the engine: it uses no
 * other part. */
#ifndef TPU_ENGINE_MSGS_H
#define TPU_ENGINE_MSGS_H

#include <stdbool.h>

typedef struct {
  char *warnings[8]; /* owned, pending for the binding */
  int nwarnings;
  char *notes[8]; /* owned: explanations pending for the binding */
  int nnotes;
  char *logs[16]; /* owned: compile lines pending for the binding (the newest kept) */
  int nlogs;
} tpu_msgs;

typedef enum { TPU_MSG_WARNING, TPU_MSG_NOTE, TPU_MSG_LOG } tpu_msg_kind;

/* A copy of s (NULL stays NULL) in *out; false when out of memory. */
bool tpu_dup(const char *s, char **out);
/* Queues a warning (printf format); dropped when 8 are pending. */
void tpu_msgs_warn(tpu_msgs *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Queues an owned note (NULL: none); freed when 8 are pending. */
void tpu_msgs_note(tpu_msgs *m, char *note);
/* Queues an owned log line (NULL: none); with 16 pending the oldest is dropped. */
void tpu_msgs_log(tpu_msgs *m, char *line);
/* The oldest pending message of a kind, now the caller's; NULL when none. */
char *tpu_msgs_take(tpu_msgs *m, tpu_msg_kind kind);
void tpu_msgs_free(tpu_msgs *m);

#endif
