/* msgs.c: the engine's pending messages (msgs.h). */
#define _POSIX_C_SOURCE 200809L
#include "msgs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPU_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

bool tpu_dup(const char *s, char **out) {
  *out = s ? strdup(s) : NULL;
  return !s || *out;
}

void tpu_msgs_warn(tpu_msgs *m, const char *fmt, ...) {
  if (m->nwarnings == TPU_COUNT(m->warnings)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *w = strdup(buf);
  if (w) m->warnings[m->nwarnings++] = w;
}

void tpu_msgs_note(tpu_msgs *m, char *note) {
  if (!note) return;
  if (m->nnotes == TPU_COUNT(m->notes))
    free(note);
  else
    m->notes[m->nnotes++] = note;
}

/* The oldest of n owned messages, now the caller's; NULL when none. */
static char *tpu_queue_take(char **q, int *n) {
  if (!*n) return NULL;
  char *w = q[0];
  memmove(q, q + 1, sizeof(char *) * (size_t)(*n - 1));
  (*n)--;
  return w;
}

void tpu_msgs_log(tpu_msgs *m, char *line) {
  if (!line) return;
  if (m->nlogs == TPU_COUNT(m->logs)) free(tpu_queue_take(m->logs, &m->nlogs));
  m->logs[m->nlogs++] = line;
}

char *tpu_msgs_take(tpu_msgs *m, tpu_msg_kind kind) {
  switch (kind) {
    case TPU_MSG_WARNING: return tpu_queue_take(m->warnings, &m->nwarnings);
    case TPU_MSG_NOTE: return tpu_queue_take(m->notes, &m->nnotes);
    default: return tpu_queue_take(m->logs, &m->nlogs);
  }
}

void tpu_msgs_free(tpu_msgs *m) {
  for (int i = 0; i < m->nwarnings; i++) free(m->warnings[i]);
  for (int i = 0; i < m->nnotes; i++) free(m->notes[i]);
  for (int i = 0; i < m->nlogs; i++) free(m->logs[i]);
  m->nwarnings = m->nnotes = m->nlogs = 0;
}
