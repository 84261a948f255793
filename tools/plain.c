/* plain: the plain way to try load orders, for the bench (tools/bench.py). Not loadfuzz.
 *
 * One fresh process per trial (fork + exec of this program), a pool of -j of them at once,
 * nothing preloaded but what -p names, no protocol: what a user would write instead.
 *
 *   plain [-j JOBS] [-t TIMEOUT_S] [-b BUDGET_S] [-p LIB]... < trials
 *       one trial a line, its steps separated by tabs; prints "INDEX<TAB>VERDICT" per
 *       finished trial, in input order, then "# N of M trials in S s" on stderr.
 *       With -b, no trial starts after BUDGET_S seconds (the ones running finish).
 *   plain --trial [-t TIMEOUT_S] [-p LIB]... STEP...
 *       one trial in this process (what the pool execs).
 *
 * A step is g:PATH (dlopen RTLD_NOW|RTLD_GLOBAL), l:PATH (RTLD_NOW|RTLD_LOCAL) or y:SOURCE
 * (Python source, run in an interpreter started on first use; libpython must be among the
 * -p libraries). -p LIB is dlopen'ed RTLD_NOW|RTLD_GLOBAL before the steps (libpython, as a
 * Python process has it). A trial ends with _exit(0) after its last step and writes no core
 * file (RLIMIT_CORE 0), as loadfuzz's do.
 *
 * VERDICT: clean | signal N | load-error (a dlopen returned NULL) | python-error (a y: step
 * raised) | exit N (a library ended the process) | timeout (TIMEOUT_S per trial).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { LOAD_ERROR = 120, PYTHON_ERROR = 121, PRELOAD_ERROR = 122 };

static int python_step(const char *source) {
    int (*is_init)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    void (*init)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "Py_InitializeEx");
    int (*run)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (!is_init || !init || !run) return -1;
    if (!is_init()) init(0);
    return run(source);
}

static int trial(int argc, char **argv, int at) {
    unsigned timeout = 10;
    for (; at < argc; at++) {
        if (!strcmp(argv[at], "-t") && at + 1 < argc) timeout = (unsigned)atoi(argv[++at]);
        else if (!strcmp(argv[at], "-p") && at + 1 < argc) {
            if (!dlopen(argv[++at], RTLD_NOW | RTLD_GLOBAL)) _exit(PRELOAD_ERROR);
        } else break;
    }
    alarm(timeout);
    for (; at < argc; at++) {
        const char *step = argv[at];
        if (step[0] == 'y') {
            if (python_step(step + 2) != 0) _exit(PYTHON_ERROR);
        } else if (!dlopen(step + 2, RTLD_NOW | (step[0] == 'g' ? RTLD_GLOBAL : RTLD_LOCAL))) {
            _exit(LOAD_ERROR);
        }
    }
    _exit(0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static char *self;
static char **fixed; /* --trial and the options every trial gets */
static int nfixed;

/* Split a line into its tab-separated steps, after the fixed arguments. */
static pid_t start(char *line) {
    char *args[4096];
    int n = 0;
    args[n++] = self;
    for (int i = 0; i < nfixed; i++) args[n++] = fixed[i];
    for (char *save = NULL, *tok = strtok_r(line, "\t\n", &save); tok && n < 4094;
         tok = strtok_r(NULL, "\t\n", &save))
        args[n++] = tok;
    args[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
        execv(self, args);
        _exit(127);
    }
    return pid;
}

static const char *verdict(int status, char *buf) {
    if (WIFSIGNALED(status))
        return WTERMSIG(status) == SIGALRM ? "timeout" : (sprintf(buf, "signal %d", WTERMSIG(status)), buf);
    switch (WEXITSTATUS(status)) {
    case 0: return "clean";
    case LOAD_ERROR: return "load-error";
    case PYTHON_ERROR: return "python-error";
    case PRELOAD_ERROR: return "preload-error";
    default: return sprintf(buf, "exit %d", WEXITSTATUS(status)), buf;
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--trial")) return trial(argc, argv, 2);
    int jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double budget = 0;
    self = realpath("/proc/self/exe", NULL);
    fixed = calloc((size_t)argc + 1, sizeof *fixed);
    fixed[nfixed++] = "--trial";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-j") && i + 1 < argc) jobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) budget = atof(argv[++i]);
        else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "-p")) && i + 1 < argc) {
            fixed[nfixed++] = argv[i];
            fixed[nfixed++] = argv[++i];
        } else {
            fprintf(stderr, "usage: plain [-j JOBS] [-t TIMEOUT_S] [-b BUDGET_S] [-p LIB]... < trials\n");
            return 2;
        }
    }
    size_t cap = 1024, count = 0, len = 0;
    char **lines = malloc(cap * sizeof *lines), *line = NULL;
    while (getline(&line, &len, stdin) > 0) {
        if (count == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[count++] = line;
        line = NULL;
    }
    struct rlimit no_core = {0, 0}; /* as loadfuzz's trials: no core file to write */
    setrlimit(RLIMIT_CORE, &no_core);
    int *status = calloc(count + 1, sizeof *status);
    char *done = calloc(count + 1, 1);
    pid_t *pids = calloc((size_t)jobs, sizeof *pids);
    size_t *which = calloc((size_t)jobs, sizeof *which), next = 0, finished = 0;
    int running = 0;
    double began = now();
    for (;;) {
        while (running < jobs && next < count && !(budget > 0 && now() - began >= budget)) {
            int slot = 0;
            while (pids[slot]) slot++;
            pids[slot] = start(lines[next]);
            which[slot] = next++;
            running++;
        }
        if (!running) break;
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int slot = 0; slot < jobs; slot++) {
            if (pids[slot] != pid) continue;
            pids[slot] = 0;
            status[which[slot]] = st;
            done[which[slot]] = 1;
            running--;
            finished++;
        }
    }
    double elapsed = now() - began;
    char buf[32];
    for (size_t i = 0; i < count; i++)
        if (done[i]) printf("%zu\t%s\n", i, verdict(status[i], buf));
    fprintf(stderr, "# %zu of %zu trials in %.3f s\n", finished, count, elapsed);
    return 0;
}
