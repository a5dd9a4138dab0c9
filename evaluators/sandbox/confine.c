/* The launcher of compiled programs and of their compiler, in C: what confine.py does as a program
 * (see its docstring; the same steps, order, report and exit codes), without an interpreter's
 * start-up, which cost every AtCoder case about 20-40 ms. Built by compiled_launcher.py; confine.py
 * stays the launcher of Python candidates and the one used where no C compiler is found.
 *
 *   confine STATUS_FD UID GID CHDIR LISTENER SECCOMP [NAME SOFT HARD]... -- PROGRAM [ARGS...]
 *
 * STATUS_FD: the host's channel (a socket); UID and GID: the run's ids, "-" to keep ours; CHDIR: the
 * working directory, "" for none; LISTENER: 1 to ask the kernel for a seccomp listener; SECCOMP: the
 * filter (raw BPF, base64); NAME SOFT HARD: resource limits, NAME as Python's resource module spells
 * it (RLIMIT_CPU), "inf" for no limit.
 *
 * 1. drops to UID/GID when root (setgroups, setgid, setuid), then checks every id and that no
 *    capability is left; sets no_new_privs unless bubblewrap did;
 * 2. sets the limits (never above a hard limit already there), umask 077 and CHDIR;
 * 3. installs the filter, with a listener when asked;
 * 4. reports {"ok": true, "cpu_s": ...} on STATUS_FD with the listener passed along (SCM_RIGHTS),
 *    closes every descriptor above stderr, restores SIGPIPE and SIGXFSZ, and executes PROGRAM
 *    (exit 127, the reason on stderr, when it cannot). On any failure before the report it
 *    reports {"ok": false, "why": ...} and exits with 121: no program code has run. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define EXIT_NOT_CONFINED 121

static int status_fd = -1;

static int send_line(const char *line, int fd) {
    struct iovec iov = {(void *)line, strlen(line)};
    struct msghdr msg;
    char control[CMSG_SPACE(sizeof(int))];
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd >= 0) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    while (iov.iov_len > 0) {
        ssize_t n = sendmsg(status_fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        iov.iov_base = (char *)iov.iov_base + n;
        iov.iov_len -= (size_t)n;
        msg.msg_control = NULL; /* the descriptor went with the first part */
        msg.msg_controllen = 0;
    }
    return 0;
}

static void not_confined(const char *fmt, ...) {
    char why[512], line[1200];
    size_t j = 0;
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof why, fmt, args);
    va_end(args);
    j += (size_t)snprintf(line, sizeof line, "{\"ok\": false, \"why\": \"");
    for (const char *p = why; *p && j < sizeof line - 8; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\') {
            line[j++] = '\\';
            line[j++] = (char)ch;
        } else if (ch >= 0x20 && ch < 0x7f) {
            line[j++] = (char)ch;
        } else {
            line[j++] = '?';
        }
    }
    snprintf(line + j, sizeof line - j, "\"}\n");
    if (status_fd >= 0) send_line(line, -1);
    _exit(EXIT_NOT_CONFINED);
}

static const struct {
    const char *name;
    int resource;
} LIMITS[] = {
    {"RLIMIT_CPU", RLIMIT_CPU},         {"RLIMIT_FSIZE", RLIMIT_FSIZE},     {"RLIMIT_DATA", RLIMIT_DATA},
    {"RLIMIT_STACK", RLIMIT_STACK},     {"RLIMIT_CORE", RLIMIT_CORE},       {"RLIMIT_RSS", RLIMIT_RSS},
    {"RLIMIT_NPROC", RLIMIT_NPROC},     {"RLIMIT_NOFILE", RLIMIT_NOFILE},   {"RLIMIT_MEMLOCK", RLIMIT_MEMLOCK},
    {"RLIMIT_AS", RLIMIT_AS},           {"RLIMIT_LOCKS", RLIMIT_LOCKS},     {"RLIMIT_SIGPENDING", RLIMIT_SIGPENDING},
    {"RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE}, {"RLIMIT_NICE", RLIMIT_NICE},     {"RLIMIT_RTPRIO", RLIMIT_RTPRIO},
    {"RLIMIT_RTTIME", RLIMIT_RTTIME},
};

static rlim_t limit_value(const char *text) {
    char *end;
    if (strcmp(text, "inf") == 0) return RLIM_INFINITY;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || !*text || text[0] == '-') not_confined("bad resource limit value %.40s", text);
    return (rlim_t)v;
}

static long number(const char *text, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || !*text || v < 0) not_confined("bad %s %.40s", what, text);
    return v;
}

static size_t base64_decode(const char *in, unsigned char *out) {
    static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    unsigned int bits = 0, count = 0;
    for (const char *p = in; *p && *p != '='; p++) {
        const char *at = strchr(ALPHABET, *p);
        if (!at || !*p) not_confined("the seccomp filter is not base64");
        bits = (bits << 6) | (unsigned int)(at - ALPHABET);
        count += 6;
        if (count >= 8) {
            count -= 8;
            out[n++] = (unsigned char)((bits >> count) & 0xff);
        }
    }
    return n;
}

static void drop_privileges(uid_t uid, gid_t gid) {
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) not_confined("could not become uid %u: %s", uid, strerror(errno));
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0 || ru != uid || eu != uid || su != uid || rg != gid ||
        eg != gid || sg != gid)
        not_confined("could not become uid %u", uid);
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    int checked = 0;
    if (!status) not_confined("cannot read /proc/self/status: %s", strerror(errno));
    while (fgets(line, sizeof line, status)) {
        if (strncmp(line, "CapEff:", 7) == 0) {
            checked = 1;
            if (strtoull(line + 7, NULL, 16) != 0) {
                fclose(status);
                not_confined("capabilities left after the uid drop: %s", line + 8);
            }
        }
    }
    fclose(status);
    if (!checked) not_confined("no CapEff in /proc/self/status");
}

int main(int argc, char **argv) {
    int sep = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            sep = i;
            break;
        }
    if (argc < 8) {
        fprintf(stderr, "usage: confine STATUS_FD UID GID CHDIR LISTENER SECCOMP [NAME SOFT HARD]... -- PROGRAM [ARGS...]\n");
        return EXIT_NOT_CONFINED;
    }
    status_fd = (int)number(argv[1], "status descriptor");
    if (sep < 7 || sep + 1 >= argc || (sep - 7) % 3 != 0) not_confined("bad launcher arguments");

    if (strcmp(argv[2], "-") != 0 && geteuid() == 0) drop_privileges((uid_t)number(argv[2], "uid"), (gid_t)number(argv[3], "gid"));
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        not_confined("no_new_privs: %s", strerror(errno));
    for (int i = 7; i < sep; i += 3) {
        int which = -1;
        for (size_t k = 0; k < sizeof LIMITS / sizeof LIMITS[0]; k++)
            if (strcmp(argv[i], LIMITS[k].name) == 0) which = LIMITS[k].resource;
        if (which < 0) not_confined("unknown resource limit %.40s", argv[i]);
        rlim_t soft = limit_value(argv[i + 1]), hard = limit_value(argv[i + 2]);
        struct rlimit current;
        if (getrlimit(which, &current) != 0) not_confined("getrlimit %s: %s", argv[i], strerror(errno));
        if (current.rlim_max != RLIM_INFINITY && (hard == RLIM_INFINITY || hard > current.rlim_max)) hard = current.rlim_max;
        struct rlimit wanted = {soft == RLIM_INFINITY || soft > hard ? hard : soft, hard};
        if (setrlimit(which, &wanted) != 0) not_confined("setrlimit %s: %s", argv[i], strerror(errno));
    }
    umask(077);
    if (argv[4][0] && chdir(argv[4]) != 0) not_confined("chdir %.200s: %s", argv[4], strerror(errno));

    int listener = -1;
    size_t encoded = strlen(argv[6]);
    if (encoded == 0) not_confined("no seccomp filter was given");
    unsigned char *bpf = malloc(encoded);
    if (!bpf) not_confined("out of memory");
    size_t size = base64_decode(argv[6], bpf);
    if (size == 0 || size % sizeof(struct sock_filter) != 0 || size / sizeof(struct sock_filter) > 0xffff)
        not_confined("the seccomp filter is %zu bytes, not whole instructions", size);
    struct sock_fprog prog = {(unsigned short)(size / sizeof(struct sock_filter)), (struct sock_filter *)bpf};
    unsigned int flags = strcmp(argv[5], "1") == 0 ? SECCOMP_FILTER_FLAG_NEW_LISTENER : 0;
    long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (fd < 0) not_confined("seccomp: %s (errno %d)", strerror(errno), errno);
    if (flags) listener = (int)fd;

    /* From here on only calls of syscall_lists.LAUNCHER: the filter is in force. */
    struct rusage usage;
    char line[128];
    getrusage(RUSAGE_SELF, &usage);
    snprintf(line, sizeof line, "{\"ok\": true, \"cpu_s\": %.6f}\n",
             (double)usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + (double)usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6);
    if (send_line(line, listener) != 0) _exit(EXIT_NOT_CONFINED); /* the host is not there to know: run nothing */
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
        for (int f = 3; f < 65536; f++) close(f);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    execvp(argv[sep + 1], argv + sep + 1);
    fprintf(stderr, "cannot execute %s: %s\n", argv[sep + 1], strerror(errno));
    _exit(127);
}
