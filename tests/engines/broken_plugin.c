/* A deliberately broken engine, for kvdiff's own tests: another engine plugin (the example,
 * dlopened from KVDIFF_EXAMPLE_ENGINE, or the plugin named by the option inner=PATH, such as
 * llama.cpp's) behind one injected bug, chosen with the option bug=NAME (the other options go to
 * the inner engine):
 *
 *   bug=truncate  truncate() records the new length and leaves the cache as it was, as a
 *                 llama.cpp plugin that forgets llama_memory_seq_rm: the next append runs at the
 *                 old position, after positions the caller meant to forget.
 *   bug=fork      fork() returns a fresh, empty session that claims the parent's length, as a
 *                 fork without llama_memory_seq_cp: the child's appends see no history.
 *   bug=crash     append() dies of SIGSEGV once a session would pass 24 positions (--isolate).
 *   bug=hang      append() never returns once a session would pass 24 positions (--isolate).
 *   bug=shift     shift() says OK and changes nothing (the version-3 build): a plugin that claims
 *                 a context shift it never made, whose length() then says so.
 *   bug=none      no bug (the wrapper itself must conform).
 *
 * Built as it is, it is a version-1 plugin on purpose (kvdiff runs its batch steps one append per
 * item). Built with KVDIFF_BROKEN_ABI2 (kvdiff_engine_broken_v2) it declares ABI 2 and passes
 * append_batch to the inner engine (which must have it), where bug=crash and bug=hang strike too,
 * once any item's session would pass 24 positions. Built with KVDIFF_BROKEN_ABI3
 * (kvdiff_engine_broken_v3) it declares ABI 3 too and passes shift to the inner engine's.
 *
 * An engine that misbehaves on purpose, for the bad-input catalogue: fault=WHERE:WHAT strikes in
 * WHERE (open, info, close, or append once a session would pass 24 positions) by WHAT (exit0:
 * exit(0); exit3: exit(3); segv: SIGSEGV; hang: never returns; print: prints a "PASS: ..." line on
 * stdout and goes on; exit0race: exit(0), and a second thread's exit(0) while the first runs the
 * exit handlers, as two of kvdiff's campaign workers can do). Faults before any option can be read
 * are chosen when building: with KVDIFF_FAULT_AT_LOAD=WHAT the library's ELF constructor strikes,
 * with KVDIFF_GARBAGE_ENTRY the entry point returns a pointer to nothing
 * (tests/engines/CMakeLists.txt builds one of each). And, independently, lie=NAME: length() lies
 * while the cache is right, as a plugin that counts its positions wrong: lie=plus1 (length+1),
 * lie=zero, lie=minus1 (-1), lie=max (INT64_MAX).
 *
 * `kvdiff conform` and `kvdiff check` must catch both bugs (tests/engines/conform_cli_test.cc). */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvdiff/engine.h"

enum bug { BUG_NONE, BUG_TRUNCATE, BUG_FORK, BUG_CRASH, BUG_HANG, BUG_SHIFT };
enum lie { LIE_NONE, LIE_PLUS1, LIE_ZERO, LIE_MINUS1, LIE_MAX };

enum { kBugLength = 24 }; /* where bug=crash and bug=hang strike */

enum where { AT_NOWHERE, AT_OPEN, AT_INFO, AT_CLOSE, AT_APPEND };
enum what { DO_NOTHING, DO_EXIT0, DO_EXIT3, DO_SEGV, DO_HANG, DO_PRINT, DO_EXIT0_RACE };

static void* ExitZero(void* unused) {
  (void)unused;
  exit(0);
}

/* Registered last, so run first by exit(): starts the second exit(0) and returns at once, so the
 * first thread goes on to kvdiff's own handler while the second walks the list behind it. */
static void StartSecondExit(void) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, ExitZero, NULL) == 0) pthread_detach(thread);
}

static void Strike(enum what what) {
  switch (what) {
    case DO_EXIT0_RACE:
      atexit(StartSecondExit);
      exit(0);
    case DO_EXIT0:
      exit(0);
    case DO_EXIT3:
      exit(3);
    case DO_SEGV:
      raise(SIGSEGV);
      break;
    case DO_HANG:
      for (;;) pause();
    case DO_PRINT:
      printf("PASS: 100 of 100 cases run, 0 failed (printed by the engine)\n");
      fflush(stdout);
      break;
    case DO_NOTHING:
      break;
  }
}

#ifdef KVDIFF_FAULT_AT_LOAD
__attribute__((constructor)) static void OnLoad(void) { Strike(KVDIFF_FAULT_AT_LOAD); }
#endif

/* "open:segv" -> AT_OPEN, DO_SEGV; 0 when either half is unknown. */
static int ParseFault(const char* text, enum where* where, enum what* what) {
  static const char* const kWhere[] = {"", "open:", "info:", "close:", "append:"};
  static const char* const kWhat[] = {"", "exit0", "exit3", "segv", "hang", "print", "exit0race"};
  for (int w = 1; w < 5; ++w) {
    if (strncmp(text, kWhere[w], strlen(kWhere[w])) != 0) continue;
    for (int d = 1; d < 7; ++d) {
      if (strcmp(text + strlen(kWhere[w]), kWhat[d]) != 0) continue;
      *where = (enum where)w;
      *what = (enum what)d;
      return 1;
    }
  }
  return 0;
}

struct kvdiff_engine {
  const kvdiff_engine_api* api; /* the example's */
  kvdiff_engine* inner;
  enum bug bug;
  enum where fault_at;
  enum what fault;
  enum lie lie;
  char error[512];
};

struct kvdiff_session {
  struct kvdiff_engine* engine;
  kvdiff_session* inner;
  int64_t claimed; /* the length this session reports when it differs from the inner one; -1 */
  char error[256];
};

static const kvdiff_engine_api* InnerApi(const char* path, char* error, size_t size) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    snprintf(error, size, "broken: cannot load the inner engine %.300s: %s", path, dlerror());
    return NULL;
  }
  /* POSIX guarantees dlsym's object pointer can hold a function's address; ISO C has no cast
   * between the two, so the bits are copied. */
  void* symbol = dlsym(library, KVDIFF_ENGINE_ENTRY_SYMBOL);
  kvdiff_engine_entry_fn entry = NULL;
  memcpy(&entry, &symbol, sizeof entry);
  return entry ? entry() : NULL;
}

/* Splits bug=NAME and inner=PATH out of the options; the rest, in order, goes to `rest`. 0 on an
 * unknown bug. */
static int ParseOptions(const char* options, struct kvdiff_engine* e, char* inner,
                        size_t inner_size, char* rest, size_t size) {
  enum bug* bug = &e->bug;
  *bug = BUG_NONE;
  e->lie = LIE_NONE;
  snprintf(inner, inner_size, "%s", KVDIFF_EXAMPLE_ENGINE);
  rest[0] = '\0';
  if (!options) return 1;
  char copy[1024];
  snprintf(copy, sizeof copy, "%s", options);
  for (char* item = strtok(copy, ",\n"); item; item = strtok(NULL, ",\n")) {
    if (strncmp(item, "inner=", 6) == 0) {
      snprintf(inner, inner_size, "%s", item + 6);
      continue;
    }
    if (strncmp(item, "fault=", 6) == 0) {
      if (!ParseFault(item + 6, &e->fault_at, &e->fault)) return 0;
      continue;
    }
    if (strncmp(item, "lie=", 4) == 0) {
      static const char* const kLies[] = {"none", "plus1", "zero", "minus1", "max"};
      int found = 0;
      for (int k = 0; k < 5; ++k) {
        if (strcmp(item + 4, kLies[k]) == 0) {
          e->lie = (enum lie)k;
          found = 1;
        }
      }
      if (!found) return 0;
      continue;
    }
    if (strncmp(item, "bug=", 4) == 0) {
      const char* name = item + 4;
      if (strcmp(name, "truncate") == 0) {
        *bug = BUG_TRUNCATE;
      } else if (strcmp(name, "fork") == 0) {
        *bug = BUG_FORK;
      } else if (strcmp(name, "crash") == 0) {
        *bug = BUG_CRASH;
      } else if (strcmp(name, "hang") == 0) {
        *bug = BUG_HANG;
      } else if (strcmp(name, "shift") == 0) {
        *bug = BUG_SHIFT;
      } else if (strcmp(name, "none") != 0) {
        return 0;
      }
      continue;
    }
    if (rest[0]) strncat(rest, ",", size - strlen(rest) - 1);
    strncat(rest, item, size - strlen(rest) - 1);
  }
  return 1;
}

static kvdiff_status Open(const char* model_dir, const char* options, kvdiff_engine** out) {
  struct kvdiff_engine* e = calloc(1, sizeof *e);
  *out = e;
  if (!e) return KVDIFF_ENGINE_FAILURE;
  char rest[1024], inner[1024];
  if (!ParseOptions(options, e, inner, sizeof inner, rest, sizeof rest)) {
    snprintf(
        e->error, sizeof e->error,
        "broken: option bug: expected truncate, fork, crash, hang, shift or none; option fault: "
        "expected open, info, close or append, ':', then exit0, exit3, segv, hang, print or "
        "exit0race; option lie: expected plus1, zero, minus1, max or none");
    return KVDIFF_INVALID_INPUT;
  }
  if (e->fault_at == AT_OPEN) Strike(e->fault);
  e->api = InnerApi(inner, e->error, sizeof e->error);
  if (!e->api) return KVDIFF_ENGINE_FAILURE;
  const kvdiff_status status = e->api->open(model_dir, rest, &e->inner);
  if (status != KVDIFF_OK && e->inner) {
    snprintf(e->error, sizeof e->error, "%s", e->api->engine_error(e->inner));
    e->api->close(e->inner);
    e->inner = NULL;
  }
  return status;
}

static const char* EngineError(const kvdiff_engine* e) { return e->error; }

static kvdiff_status EngineInfo(kvdiff_engine* e, kvdiff_engine_info* out) {
  if (e->fault_at == AT_INFO) Strike(e->fault);
  return e->api->engine_info(e->inner, out);
}

static void Close(kvdiff_engine* e) {
  if (!e) return;
  if (e->fault_at == AT_CLOSE) Strike(e->fault);
  if (e->inner) e->api->close(e->inner);
  free(e);
}

static kvdiff_session* Wrap(struct kvdiff_engine* e, kvdiff_session* inner, int64_t claimed) {
  kvdiff_session* s = calloc(1, sizeof *s);
  if (!s) {
    e->api->session_free(inner);
    return NULL;
  }
  s->engine = e;
  s->inner = inner;
  s->claimed = claimed;
  return s;
}

static kvdiff_status SessionNew(kvdiff_engine* e, kvdiff_session** out) {
  kvdiff_session* inner = NULL;
  const kvdiff_status status = e->api->session_new(e->inner, &inner);
  *out = NULL;
  if (status != KVDIFF_OK) {
    snprintf(e->error, sizeof e->error, "%s", e->api->engine_error(e->inner));
    return status;
  }
  *out = Wrap(e, inner, -1);
  return *out ? KVDIFF_OK : KVDIFF_ENGINE_FAILURE;
}

/* The positions the session holds, as the bugs above account them. */
static int64_t Held(const kvdiff_session* s) {
  return s->claimed >= 0 ? s->claimed : s->engine->api->length(s->inner);
}

static int64_t Length(const kvdiff_session* s) {
  const int64_t held = Held(s);
  switch (s->engine->lie) { /* THE LIE */
    case LIE_PLUS1:
      return held + 1;
    case LIE_ZERO:
      return 0;
    case LIE_MINUS1:
      return -1;
    case LIE_MAX:
      return INT64_MAX;
    default:
      return held;
  }
}

/* bug=crash and bug=hang, once `s` would pass kBugLength positions with n more tokens. */
static void StrikeTheBug(const kvdiff_session* s, int64_t n) {
  if (Held(s) + n <= kBugLength) return;
  if (s->engine->bug == BUG_CRASH) raise(SIGSEGV); /* THE BUG */
  if (s->engine->bug == BUG_HANG)
    for (;;) pause(); /* THE BUG */
}

static kvdiff_status Append(kvdiff_session* s, const int32_t* tokens, int64_t n, float* logits,
                            int64_t capacity) {
  if (s->engine->fault_at == AT_APPEND &&
      (Held(s) + n > kBugLength || s->engine->fault == DO_PRINT))
    Strike(s->engine->fault);
  StrikeTheBug(s, n);
  const kvdiff_status status = s->engine->api->append(s->inner, tokens, n, logits, capacity);
  if (status != KVDIFF_OK) {
    snprintf(s->error, sizeof s->error, "%s", s->engine->api->session_error(s->inner));
    return status;
  }
  if (s->claimed >= 0) s->claimed += n;
  return KVDIFF_OK;
}

static kvdiff_status Truncate(kvdiff_session* s, int64_t length) {
  if (s->engine->bug != BUG_TRUNCATE) {
    const kvdiff_status status = s->engine->api->truncate(s->inner, length);
    if (status != KVDIFF_OK)
      snprintf(s->error, sizeof s->error, "%s", s->engine->api->session_error(s->inner));
    return status;
  }
  if (length < 0 || length > Held(s)) {
    snprintf(s->error, sizeof s->error, "truncate to %lld: expected 0..%lld", (long long)length,
             (long long)Held(s));
    return KVDIFF_INVALID_INPUT;
  }
  s->claimed = length; /* THE BUG: the cache keeps every position */
  return KVDIFF_OK;
}

static kvdiff_status Fork(kvdiff_session* s, kvdiff_session** out) {
  kvdiff_session* inner = NULL;
  *out = NULL;
  const kvdiff_status status =
      s->engine->bug == BUG_FORK
          ? s->engine->api->session_new(s->engine->inner, &inner) /* THE BUG */
          : s->engine->api->fork(s->inner, &inner);
  if (status != KVDIFF_OK) {
    snprintf(s->error, sizeof s->error, "fork failed");
    return status;
  }
  const int64_t claimed = s->engine->bug == BUG_FORK ? Held(s) : s->claimed;
  *out = Wrap(s->engine, inner, claimed);
  return *out ? KVDIFF_OK : KVDIFF_ENGINE_FAILURE;
}

static kvdiff_status Reset(kvdiff_session* s) {
  s->claimed = -1;
  return s->engine->api->reset(s->inner);
}

static const char* SessionError(const kvdiff_session* s) { return s->error; }

static void SessionFree(kvdiff_session* s) {
  if (!s) return;
  s->engine->api->session_free(s->inner);
  free(s);
}

#if defined(KVDIFF_BROKEN_ABI2) || defined(KVDIFF_BROKEN_ABI3)
/* The inner engine's append_batch on the inner sessions; the bugs above strike first. */
static kvdiff_status AppendBatch(kvdiff_engine* e, const kvdiff_batch_item* items, int64_t n_items,
                                 float* logits, int64_t capacity) {
  if (e->api->abi_version < 2) {
    snprintf(e->error, sizeof e->error, "broken: the inner engine is version %u: no append_batch",
             e->api->abi_version);
    return KVDIFF_ENGINE_FAILURE;
  }
  if (!items || n_items < 1) {
    snprintf(e->error, sizeof e->error, "a batch of %lld items (expected at least one)",
             (long long)n_items);
    return KVDIFF_INVALID_INPUT;
  }
  kvdiff_batch_item* inner = calloc((size_t)n_items, sizeof *inner);
  if (!inner) return KVDIFF_ENGINE_FAILURE;
  for (int64_t i = 0; i < n_items; i++) {
    if (!items[i].session || items[i].session->engine != e) {
      free(inner);
      snprintf(e->error, sizeof e->error, "batch item %lld is not a session of this engine",
               (long long)i);
      return KVDIFF_INVALID_INPUT;
    }
    StrikeTheBug(items[i].session, items[i].n);
    inner[i] = items[i];
    inner[i].session = items[i].session->inner;
  }
  const kvdiff_status status = e->api->append_batch(e->inner, inner, n_items, logits, capacity);
  free(inner);
  if (status != KVDIFF_OK) {
    snprintf(e->error, sizeof e->error, "%s", e->api->engine_error(e->inner));
    return status;
  }
  for (int64_t i = 0; i < n_items; i++)
    if (items[i].session->claimed >= 0) items[i].session->claimed += items[i].n;
  return KVDIFF_OK;
}
#define KVDIFF_BROKEN_APPEND_BATCH AppendBatch
#else
#define KVDIFF_BROKEN_APPEND_BATCH NULL
#endif

#ifdef KVDIFF_BROKEN_ABI3
/* The inner engine's shift (it must have one), unless bug=shift. */
static kvdiff_status Shift(kvdiff_session* s, int64_t keep, int64_t discard) {
  const kvdiff_engine_api* api = s->engine->api;
  if (api->abi_version < 3 || !api->shift) {
    snprintf(s->error, sizeof s->error, "broken: the inner engine does not shift");
    return KVDIFF_ENGINE_FAILURE;
  }
  if (s->engine->bug == BUG_SHIFT) return KVDIFF_OK; /* THE BUG: nothing moved, length() stays */
  const kvdiff_status status = api->shift(s->inner, keep, discard);
  if (status != KVDIFF_OK) {
    snprintf(s->error, sizeof s->error, "%s", api->session_error(s->inner));
    return status;
  }
  if (s->claimed >= 0) s->claimed -= discard;
  return KVDIFF_OK;
}
#define KVDIFF_BROKEN_VERSION 3u
#elif defined(KVDIFF_BROKEN_ABI2)
#define KVDIFF_BROKEN_VERSION 2u
#else
#define KVDIFF_BROKEN_VERSION 1u /* a version-1 plugin: batch steps run one append per item */
#endif

static const kvdiff_engine_api kApi = {KVDIFF_BROKEN_VERSION,
                                       "broken-example",
                                       "1",
                                       Open,
                                       EngineError,
                                       EngineInfo,
                                       Close,
                                       SessionNew,
                                       Append,
                                       Length,
                                       Truncate,
                                       Fork,
                                       Reset,
                                       SessionError,
                                       SessionFree,
                                       KVDIFF_BROKEN_APPEND_BATCH,
#ifdef KVDIFF_BROKEN_ABI3
                                       Shift
#else
                                       NULL /* a version-1 or -2 table ends before shift */
#endif
};

#ifdef KVDIFF_GARBAGE_ENTRY
KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) {
  (void)kApi;
  return (const kvdiff_engine_api*)(uintptr_t)0x10; /* THE BUG: points at nothing */
}
#else
KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) { return &kApi; }
#endif
