/*
 * loadfuzz harness: runs load orders, one trial per forked child, and says
 * exactly what happened.
 *
 * It is a fork server in the manner of AFL's: started once, it optionally
 * preloads the libraries that are not under test (libtorch, libpython, ...),
 * then serves trials over two pipes given on the command line:
 *
 *   parent -> server (--ctl FD), one message per trial:
 *       TRIAL <timeout_ms> <mem_mb> <at_exit> <nsteps> <workdir_len>\n<workdir bytes>
 *         at_exit 1: end as `python` ends (Py_FinalizeEx if it runs Python, then exit():
 *         atexit handlers and destructors run);
 *         at_exit 0: end with _exit() once the last step is done (much faster
 *         when libtorch is loaded: its destructors take ~130 ms)
 *       then per step:  <g|l|y> <len>\n<bytes>
 *         g = dlopen RTLD_NOW|RTLD_GLOBAL, l = RTLD_NOW|RTLD_LOCAL,
 *         y = run the bytes as Python source in an interpreter this process embeds
 *             (initialised on first use as the program LOADFUZZ_PYTHON names, so that
 *             sys.path and site are that interpreter's), as `python -c` runs it: an
 *             exception fails the step, SystemExit ends the process
 *   server -> parent (--status FD):
 *       READY <version> <pid> <out_total> <head_len> <tail_len>\n<head><tail>
 *                                                    once, after preloading; version is
 *                                                    PROTOCOL_VERSION, checked by the parent;
 *                                                    then what a Python preload printed
 *       PRELOAD-ERROR <len>\n<error bytes>            instead, if a preload failed
 *       RESULT <wait_status> <timed_out> <started> <done> <maxrss_kb> <elapsed_us>
 *              <out_total> <head_len> <tail_len> <err_len> <leftovers>\n
 *              <head bytes><tail bytes><err bytes>   after every trial
 *
 * Prefix sharing, for trials that begin with the same steps (a matrix row):
 *
 *   parent -> server:  PREFIX ... (the same shape as TRIAL: the shared steps)
 *   server -> parent:  ROW <pid> <out_total> <head_len> <tail_len>\n<head><tail>
 *                        a row server, forked from this one, did the steps and
 *                        now serves TRIAL messages (the steps after the prefix;
 *                        `started` and `done` count those) until END\n;
 *                        what the prefix printed comes here, once
 *                      NO-ROW <len>\n<why>
 *                        instead, when a step failed or left the process in a
 *                        state a fork would not copy (a thread, a child, a timer,
 *                        a pending signal, a changed or non-empty working
 *                        folder, the server's pipes touched, a fork handler
 *                        registered): run them one by one
 *   parent -> server:  END\n      the row server exits; its server serves again
 *
 * The step trace (which step started, which finished, the dlerror text) lives
 * in a page shared between server and child, so nothing a library does to its
 * file descriptors can lose or forge it; the child closes the server's pipes
 * before its first step. The server is a child subreaper: whatever the
 * libraries fork, even into a new session, is re-parented to it and killed
 * when the trial ends. Each trial gets stdin from /dev/null, stdout and stderr
 * on one bounded capture pipe, RLIMIT_CORE 0, RLIMIT_AS as asked, its own
 * working folder, and SIGKILL when its server dies. The server ends, killing
 * its trial, as soon as its parent closes (or dies with) the control pipe.
 *
 * A server may also start its embedded interpreter before serving
 * (--preload-python SOURCE, after libpython was preloaded RTLD_GLOBAL): it is
 * initialised exactly as a trial's first `y` step would do it, then runs SOURCE
 * (e.g. `import torch`), so that a trial whose first step is Python pays only
 * its own import. It is refused (PRELOAD-ERROR) when the source fails or leaves
 * a thread or a child process behind: fork copies one thread only.
 */
#define _GNU_SOURCE /* pipe2, syscall, RTLD_DEFAULT and clock_gettime under -std=c11 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 7 /* docs/protocol.md; bump on any change to a message */
#define MAX_STEPS 256
#define HEAD_CAP (16 * 1024)
#define TAIL_CAP (48 * 1024)
#define ERR_CAP 2048
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

enum { ROW_PENDING, ROW_READY, ROW_REFUSED };

struct trace { /* written by the child, read by the server */
    volatile int started, done;
    volatile int row; /* a row server's prefix: ROW_PENDING, ROW_READY or ROW_REFUSED */
    volatile int64_t stamp_ns; /* when the current step (or the exit) began */
    char err[ERR_CAP];
};

struct step { char mode; char *path; };

struct trial {
    long timeout_ms, mem_mb;
    int at_exit, nsteps;
    char *workdir;
    struct step steps[MAX_STEPS];
};

struct capture { /* head and tail of what the child printed */
    char head[HEAD_CAP], tail[TAIL_CAP];
    size_t head_len, tail_len, total;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* _exit, never exit: a server must not run the destructors of what it preloaded,
 * and a row server must not flush the stdio buffers its prefix filled. */
static void die(const char *what) { perror(what); _exit(111); }

/* Fork handlers. A handler that a library registers (pthread_atfork) while a
 * server preloads it, or while a row server takes its prefix, would run in the
 * child of every trial forked from there, where the cold run never forks. So
 * the harness defines the two ways in (the executable comes first in the
 * global scope; build.py exports just these two names), counts, and passes
 * each call on to the C library's own. */
typedef int (*register_fn)(void (*)(void), void (*)(void), void (*)(void), void *);
typedef int (*atfork_fn)(void (*)(void), void (*)(void), void (*)(void));
static volatile unsigned fork_handlers; /* registered in this process so far */

int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void),
                      void *dso) {
    register_fn real = (register_fn)dlsym(RTLD_NEXT, "__register_atfork");
    fork_handlers++;
    return real ? real(prepare, parent, child, dso) : ENOMEM;
}

int pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void)) {
    atfork_fn real = (atfork_fn)dlsym(RTLD_NEXT, "pthread_atfork");
    if (!real) return __register_atfork(prepare, parent, child, NULL);
    fork_handlers++;
    return real(prepare, parent, child);
}

/* ---- reading the parent's messages ------------------------------------- */

static int read_exact(int fd, char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n; len -= (size_t)n;
    }
    return 0;
}

static int read_line(int fd, char *buf, size_t cap) {
    for (size_t i = 0; i + 1 < cap; i++) {
        if (read_exact(fd, buf + i, 1) < 0) return -1;
        if (buf[i] == '\n') { buf[i] = '\0'; return 0; }
    }
    return -1;
}

static char *read_blob(int fd, size_t len) {
    char *s = malloc(len + 1);
    if (!s || read_exact(fd, s, len) < 0) { free(s); return NULL; }
    s[len] = '\0';
    return s;
}

static void free_trial(struct trial *t) {
    free(t->workdir);
    for (int i = 0; i < t->nsteps; i++) free(t->steps[i].path);
    t->nsteps = 0;
    t->workdir = NULL;
}

enum message { MSG_BAD = -1, MSG_EOF, MSG_TRIAL, MSG_PREFIX, MSG_END };

/* Read one message; TRIAL and PREFIX fill `t`. */
static enum message read_message(int fd, struct trial *t) {
    char line[256], kind[8];
    size_t wlen;
    if (read_line(fd, line, sizeof line) < 0) return MSG_EOF;
    if (!strcmp(line, "END")) return MSG_END;
    if (sscanf(line, "%7s %ld %ld %d %d %zu", kind, &t->timeout_ms, &t->mem_mb, &t->at_exit,
               &t->nsteps, &wlen) != 6
        || (strcmp(kind, "TRIAL") && strcmp(kind, "PREFIX"))
        || t->nsteps < 0 || t->nsteps > MAX_STEPS) return MSG_BAD;
    enum message got = kind[0] == 'T' ? MSG_TRIAL : MSG_PREFIX;
    int want = t->nsteps;
    t->nsteps = 0;
    if (!(t->workdir = read_blob(fd, wlen))) return MSG_BAD;
    for (int i = 0; i < want; i++) {
        size_t plen;
        char mode;
        if (read_line(fd, line, sizeof line) < 0 || sscanf(line, "%c %zu", &mode, &plen) != 2
            || !strchr("gly", mode)) return MSG_BAD;
        t->steps[i].mode = mode;
        if (!(t->steps[i].path = read_blob(fd, plen))) return MSG_BAD;
        t->nsteps = i + 1;
    }
    return got;
}

static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(0); /* the parent is gone: nothing left to serve */
        buf += n; len -= (size_t)n;
    }
}

/* ---- the child: perform the steps -------------------------------------- */

/* The trial process: the only one that writes its trace. A process it forks (a library
 * that daemonizes, or a child that returns into the constructor after a failed exec) goes
 * on taking the steps with a copy of the trial's memory, the shared trace mapping too: what
 * it writes goes to `elsewhere`, so it can neither end the trial's steps nor forge them. */
static pid_t trial_pid;

static struct trace *own_trace(struct trace *tr) {
    static struct trace elsewhere;
    return trial_pid == 0 || getpid() == trial_pid ? tr : &elsewhere;
}

static void set_error(struct trace *tr, const char *msg) {
    tr = own_trace(tr);
    snprintf(tr->err, sizeof tr->err, "%s", msg ? msg : "unknown error");
}

/* The status a process that ends now exits with, as `python` would end it: when this one
 * runs Python, the interpreter is finalized first (threads joined, atexit handlers run;
 * 120 when that fails, as CPython). */
static int finalize_python(void) {
    int (*is_init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    int (*finalize)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_FinalizeEx");
    if (!is_init || !finalize || !is_init()) return 0;
    return finalize() < 0 ? 120 : 0;
}

/* The error a Python step reported: hex (so no byte of it can be lost on the way), decoded. */
static void set_error_hex(struct trace *tr, const char *hex) {
    tr = own_trace(tr);
    size_t n = 0;
    unsigned byte;
    for (; hex[0] && hex[1] && n + 1 < ERR_CAP && sscanf(hex, "%2x", &byte) == 1; hex += 2)
        tr->err[n++] = (char)byte;
    tr->err[n] = '\0';
}

/* A step's source runs as `python -c SOURCE` runs it: PyRun_SimpleString, in __main__,
 * compiled as "<string>", no frame of ours around it (a module that walks its callers, or
 * warns with a stacklevel, sees what it sees under python -c). SystemExit goes to CPython,
 * which finalizes and exits with its code; any other exception CPython prints with
 * sys.excepthook, and keeps as sys.last_value. A server's preload runs apart instead
 * (PY_APART: in a namespace of its own, so that __main__ is left as a trial's cold run has
 * it). Then PY_AFTER, apart too: what Python printed goes out before the step ends, as at a
 * real exit; for a failed step (its %d) the step's error is the last line CPython printed
 * for the exception (a message of several lines: its lines joined by spaces, so that no line
 * of it reads as an exception of its own), then that of each exception in its chain, one per
 * line: its cause, and its cause's, and so on; from the first exception it was raised while
 * handling on (its context), each line begins "while handling: " (never a cause of the
 * failure, however it reads); after a KeyboardInterrupt the process ends as python's does,
 * by SIGINT. */
static const char PY_APART[] =
    "exec(compile(bytes.fromhex('%s').decode('utf-8', 'surrogateescape'), '<string>', 'exec'),"
    " {'__name__': '__loadfuzz__'})\n";
static const char PY_AFTER[] =
    "import os, sys\n"
    "for f in (sys.stdout, sys.stderr):\n"
    "    try: f.flush()\n"
    "    except BaseException: pass\n"
    "e = getattr(sys, 'last_value', None) if %d else None\n"
    "if e is not None:\n"
    "    if isinstance(e, KeyboardInterrupt):\n"
    "        os.environ['LOADFUZZ_PY_SIGINT'] = '1'\n"
    "    lines = []\n"
    "    try:\n"
    "        import traceback\n"
    "        te = traceback.TracebackException(type(e), e, None, limit=0,\n"
    "                                          lookup_lines=False, compact=True)\n"
    "        link = ''\n"
    "        while te is not None and len(lines) < 8:\n"
    "            te.__notes__ = None\n"
    "            said = list(te.format_exception_only())[-1]\n"
    "            lines.append(link + ' '.join(s.strip() for s in said.splitlines() if s.strip()))\n"
    "            nxt = te.__cause__\n"
    "            if nxt is None and not te.__suppress_context__:\n"
    "                nxt, link = te.__context__, 'while handling: '\n"
    "            te = nxt\n"
    "    except BaseException:\n"
    "        lines = lines or ['an exception whose text could not be read']\n"
    "    text = '\\n'.join(lines).replace('\\0', '\\\\x00')\n"
    "    os.environ['LOADFUZZ_PY_ERROR'] = text.encode('utf-8', 'backslashreplace').hex()\n";

/* Run `source` apart (PY_APART) with Python's PyRun_SimpleString; what that returns. The
 * source goes in as hex, so that no byte of it can break the words around it. */
static int run_apart(int (*run)(const char *), const char *source) {
    size_t len = strlen(source);
    char *hex = malloc(2 * len + 1), *code = malloc(2 * len + sizeof PY_APART);
    int rc = -1;
    if (hex && code) {
        for (size_t i = 0; i < len; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)source[i]);
        hex[2 * len] = '\0';
        sprintf(code, PY_APART, hex);
        rc = run(code);
    }
    free(hex);
    free(code);
    return rc;
}

/* Start the interpreter this process embeds, unless it runs: as the program
 * LOADFUZZ_PYTHON names (its sys.path, its site-packages and .pth files, its signal
 * set-up and sys.argv, as `python -c` would have them). libpython must already be
 * loaded RTLD_GLOBAL. */
static int start_python(struct trace *tr) {
    int (*is_init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    void (*init)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "Py_InitializeEx");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    void *(*decode)(const char *, size_t *) =
        (void *(*)(const char *, size_t *))dlsym(RTLD_DEFAULT, "Py_DecodeLocale");
    void (*set_name)(const void *) = (void (*)(const void *))dlsym(RTLD_DEFAULT, "Py_SetProgramName");
    if (!is_init || !init || !run) { set_error(tr, "libpython is not loaded"); return -1; }
    if (!is_init()) {
        const char *program = getenv("LOADFUZZ_PYTHON");
        if (program && decode && set_name) {
            void *wide = decode(program, NULL); /* kept: Python holds on to it */
            if (wide) set_name(wide);
        }
        init(1); /* with the signal set-up of the python program: SIGPIPE and SIGXFSZ ignored */
        /* the script's folder first on sys.path, and sys.argv, as `python -c` has them */
        run("__import__('sys').path.insert(0, ''); __import__('sys').argv[:] = ['-c']");
    }
    return 0;
}

/* Run Python source in an interpreter this process embeds, started on first use (see
 * `start_python`). `in_main`: run it in __main__ (a step), else apart (a preload). */
static int run_python(const char *source, int in_main, struct trace *tr) {
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (start_python(tr) < 0) return -1;
    unsetenv("LOADFUZZ_PY_ERROR");
    unsetenv("LOADFUZZ_PY_SIGINT");
    int failed = (in_main ? run(source) : run_apart(run, source)) != 0;
    char after[sizeof PY_AFTER + 8];
    snprintf(after, sizeof after, PY_AFTER, failed);
    if (run_apart(run, after) != 0 && !failed) {
        set_error(tr, "the step's output could not be flushed");
        return -1;
    }
    if (getenv("LOADFUZZ_PY_SIGINT")) { /* as python ends on it: finalized, then by SIGINT */
        finalize_python();
        signal(SIGINT, SIG_DFL);
        kill(getpid(), SIGINT);
    }
    const char *err = getenv("LOADFUZZ_PY_ERROR");
    if (err) { set_error_hex(tr, err); return -1; }
    if (failed) { set_error(tr, "the step's Python exception could not be reported"); return -1; }
    return 0;
}

/* The file the loader reports into when the harness runs with LD_DEBUG_OUTPUT
 * set (an observed run): the descriptor ld.so opened on "<prefix>.<pid>" at
 * start-up, which a trial must keep open, or -1. */
static int loader_report_fd(void) {
    const char *prefix = getenv("LD_DEBUG_OUTPUT");
    DIR *d = prefix ? opendir("/proc/self/fd") : NULL;
    int found = -1;
    size_t len = prefix ? strlen(prefix) : 0;
    for (struct dirent *e; d && found < 0 && (e = readdir(d));) {
        char link[PATH_MAX + 1] = "";
        ssize_t n = readlinkat(dirfd(d), e->d_name, link, PATH_MAX);
        if (n > (ssize_t)len && !strncmp(link, prefix, len) && link[len] == '.') found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* HOME and TMPDIR: the trial's own working folder, as its cold run has them, so that what
 * one trial leaves there (a marker, a cache) never reaches the next one a server forks. An
 * interpreter the server started read them at its start: it is told too. */
static const char PY_OWN_HOME[] =
    "import os, sys\n"
    "os.environ['HOME'] = os.environ['TMPDIR'] = os.getcwd()\n"
    "if 'tempfile' in sys.modules: sys.modules['tempfile'].tempdir = None\n";

static void own_home(const char *workdir) {
    setenv("HOME", workdir, 1);
    setenv("TMPDIR", workdir, 1);
    int (*is_init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (is_init && run && is_init()) run_apart(run, PY_OWN_HOME);
}

/* What every trial starts from: stdin from /dev/null, stdout and stderr on the
 * capture pipe, no other descriptor (a row server keeps its pipes, as 3 and 4;
 * an observed cold trial the loader's report file), its limits and its own
 * working folder. */
static void enter_trial(const struct trial *t, struct trace *tr, int out_w, int ctl, int status) {
    trial_pid = getpid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    int keep = ctl >= 0;
    if (keep) { ctl = fcntl(ctl, F_DUPFD, 10); status = fcntl(status, F_DUPFD, 10); }
    if (null < 0 || dup2(null, 0) < 0 || dup2(out_w, 1) < 0 || dup2(out_w, 2) < 0) _exit(112);
    if (keep && (ctl < 0 || status < 0 || dup2(ctl, 3) < 0 || dup2(status, 4) < 0
                 || fcntl(3, F_SETFD, FD_CLOEXEC) < 0 || fcntl(4, F_SETFD, FD_CLOEXEC) < 0))
        _exit(112);
    int report = keep ? -1 : loader_report_fd();
    if (report >= 3) {
        close_range(3, (unsigned)report - 1, 0);
        close_range((unsigned)report + 1, ~0U, 0);
    } else
        close_range(keep ? 5 : 3, ~0U, 0); /* the server's pipes and everything else it holds */
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (t->mem_mb > 0) {
        struct rlimit as = {(rlim_t)t->mem_mb << 20, (rlim_t)t->mem_mb << 20};
        setrlimit(RLIMIT_AS, &as);
    }
    if (chdir(t->workdir) < 0) { set_error(tr, "cannot enter the working folder"); _exit(113); }
    own_home(t->workdir);
}

/* Take the steps, keeping the trace; 0 once all are done, -1 when one failed. */
static int take_steps(const struct trial *t, struct trace *tr) {
    for (int i = 0; i < t->nsteps; i++) {
        const struct step *s = &t->steps[i];
        own_trace(tr)->stamp_ns = now_ns();
        own_trace(tr)->started = i + 1;
        if (s->mode == 'y') {
            if (run_python(s->path, 1, tr) < 0) return -1;
        } else if (!dlopen(s->path, RTLD_NOW | (s->mode == 'g' ? RTLD_GLOBAL : RTLD_LOCAL))) {
            set_error(tr, dlerror());
            return -1;
        }
        own_trace(tr)->done = i + 1;
    }
    own_trace(tr)->stamp_ns = now_ns();
    return 0;
}

static void run_child(const struct trial *t, struct trace *tr, int out_w) {
    enter_trial(t, tr, out_w, -1, -1);
    if (take_steps(t, tr) < 0) _exit(0);
    fflush(NULL);
    /* as a real process ends: Python finalized, then atexit handlers and destructors */
    if (t->at_exit) exit(finalize_python());
    _exit(0);
}

/* ---- the server: supervise one child ----------------------------------- */

static void keep_output(struct capture *c, const char *buf, size_t n) {
    c->total += n;
    size_t h = HEAD_CAP - c->head_len < n ? HEAD_CAP - c->head_len : n;
    memcpy(c->head + c->head_len, buf, h);
    c->head_len += h; buf += h; n -= h;
    if (n >= TAIL_CAP) { memcpy(c->tail, buf + n - TAIL_CAP, TAIL_CAP); c->tail_len = TAIL_CAP; return; }
    if (c->tail_len + n > TAIL_CAP) {
        size_t drop = c->tail_len + n - TAIL_CAP;
        memmove(c->tail, c->tail + drop, c->tail_len - drop);
        c->tail_len -= drop;
    }
    memcpy(c->tail + c->tail_len, buf, n);
    c->tail_len += n;
}

/* Drain what is readable now; returns 0 once every writer has closed the pipe. */
static int drain(int fd, struct capture *c) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0) { keep_output(c, buf, (size_t)n); continue; }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && errno == EAGAIN;
    }
}

/* Kill every process left under this (subreaper) server; returns how many.
 * Killing one re-parents its own children here, so repeat until none is left. */
static int kill_leftovers(void) {
    int killed = 0;
    for (int round = 0; round < 1000; round++) {
        int found = 0;
        DIR *tasks = opendir("/proc/self/task");
        struct dirent *task;
        while (tasks && (task = readdir(tasks))) {
            char name[300];
            if (task->d_name[0] == '.') continue;
            snprintf(name, sizeof name, "/proc/self/task/%s/children", task->d_name);
            FILE *f = fopen(name, "r");
            int pid;
            while (f && fscanf(f, "%d", &pid) == 1) { kill(pid, SIGKILL); found++; }
            if (f) fclose(f);
        }
        if (tasks) closedir(tasks);
        if (!found) break;
        killed += found;
        for (int i = 0; i < found; i++) waitpid(-1, NULL, 0);
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    return killed;
}

enum watched { ENDED, TIMED_OUT, ROW_UP };

/* Watch a child until it ends, its current step runs out of time, or (for a
 * row server) its prefix is ready and it has closed its output (a refused
 * prefix ends its process instead). A hang-up on
 * the control pipe means the parent is gone: so are the child and the server. */
static enum watched watch(pid_t pid, int pidfd, int out, struct capture *cap,
                          const struct trace *tr, long timeout_ms, int ctl) {
    int open_out = 1;
    for (;;) {
        if (!open_out && tr->row == ROW_READY) return ROW_UP;
        int64_t deadline = tr->stamp_ns + (int64_t)timeout_ms * 1000000;
        int64_t left_ms = (deadline - now_ns()) / 1000000 + 1;
        if (left_ms <= 0) { kill(pid, SIGKILL); return TIMED_OUT; }
        struct pollfd fds[3] = {{pidfd, POLLIN, 0}, {ctl, 0, 0}, {out, POLLIN, 0}};
        int n = poll(fds, open_out ? 3 : 2, (int)(left_ms > 100 ? 100 : left_ms));
        if (n < 0 && errno != EINTR) die("poll");
        if (fds[1].revents & (POLLHUP | POLLERR)) {
            kill(pid, SIGKILL);
            kill_leftovers();
            _exit(0);
        }
        if (open_out && fds[2].revents) open_out = drain(out, cap);
        if (fds[0].revents) return ENDED;
    }
}

/* Fork a child that enters the trial with the capture pipe as its output. */
static pid_t start_child(int out[2], int *pidfd, struct capture *cap, struct trace *tr) {
    if (pipe2(out, O_CLOEXEC) < 0) die("pipe");
    memset((void *)tr, 0, sizeof *tr);
    memset(cap, 0, sizeof *cap);
    tr->stamp_ns = now_ns();
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid > 0) {
        close(out[1]);
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        *pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    }
    return pid;
}

/* Reap the child, kill what it left, and read its output to the end. */
static int finish_child(pid_t pid, int pidfd, int out, struct capture *cap, struct rusage *ru,
                        int *leftovers) {
    int wstatus = 0;
    memset(ru, 0, sizeof *ru);
    while (wait4(pid, &wstatus, 0, ru) < 0 && errno == EINTR) {}
    close(pidfd);
    *leftovers = kill_leftovers();
    fcntl(out, F_SETFL, 0); /* every writer is dead now: read to the end */
    while (drain(out, cap)) {}
    close(out);
    return wstatus;
}

static struct capture cap; /* large; one child is watched at a time */

static void serve_trial(const struct trial *t, struct trace *tr, int ctl, int status) {
    int out[2], pidfd = -1, leftovers = 0;
    int64_t began = now_ns();
    pid_t pid = start_child(out, &pidfd, &cap, tr);
    if (pid == 0) run_child(t, tr, out[1]);
    int timed_out = watch(pid, pidfd, out[0], &cap, tr, t->timeout_ms, ctl) == TIMED_OUT;
    struct rusage ru;
    int wstatus = finish_child(pid, pidfd, out[0], &cap, &ru, &leftovers);
    int64_t elapsed_us = (now_ns() - began) / 1000;
    char head[512];
    size_t elen = strnlen(tr->err, ERR_CAP);
    int hlen = snprintf(head, sizeof head, "RESULT %d %d %d %d %ld %lld %zu %zu %zu %zu %d\n",
                        wstatus, timed_out, tr->started, tr->done, ru.ru_maxrss,
                        (long long)elapsed_us, cap.total, cap.head_len, cap.tail_len, elen,
                        leftovers);
    write_all(status, head, (size_t)hlen);
    write_all(status, cap.head, cap.head_len);
    write_all(status, cap.tail, cap.tail_len);
    write_all(status, tr->err, elen);
}

/* ---- prefix sharing ------------------------------------------------------ */

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int same_file(int fd, const struct stat *was) {
    struct stat now;
    return fstat(fd, &now) == 0 && now.st_dev == was->st_dev && now.st_ino == was->st_ino;
}

/* Why a process that took its prefix would not fork into a copy of itself, or NULL.
 * fork copies one thread, no child, no timer and no pending signal; each trial
 * enters a fresh working folder; the row server needs its pipes; a descriptor the
 * prefix opened would be shared by every trial (one file offset for all) where each
 * cold run has its own, so `fds`, the count before the prefix, must not grow. */
static const char *unsharable(const struct trial *t, const struct stat pipes[2], int fds) {
    char cwd[PATH_MAX], children[64];
    if (count_entries("/proc/self/task") != 1) return "the prefix started a thread";
    snprintf(children, sizeof children, "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(children, "r");
    int child = f ? fgetc(f) : EOF;
    if (f) fclose(f);
    if (child != EOF) return "the prefix started a process";
    struct itimerval timer;
    for (int which = ITIMER_REAL; which <= ITIMER_PROF; which++)
        if (getitimer(which, &timer) == 0 && (timer.it_value.tv_sec || timer.it_value.tv_usec))
            return "the prefix armed a timer";
    if (count_entries("/proc/self/timers") > 0) return "the prefix armed a timer";
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && !sigisemptyset(&pending)) return "a signal is pending";
    if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, t->workdir) || count_entries(".") != 0)
        return "the prefix changed its working folder";
    if (!same_file(3, &pipes[0]) || !same_file(4, &pipes[1]))
        return "the prefix touched the server's pipes";
    if (count_entries("/proc/self/fd") != fds) return "the prefix left a file descriptor open";
    return NULL;
}

static void serve(int ctl, int status, int in_row);

/* The row server: take the prefix, check that a fork would copy it whole, then
 * serve the row's trials as any server does. Its stdio buffers keep what the
 * prefix printed but did not flush: every trial inherits them, as in a cold run. */
static void run_row_server(const struct trial *t, struct trace *tr, int out_w, int ctl, int status) {
    struct stat pipes[2];
    if (fstat(ctl, &pipes[0]) < 0 || fstat(status, &pipes[1]) < 0) die("fstat");
    enter_trial(t, tr, out_w, ctl, status);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int fds = count_entries("/proc/self/fd");
    unsigned handlers = fork_handlers;
    int taken = take_steps(t, tr);
    if (getpid() != trial_pid) _exit(0); /* a process the prefix forked never serves */
    if (taken < 0) { tr->row = ROW_REFUSED; _exit(0); }
    const char *why = fork_handlers != handlers
        ? "the prefix registered a fork handler (pthread_atfork), which every trial would run"
        : unsharable(t, pipes, fds);
    if (why) { set_error(tr, why); tr->row = ROW_REFUSED; _exit(0); }
    tr->row = ROW_READY;
    int null = open("/dev/null", O_WRONLY); /* the capture pipe closes: the server reads on */
    if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(112);
    close(null);
    serve(3, 4, 1);
    _exit(0);
}

static void serve_prefix(const struct trial *t, struct trace *tr, int ctl, int status) {
    int out[2], pidfd = -1, leftovers = 0;
    pid_t pid = start_child(out, &pidfd, &cap, tr);
    if (pid == 0) run_row_server(t, tr, out[1], ctl, status);
    enum watched seen = watch(pid, pidfd, out[0], &cap, tr, t->timeout_ms, ctl);
    int row = seen == ROW_UP;
    if (row) { /* the row server answers the row's trials; wait for its END */
        char head[256];
        int hlen = snprintf(head, sizeof head, "ROW %d %zu %zu %zu\n", (int)pid, cap.total,
                            cap.head_len, cap.tail_len);
        write_all(status, head, (size_t)hlen);
        write_all(status, cap.head, cap.head_len);
        write_all(status, cap.tail, cap.tail_len);
        struct pollfd fds[2] = {{pidfd, POLLIN, 0}, {ctl, 0, 0}};
        while (!(fds[0].revents & POLLIN)) {
            if (poll(fds, 2, -1) < 0 && errno != EINTR) die("poll");
            if (fds[1].revents & (POLLHUP | POLLERR)) { kill(pid, SIGKILL); kill_leftovers(); _exit(0); }
        }
    } else if (seen != ENDED) {
        kill(pid, SIGKILL);
    }
    struct rusage ru;
    int wstatus = finish_child(pid, pidfd, out[0], &cap, &ru, &leftovers);
    if (row) {
        if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) _exit(4); /* the parent sees it die */
        return;
    }
    char why[ERR_CAP + 64];
    if (seen == TIMED_OUT) snprintf(why, sizeof why, "step %d of the prefix timed out", tr->started);
    else if (tr->row == ROW_REFUSED && tr->done == t->nsteps) snprintf(why, sizeof why, "%s", tr->err);
    else if (tr->started > tr->done && tr->err[0])
        snprintf(why, sizeof why, "step %d of the prefix failed: %.*s", tr->started, ERR_CAP, tr->err);
    else snprintf(why, sizeof why, "step %d of the prefix ended its process: %s %d", tr->started,
                  WIFEXITED(wstatus) ? "exit" : "signal",
                  WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus));
    char head[64];
    int hlen = snprintf(head, sizeof head, "NO-ROW %zu\n", strlen(why));
    write_all(status, head, (size_t)hlen);
    write_all(status, why, strlen(why));
}

/* Serve messages until the parent closes the pipe (or, in a row server, says END). */
static void serve(int ctl, int status, int in_row) {
    struct trace *tr = mmap(NULL, sizeof *tr, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (tr == MAP_FAILED) die("mmap");
    struct trial t;
    memset(&t, 0, sizeof t);
    for (;;) {
        enum message got = read_message(ctl, &t);
        if (got == MSG_EOF || (got == MSG_END && in_row)) return;
        if (got == MSG_TRIAL) serve_trial(&t, tr, ctl, status);
        else if (got == MSG_PREFIX && !in_row) serve_prefix(&t, tr, ctl, status);
        else { fprintf(stderr, "harness: malformed or unexpected message\n"); _exit(2); }
        free_trial(&t);
    }
}

/* ---- start-up ------------------------------------------------------------ */

static void preload_error(int status, const char *why) {
    dprintf(status >= 0 ? status : 1, "PRELOAD-ERROR %zu\n%s", strlen(why), why);
    _exit(3);
}

/* Start the interpreter and run `source` in it, before any trial: what a trial's first
 * `y` step would do first. What it prints goes into `cap`, for READY; what it leaves in
 * stdio buffers stays there, so each trial flushes it as its own process would. */
static void preload_python(const char *source, int status) {
    static struct trace boot;
    int saved[2] = {dup(1), dup(2)}, started[2];
    FILE *out = tmpfile();
    /* Python makes sys.stdout and sys.stderr as it starts, and notes then what they are
     * on: a pipe, as in a trial (not seekable, a pipe's buffer size). What it prints while
     * it starts (a broken .pth file: a few lines) fits the pipe; what the source prints,
     * which may be more, goes to a file. */
    if (!out || saved[0] < 0 || saved[1] < 0 || pipe2(started, O_NONBLOCK) < 0
        || dup2(started[1], 1) < 0 || dup2(started[1], 2) < 0)
        die("tmpfile");
    close(started[1]);
    int failed = start_python(&boot) < 0;
    if (dup2(fileno(out), 1) < 0 || dup2(fileno(out), 2) < 0) die("dup2");
    char buf[65536];
    for (ssize_t n; (n = read(started[0], buf, sizeof buf)) > 0;) keep_output(&cap, buf, (size_t)n);
    close(started[0]);
    failed = failed || run_python(source, 0, &boot) < 0;
    if (dup2(saved[0], 1) < 0 || dup2(saved[1], 2) < 0) die("dup2");
    close(saved[0]);
    close(saved[1]);
    rewind(out);
    for (size_t n; (n = fread(buf, 1, sizeof buf, out)) > 0;) keep_output(&cap, buf, n);
    fclose(out);
    char children[64];
    snprintf(children, sizeof children, "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(children, "r");
    int child = f ? fgetc(f) : EOF;
    if (f) fclose(f);
    if (failed) preload_error(status, boot.err);
    if (count_entries("/proc/self/task") != 1) preload_error(status, "the Python preload started a thread");
    if (child != EOF) preload_error(status, "the Python preload started a process");
}

/* Back the server's heap with huge pages, once its preloads are done. A fork
 * copies a page table entry (and counts a reference) per 4 KiB page that is
 * written; libtorch's constructors leave ~50 MiB of heap, so every trial's
 * fork and exit cost ~5 ms, and ~0.7 ms once that heap is in 2 MiB pages.
 * Only where the memory sits changes, not what it holds: a trial sees the same
 * bytes at the same addresses. Best effort: an older kernel says EINVAL. */
static void huge_heap(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[PATH_MAX + 128];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long start, end, inode;
        char perms[5];
        int name = 0;
        if (sscanf(line, "%lx-%lx %4s %*x %*s %lu %n", &start, &end, perms, &inode, &name) < 4)
            continue;
        int anonymous = inode == 0 && (line[name] == '\n' || !strncmp(line + name, "[heap]", 6));
        if (anonymous && !strcmp(perms, "rw-p") && end - start >= (2UL << 20))
            madvise((void *)start, end - start, MADV_COLLAPSE);
    }
    if (maps) fclose(maps);
}

static void usage(void) {
    fprintf(stderr, "usage: harness --ctl FD --status FD [--parent PID] "
                    "[--preload PATH]... [--preload-global PATH]... [--preload-python SOURCE]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int ctl = -1, status = -1;
    long parent = 0;
    int preloaded = 0, fds = count_entries("/proc/self/fd"); /* before any preload */
    /* No PR_SET_PDEATHSIG here: it fires when the parent *thread* exits, and
     * loadfuzz starts servers from worker threads. The parent's death shows
     * instead as a hang-up on the control pipe, watched during every trial. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* SIGPIPE stays (or becomes) the default, as every trial must inherit it: a
     * server writing to a parent that is gone ends, as it should, by SIGPIPE. */
    signal(SIGPIPE, SIG_DFL);
    /* SIGCHLD ignored (inherited from a daemon, a CI runner, an embedding program) would
     * have the kernel reap every trial at once: its wait status, the verdict, lost. */
    signal(SIGCHLD, SIG_DFL);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        const char *opt = argv[i], *val = argv[++i];
        if (!strcmp(opt, "--ctl")) ctl = atoi(val);
        else if (!strcmp(opt, "--status")) status = atoi(val);
        else if (!strcmp(opt, "--parent")) parent = atol(val);
        else if (!strcmp(opt, "--preload") || !strcmp(opt, "--preload-global")) {
            int flags = RTLD_NOW | (!strcmp(opt, "--preload-global") ? RTLD_GLOBAL : RTLD_LOCAL);
            unsigned handlers = fork_handlers;
            if (!dlopen(val, flags)) preload_error(status, dlerror());
            if (fork_handlers != handlers) /* (a Python preload's are accepted: protocol.md) */
                preload_error(status, "a preload registered a fork handler (pthread_atfork): "
                                      "every trial would run it");
            preloaded = 1;
        } else if (!strcmp(opt, "--preload-python")) {
            preload_python(val, status);
            preloaded = 1;
        } else usage();
    }
    if (ctl < 0 || status < 0) usage();
    /* A descriptor a preload opened would be shared by every trial (one file offset for
     * all), where each cold run opens its own: such a server does not serve. */
    if (preloaded && count_entries("/proc/self/fd") != fds)
        preload_error(status, "a preload left a file descriptor open");
    if (preloaded) huge_heap();
    if (parent && getppid() != (pid_t)parent) return 0; /* the parent died before we started */
    char head[128];
    int hlen = snprintf(head, sizeof head, "READY %d %d %zu %zu %zu\n", PROTOCOL_VERSION,
                        (int)getpid(), cap.total, cap.head_len, cap.tail_len);
    write_all(status, head, (size_t)hlen);
    write_all(status, cap.head, cap.head_len);
    write_all(status, cap.tail, cap.tail_len);
    serve(ctl, status, 0);
    _exit(0);
}
