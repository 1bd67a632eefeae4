/*
 * A fork server for BLAST+ programs, loaded with LD_PRELOAD.
 *
 * Why: a BLAST+ process spends ~35 ms before main() (dynamic linking and the static initialisers of ~90
 * NCBI C++ Toolkit libraries), while regenerating the report of one query against its own few subjects
 * takes a few ms in main(). The engine runs hundreds of such small BLAST+ runs, so start-up decided the
 * cost of regeneration. This shim replaces main() with a loop: after the static initialisation has run
 * once, each request forks a child that calls the program's real main() with the request's arguments,
 * exactly as a freshly started process would (no thread exists yet, main() has never run in the parent).
 * The technique is the one AFL's fork server uses.
 *
 * Protocol, on two pipes whose descriptors are given as PARAMEDIC_FORKSERVER_FDS="<in>,<out>":
 *   request: uint32 length, then `length` bytes of NUL-terminated strings:
 *            working directory, stdout path ("" = inherit), stderr path ("" = inherit), the number N of
 *            environment assignments (decimal), N strings NAME=VALUE set in the child only, argv[0],
 *            argv[1]...
 *            (The assignments let one server run every kind of search of a job: the preliminary-list
 *            shim preloaded with the server reads its mode from the child's environment.)
 *   reply:   int32 exit status (the exit code, or 128 + signal number).
 * End of input ends the server; so does a hang-up while a request runs, after killing its child (the
 * engine was killed outright: nobody reads that search). Without PARAMEDIC_FORKSERVER_FDS the program
 * runs normally.
 *
 * Large allocations (16 MB and more) are marked for transparent huge pages (madvise MADV_HUGEPAGE, which
 * the kernel honours when its THP mode is "madvise" or "always"). Why: megablast's lookup table is a
 * 64 MB hash that every search allocates and touches all over, 16,000 page faults (a third of a small
 * fragment search's CPU); 2 MB pages make that about 40. The bytes are the same, so are the results.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*main_fn)(int, char **, char **);

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);

#define HUGE_PAGE ((uintptr_t)2 << 20)
#define HUGE_FROM ((size_t)16 << 20)

/* The whole 2 MB pages inside [p, p + size): glibc gives such blocks pages of their own (mmap). */
static void advise_huge(void *p, size_t size) {
    uintptr_t start = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t end = ((uintptr_t)p + size) & ~(HUGE_PAGE - 1);
    if (end > start) madvise((void *)start, end - start, MADV_HUGEPAGE);
}

void *malloc(size_t size) {
    void *p = __libc_malloc(size);
    if (p != NULL && size >= HUGE_FROM) advise_huge(p, size);
    return p;
}

void *calloc(size_t n, size_t size) {
    void *p = __libc_calloc(n, size);
    if (p != NULL && size != 0 && n >= HUGE_FROM / size) advise_huge(p, n * size);
    return p;
}
typedef int (*start_fn)(main_fn, int, char **, main_fn, void (*)(void), void (*)(void), void *);

extern char **environ;
static main_fn real_main;

static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return -1;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

static void redirect(const char *path, int target) {
    if (path[0] == '\0') return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(125);
    dup2(fd, target);
    close(fd);
}

/* Wait for the child running a request, watching the request pipe meanwhile: when the engine's end of it
 * closes (the process that asked was killed outright: SIGKILL, the OOM killer), the child is killed and
 * -1 returned. Before, such a child searched on for as long as its search took, for nobody. The engine
 * never writes while a request runs, so only a hang-up can wake the poll on `in_fd`. */
static int wait_child(pid_t pid, int in_fd, int *status) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0); /* Linux 5.3+; else look every 50 ms */
    int gone = 0;
    for (;;) {
        pid_t got = waitpid(pid, status, WNOHANG);
        if (got == pid || (got < 0 && errno != EINTR)) break;
        if (got < 0) continue;
        if (gone) {
            while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
            }
            break;
        }
        struct pollfd fds[2] = {{in_fd, 0, 0}, {pidfd, POLLIN, 0}};
        if (poll(fds, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? -1 : 50) > 0 && fds[0].revents & (POLLHUP | POLLERR)) {
            kill(pid, SIGKILL);
            gone = 1;
        }
    }
    if (pidfd >= 0) close(pidfd);
    return gone ? -1 : 0;
}

static int serve(int in_fd, int out_fd) {
    for (;;) {
        uint32_t length;
        /* end of input: done, at once (BLAST+'s static destructors cost the caller's exit ms) */
        if (read_full(in_fd, &length, sizeof length) != 0) _exit(0);
        if (length == 0 || length > (1u << 20)) return 2;
        char *buf = malloc(length + 1);
        if (buf == NULL || read_full(in_fd, buf, length) != 0) return 2;
        buf[length] = '\0';
        size_t count = 0;
        for (uint32_t i = 0; i < length; i++) count += buf[i] == '\0';
        if (count < 5) return 2;
        char **fields = calloc(count + 1, sizeof *fields);
        if (fields == NULL) return 2;
        char *p = buf;
        for (size_t i = 0; i < count; i++) {
            fields[i] = p;
            p += strlen(p) + 1;
        }
        char *end;
        unsigned long assignments = strtoul(fields[3], &end, 10);
        if (*end != '\0' || assignments > count - 5) return 2;
        size_t first_arg = 4 + assignments;
        pid_t pid = fork();
        if (pid == 0) {
            close(in_fd);
            close(out_fd);
            for (size_t i = 4; i < first_arg; i++)
                if (strchr(fields[i], '=') == NULL || putenv(fields[i]) != 0) _exit(125);
            if (chdir(fields[0]) != 0) _exit(126);
            redirect(fields[1], STDOUT_FILENO);
            redirect(fields[2], STDERR_FILENO);
            exit(real_main((int)(count - first_arg), fields + first_arg, environ));
        }
        int32_t code = 127;
        if (pid > 0) {
            int status;
            if (wait_child(pid, in_fd, &status) != 0) _exit(0); /* the engine is gone: so is its search */
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        free(fields);
        free(buf);
        if (write_full(out_fd, &code, sizeof code) != 0) return 2;
    }
}

static int wrapped_main(int argc, char **argv, char **envp) {
    const char *fds = getenv("PARAMEDIC_FORKSERVER_FDS");
    int in_fd, out_fd;
    if (fds == NULL || sscanf(fds, "%d,%d", &in_fd, &out_fd) != 2) return real_main(argc, argv, envp);
    unsetenv("PARAMEDIC_FORKSERVER_FDS");
    unsetenv("LD_PRELOAD");
    return serve(in_fd, out_fd);
}

int __libc_start_main(main_fn main, int argc, char **argv, main_fn init, void (*fini)(void),
                      void (*rtld_fini)(void), void *stack_end) {
    start_fn real_start = (start_fn)dlsym(RTLD_NEXT, "__libc_start_main");
    real_main = main;
    return real_start(wrapped_main, argc, argv, init, fini, rtld_fini, stack_end);
}
