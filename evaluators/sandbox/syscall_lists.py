"""The allow-lists of evaluators/sandbox/syscalls.py, by kind.

Each kind's list holds every call `python -m evaluators.learn_profiles` saw its honest
programs make (the math starters and published records, denoising's MAGIC, magic-impute and ALRA,
TriMul's initial and torch.compile kernels on the CPU check, AHC039's initial program and a
contest-style AHC058 program, with their compilations), and the rest of the ordinary interface
of a process that works inside its own namespaces: its memory, its files, clocks and timers, its
threads and children, signals, pipes and local sockets. Nothing here reaches outside the sandbox:
not on the lists, whatever the kind, are the kernel keyrings, tracing and reading other processes,
mounts and namespaces, file handles, eBPF, perf events, userfaultfd, io_uring, fanotify, modules,
kexec, reboot, swap, clock setting, syslog, accounting, quotas, I/O ports, uid and capability
changes, System V IPC and NUMA page migration.
"""

# What confine.py calls between installing its filter and reporting to the host (before anyone
# answers the listener), and its exec of a compiled program.
LAUNCHER = (
    "brk", "close", "close_range", "execve", "exit", "exit_group", "fcntl", "fstat", "futex", "getpid",
    "getrusage", "getsockname", "getsockopt", "lseek", "mmap", "munmap", "newfstatat", "rt_sigaction",
    "rt_sigprocmask", "sendmsg", "sendto", "write",
)  # fmt: skip

# Any process's C runtime: memory, reading and writing its files, clocks, threads, signals.
RUNTIME = (
    "access", "arch_prctl", "brk", "clock_getres", "clock_gettime", "clock_nanosleep", "close", "close_range",
    "dup", "dup2", "dup3", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64", "fcntl", "fstat",
    "fstatfs", "futex", "get_robust_list", "getcwd", "getdents64", "getegid", "geteuid", "getgid",
    "getgroups", "getitimer", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
    "getrlimit", "getrusage", "getsid", "gettid", "gettimeofday", "getuid", "ioctl", "kill", "lseek",
    "lstat", "madvise", "membarrier", "mincore", "mmap", "mprotect", "mremap", "msync", "munmap",
    "nanosleep", "newfstatat", "open", "openat", "pause", "pipe", "pipe2", "poll", "ppoll", "prlimit64",
    "pread64", "preadv", "preadv2", "pselect6", "pwrite64", "pwritev", "pwritev2", "read", "readlink",
    "readlinkat", "readv", "restart_syscall", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask",
    "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_setaffinity", "sched_yield", "select", "set_robust_list", "set_tid_address", "setitimer",
    "sigaltstack", "stat", "statfs", "statx", "sysinfo", "tgkill", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "times", "tkill", "umask",
    "uname", "write", "writev", "getcpu",
)  # fmt: skip

# Starting and waiting for children (a compiler's passes, Python's subprocess and multiprocessing);
# clone itself is allowed without namespace flags only (syscalls._conditions).
CHILDREN = ("execve", "fork", "vfork", "wait4", "waitid", "setsid", "setpgid", "prctl")

# Working with files of its own directories and scratch filesystems.
FILES = (
    "chdir", "chmod", "fchdir", "fchmod", "fchmodat", "flock", "fsync", "fdatasync", "ftruncate", "link",
    "linkat", "mkdir", "mkdirat", "rename", "renameat", "renameat2", "rmdir", "symlink", "symlinkat",
    "truncate", "unlink", "unlinkat", "utimensat", "fallocate", "copy_file_range", "sendfile",
)  # fmt: skip

# Local communication: pipes, local and loopback sockets (the family is checked, syscalls._conditions),
# readiness and event descriptors.
LOCAL_IPC = (
    "accept", "accept4", "bind", "connect", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_pwait",
    "epoll_wait", "eventfd", "eventfd2", "getpeername", "getsockname", "getsockopt", "listen", "memfd_create",
    "recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto", "setsockopt", "shutdown",
    "socketpair", "timerfd_create", "timerfd_gettime", "timerfd_settime", "splice", "tee",
)  # fmt: skip

# NumPy's and torch's thread pools ask for the memory policy (mbind from OpenBLAS); capget lets a
# library see that it has no capabilities.
NUMERIC = ("mbind", "get_mempolicy", "set_mempolicy", "capget", "sched_setscheduler", "sched_setparam", "setpriority")

PYTHON = RUNTIME + CHILDREN + FILES + LOCAL_IPC + NUMERIC
# A GPU problem's Python run on top of PYTHON (the C compiler it starts is COMPILER): CUDA's driver
# library talks to the device through ioctl and mmap (in RUNTIME) and pins pages with mlock.
GPU_EXTRA = ("mlock", "mlock2", "munlock", "mlockall", "munlockall", "inotify_init1", "inotify_add_watch", "inotify_rm_watch")
COMPILER = RUNTIME + CHILDREN + FILES + ("getpeername",)
PROGRAM = RUNTIME

# Inside a Docker container, beside its candidates' kinds: the init and keeper, and the runner,
# which drops compiled programs to their uid and hands them their files (as the container's root
# with a few capabilities, docker_native.py).
CONTAINER_RUNNER = (
    "setuid", "setgid", "setgroups", "setresuid", "setresgid", "setreuid", "setregid", "chown", "fchown",
    "fchownat", "lchown", "pidfd_open", "pidfd_send_signal", "capget", "execve", "wait4", "waitid", "kill",
    "seccomp",  # the launcher installs the Python kind's own filter inside the container
)  # fmt: skip
