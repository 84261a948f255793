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
 *         at_exit 1: end with exit(), running atexit handlers and destructors;
 *         at_exit 0: end with _exit() once the last step is done (much faster
 *         when libtorch is loaded: its destructors take ~100 ms)
 *       then per step:  <g|l|p> <path_len>\n<path bytes>
 *         g = dlopen RTLD_NOW|RTLD_GLOBAL, l = RTLD_NOW|RTLD_LOCAL,
 *         p = import the Python extension module at path (embedded interpreter)
 *   server -> parent (--status FD):
 *       READY <pid>\n                                once, after preloading
 *       PRELOAD-ERROR <len>\n<dlerror bytes>          instead, if a preload failed
 *       RESULT <wait_status> <timed_out> <started> <done> <maxrss_kb> <elapsed_us>
 *              <out_total> <head_len> <tail_len> <err_len> <leftovers>\n
 *              <head bytes><tail bytes><err bytes>   after every trial
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
 */
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_STEPS 256
#define HEAD_CAP (16 * 1024)
#define TAIL_CAP (48 * 1024)
#define ERR_CAP 2048

struct trace { /* written by the child, read by the server */
    volatile int started, done;
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

static void die(const char *what) { perror(what); exit(111); }

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

/* 1 = a trial was read, 0 = the parent closed the pipe, -1 = a malformed message */
static int read_trial(int fd, struct trial *t) {
    char line[256];
    size_t wlen;
    if (read_line(fd, line, sizeof line) < 0) return 0;
    if (sscanf(line, "TRIAL %ld %ld %d %d %zu", &t->timeout_ms, &t->mem_mb, &t->at_exit,
               &t->nsteps, &wlen) != 5
        || t->nsteps < 0 || t->nsteps > MAX_STEPS) return -1;
    int want = t->nsteps;
    t->nsteps = 0;
    if (!(t->workdir = read_blob(fd, wlen))) return -1;
    for (int i = 0; i < want; i++) {
        size_t plen;
        char mode;
        if (read_line(fd, line, sizeof line) < 0 || sscanf(line, "%c %zu", &mode, &plen) != 2
            || !strchr("glp", mode)) return -1;
        t->steps[i].mode = mode;
        if (!(t->steps[i].path = read_blob(fd, plen))) return -1;
        t->nsteps = i + 1;
    }
    return 1;
}

static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) exit(0); /* the parent is gone: nothing left to serve */
        buf += n; len -= (size_t)n;
    }
}

/* ---- the child: perform the steps -------------------------------------- */

static void set_error(struct trace *tr, const char *msg) {
    snprintf(tr->err, sizeof tr->err, "%s", msg ? msg : "unknown error");
}

/* Import the extension module at `path` in an interpreter this process embeds.
 * libpython must already be loaded RTLD_GLOBAL (the parent preloads it). */
static int import_module(const char *path, struct trace *tr) {
    int (*is_init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    void (*init)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "Py_InitializeEx");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!is_init || !init || !run) { set_error(tr, "libpython is not loaded"); return -1; }
    if (!is_init()) init(0);
    /* The path goes in as hex, so no byte of it can break the Python source. */
    size_t len = strlen(path);
    char *code = malloc(2 * len + 1024);
    if (!code) { set_error(tr, "out of memory"); return -1; }
    int at = sprintf(code, "import importlib.util as u, os, sys, traceback\n"
                           "p = bytes.fromhex('");
    for (size_t i = 0; i < len; i++) at += sprintf(code + at, "%02x", (unsigned char)path[i]);
    sprintf(code + at, "').decode('utf-8', 'surrogateescape')\n"
        "try:\n"
        "    s = u.spec_from_file_location(os.path.basename(p).split('.')[0], p)\n"
        "    m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
        "except BaseException as e:\n"
        "    traceback.print_exc()\n"
        "    os.environ['LOADFUZZ_PY_ERROR'] = f'{type(e).__name__}: {e}'\n");
    run(code);
    free(code);
    const char *err = getenv("LOADFUZZ_PY_ERROR");
    if (err) { set_error(tr, err); return -1; }
    return 0;
}

static void run_child(const struct trial *t, struct trace *tr, int out_w) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || dup2(null, 0) < 0 || dup2(out_w, 1) < 0 || dup2(out_w, 2) < 0) _exit(112);
    close_range(3, ~0U, 0); /* the server's pipes and everything else it holds */
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (t->mem_mb > 0) {
        struct rlimit as = {(rlim_t)t->mem_mb << 20, (rlim_t)t->mem_mb << 20};
        setrlimit(RLIMIT_AS, &as);
    }
    if (chdir(t->workdir) < 0) { set_error(tr, "cannot enter the working folder"); _exit(113); }
    for (int i = 0; i < t->nsteps; i++) {
        const struct step *s = &t->steps[i];
        tr->stamp_ns = now_ns();
        tr->started = i + 1;
        if (s->mode == 'p') {
            if (import_module(s->path, tr) < 0) _exit(0);
        } else if (!dlopen(s->path, RTLD_NOW | (s->mode == 'g' ? RTLD_GLOBAL : RTLD_LOCAL))) {
            set_error(tr, dlerror());
            _exit(0);
        }
        tr->done = i + 1;
    }
    tr->stamp_ns = now_ns();
    fflush(NULL);
    if (t->at_exit) exit(0); /* atexit handlers and destructors run, as in a real process */
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

static void serve_trial(const struct trial *t, struct trace *tr, int ctl, int status) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) < 0) die("pipe");
    memset((void *)tr, 0, sizeof *tr);
    tr->stamp_ns = now_ns();
    int64_t began = now_ns();
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) run_child(t, tr, out[1]);
    close(out[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    static struct capture cap; /* large; one trial at a time */
    memset(&cap, 0, sizeof cap);
    int timed_out = 0, open_out = 1;
    for (;;) {
        int64_t deadline = tr->stamp_ns + (int64_t)t->timeout_ms * 1000000;
        int64_t left_ms = (deadline - now_ns()) / 1000000 + 1;
        if (left_ms <= 0) { timed_out = 1; kill(pid, SIGKILL); break; }
        struct pollfd fds[3] = {{pidfd, POLLIN, 0}, {ctl, 0, 0}, {out[0], POLLIN, 0}};
        int n = poll(fds, open_out ? 3 : 2, (int)(left_ms > 100 ? 100 : left_ms));
        if (n < 0 && errno != EINTR) die("poll");
        if (fds[1].revents & (POLLHUP | POLLERR)) { /* the parent is gone: so is the trial */
            kill(pid, SIGKILL);
            kill_leftovers();
            exit(0);
        }
        if (open_out && fds[2].revents) open_out = drain(out[0], &cap);
        if (fds[0].revents) break;
    }
    int wstatus = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &wstatus, 0, &ru) < 0 && errno == EINTR) {}
    int64_t elapsed_us = (now_ns() - began) / 1000;
    close(pidfd);
    int leftovers = kill_leftovers();
    fcntl(out[0], F_SETFL, 0); /* every writer is dead now: read to the end */
    while (drain(out[0], &cap)) {}
    close(out[0]);
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

/* ---- start-up ------------------------------------------------------------ */

static void usage(void) {
    fprintf(stderr, "usage: harness --ctl FD --status FD [--parent PID] "
                    "[--preload PATH]... [--preload-global PATH]...\n");
    exit(2);
}

int main(int argc, char **argv) {
    int ctl = -1, status = -1;
    long parent = 0;
    /* No PR_SET_PDEATHSIG here: it fires when the parent *thread* exits, and
     * loadfuzz starts servers from worker threads. The parent's death shows
     * instead as a hang-up on the control pipe, watched during every trial. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        const char *opt = argv[i], *val = argv[++i];
        if (!strcmp(opt, "--ctl")) ctl = atoi(val);
        else if (!strcmp(opt, "--status")) status = atoi(val);
        else if (!strcmp(opt, "--parent")) parent = atol(val);
        else if (!strcmp(opt, "--preload") || !strcmp(opt, "--preload-global")) {
            int flags = RTLD_NOW | (opt[9] == '-' ? RTLD_GLOBAL : RTLD_LOCAL);
            if (!dlopen(val, flags)) {
                const char *e = dlerror();
                dprintf(status >= 0 ? status : 1, "PRELOAD-ERROR %zu\n%s", strlen(e), e);
                return 3;
            }
        } else usage();
    }
    if (ctl < 0 || status < 0) usage();
    if (parent && getppid() != (pid_t)parent) return 0; /* the parent died before we started */
    struct trace *tr = mmap(NULL, sizeof *tr, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (tr == MAP_FAILED) die("mmap");
    dprintf(status, "READY %d\n", (int)getpid());
    struct trial t;
    memset(&t, 0, sizeof t);
    for (;;) {
        int got = read_trial(ctl, &t);
        if (got == 0) return 0;
        if (got < 0) { fprintf(stderr, "harness: malformed trial message\n"); return 2; }
        serve_trial(&t, tr, ctl, status);
        free_trial(&t);
    }
}
