// partita_rank_guard's signals (docs/testing.md, "A rank that dies"):
//
//   rank_guard_signals GUARD
//
// runs GUARD with this program as its program (--program below) and checks
// that every signal the guard is sent reaches the program exactly once:
//
//  - fork: a SIGTERM that reaches the guard as its fork returns, before it
//    has recorded the program's pid. The guard runs under ptrace up to the
//    end of its fork (clone) system call; SIGTERM is made pending there and
//    the guard let go, so that it takes the signal first thing back in user
//    code. The program must end by that SIGTERM (or count it), not run on;
//  - group: signals to the guard's process group, as MPICH's Hydra sends
//    them (killpg) and as `timeout` and a terminal's Ctrl-C do: a SIGINT
//    sent to the group while the guard is stopped, then taken by the guard
//    once it continues, and a SIGTERM to the group; each must reach the
//    program once (a program in the guard's group, and the guard passing the
//    group's signal on, would make two). A SIGUSR1 to the guard's pid
//    alone must reach it once too.
//
// Prints one line per check and exits 0 if all pass, 1 if one fails, 77
// (skipped) when ptrace is refused here and the others pass.
//
//   rank_guard_signals --program SECONDS
//
// the program: counts SIGINT, SIGTERM and SIGUSR1, says "ready" once its
// handlers are in place, and after SECONDS prints "counts INT i TERM t USR1
// u" and exits 0. Plain POSIX and Linux's ptrace; no MPI.
#include <poll.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// ---------------------------------------------------------------------------
// The program.
volatile sig_atomic_t g_int = 0, g_term = 0, g_usr1 = 0;

void count(int sig) {
  if (sig == SIGINT) ++g_int;
  if (sig == SIGTERM) ++g_term;
  if (sig == SIGUSR1) ++g_usr1;
}

double now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int program(double seconds) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = count;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);
  const double end = now() + seconds;
  while (now() < end) {
    timespec nap{0, 10 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  std::printf("counts INT %d TERM %d USR1 %d\n", static_cast<int>(g_int), static_cast<int>(g_term),
              static_cast<int>(g_usr1));
  return 0;
}

// ---------------------------------------------------------------------------
// The checks.
std::string g_self;
std::string g_guard;

struct Guard {
  pid_t pid = -1;
  int out = -1;  // the guard's and the program's stdout and stderr
};

// GUARD SELF --program SECONDS in a process group of its own (as a launcher
// starts a rank), traced from its exec on if `traced`.
Guard start(bool traced, const char* seconds) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("rank_guard_signals: pipe");
    std::exit(1);
  }
  Guard g;
  g.pid = fork();
  if (g.pid < 0) {
    std::perror("rank_guard_signals: fork");
    std::exit(1);
  }
  if (g.pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    if (traced && ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) _exit(126);
    execl(g_guard.c_str(), g_guard.c_str(), g_self.c_str(), "--program", seconds, static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(g.pid, g.pid);
  close(fds[1]);
  g.out = fds[0];
  return g;
}

// Reads from fd into text until `until` appears (or EOF if empty), for at
// most `seconds`. False on timeout.
bool read_until(int fd, std::string& text, const char* until, double seconds) {
  const double end = now() + seconds;
  while (!(until && text.find(until) != std::string::npos)) {
    const double left = end - now();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    char buf[512];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return until == nullptr;  // EOF
    text.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// Waits for the guard to end, for at most `seconds`; kills its group then.
bool reap(const Guard& g, int& status, double seconds) {
  const double end = now() + seconds;
  while (now() < end) {
    const pid_t r = waitpid(g.pid, &status, WNOHANG);
    if (r == g.pid) return true;
    timespec nap{0, 20 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  kill(-g.pid, SIGKILL);
  waitpid(g.pid, &status, 0);
  return false;
}

std::string describe(int status) {
  char buf[64];
  if (WIFEXITED(status))
    std::snprintf(buf, sizeof buf, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    std::snprintf(buf, sizeof buf, "was killed by signal %d", WTERMSIG(status));
  else
    std::snprintf(buf, sizeof buf, "ended with wait status %d", status);
  return buf;
}

void sleep_s(double s) {
  timespec t{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

bool is_fork(long nr) {
  if (nr == SYS_clone) return true;
#ifdef SYS_clone3
  if (nr == SYS_clone3) return true;
#endif
#ifdef SYS_fork
  if (nr == SYS_fork) return true;
#endif
#ifdef SYS_vfork
  if (nr == SYS_vfork) return true;
#endif
  return false;
}

// 0 pass, 1 fail, 77 ptrace refused.
int check_fork() {
  Guard g = start(true, "3");
  int status = 0;
  if (waitpid(g.pid, &status, 0) != g.pid || !WIFSTOPPED(status)) {
    std::string text;
    read_until(g.out, text, nullptr, 2);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 126) {
      std::printf("fork: skipped: ptrace is refused here\n");
      return 77;
    }
    std::printf("fork: FAIL the guard did not stop at its exec under ptrace (%s)\n%s", describe(status).c_str(),
                text.c_str());
    return 1;
  }
  ptrace(PTRACE_SETOPTIONS, g.pid, nullptr, reinterpret_cast<void*>(PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL));
  long nr = -1;
  int inject = 0;
  bool caught = false;
  while (!caught) {
    if (ptrace(PTRACE_SYSCALL, g.pid, nullptr, reinterpret_cast<void*>(static_cast<long>(inject))) != 0) break;
    inject = 0;
    if (waitpid(g.pid, &status, 0) != g.pid || !WIFSTOPPED(status)) break;
    if (WSTOPSIG(status) != (SIGTRAP | 0x80)) {
      inject = WSTOPSIG(status);  // a signal of its own: deliver it
      continue;
    }
    __ptrace_syscall_info info{};
    if (ptrace(PTRACE_GET_SYSCALL_INFO, g.pid, reinterpret_cast<void*>(sizeof info), &info) <= 0) {
      std::printf("fork: skipped: PTRACE_GET_SYSCALL_INFO is refused here (%s)\n", std::strerror(errno));
      kill(-g.pid, SIGKILL);
      ptrace(PTRACE_DETACH, g.pid, nullptr, nullptr);
      reap(g, status, 5);
      return 77;
    }
    if (info.op == PTRACE_SYSCALL_INFO_ENTRY) {
      nr = static_cast<long>(info.entry.nr);
    } else if (info.op == PTRACE_SYSCALL_INFO_EXIT && is_fork(nr) && info.exit.rval > 0) {
      // The guard's fork has made the program and is about to return its
      // pid: SIGTERM is pending when the guard goes back to user code.
      kill(g.pid, SIGTERM);
      ptrace(PTRACE_DETACH, g.pid, nullptr, nullptr);
      caught = true;
    }
  }
  if (!caught) {
    std::string text;
    read_until(g.out, text, nullptr, 2);
    std::printf("fork: FAIL the guard never forked under ptrace (%s)\n%s", describe(status).c_str(), text.c_str());
    kill(-g.pid, SIGKILL);
    reap(g, status, 5);
    return 1;
  }
  std::string text;
  read_until(g.out, text, nullptr, 10);
  const bool ended = reap(g, status, 10);
  close(g.out);
  // Passed on, the SIGTERM ends the program before its handlers are in
  // place (the guard then ends by it too), or the program counts it.
  const bool killed = ended && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
  const bool counted = text.find("TERM 1 ") != std::string::npos;
  if ((killed || counted) && text.find("was lost") == std::string::npos) {
    std::printf("fork: ok (a SIGTERM as the guard's fork returned reached the program: the guard %s)\n",
                describe(status).c_str());
    return 0;
  }
  std::printf("fork: FAIL a SIGTERM that reached the guard as its fork returned was not passed on to the program "
              "(the guard %s); its output:\n%s",
              ended ? describe(status).c_str() : "was still running after 10 s", text.c_str());
  return 1;
}

int check_group() {
  Guard g = start(false, "3");
  std::string text;
  int status = 0;
  if (!read_until(g.out, text, "ready\n", 10)) {
    std::printf("group: FAIL the program did not start within 10 s; output:\n%s\n", text.c_str());
    kill(-g.pid, SIGKILL);
    reap(g, status, 5);
    return 1;
  }
  // A SIGINT to the guard's group while the guard is stopped: the program,
  // were it in that group, takes it at once; the guard takes it once
  // continued, and passes it on.
  kill(g.pid, SIGSTOP);
  waitpid(g.pid, &status, WUNTRACED);
  killpg(g.pid, SIGINT);
  sleep_s(0.3);
  kill(g.pid, SIGCONT);
  sleep_s(0.3);
  // A SIGTERM to the group, as `timeout` and Hydra send it.
  killpg(g.pid, SIGTERM);
  sleep_s(0.3);
  // A SIGUSR1 to the guard alone.
  kill(g.pid, SIGUSR1);
  read_until(g.out, text, nullptr, 10);
  const bool ended = reap(g, status, 10);
  close(g.out);
  const char* expected = "counts INT 1 TERM 1 USR1 1\n";
  if (ended && WIFEXITED(status) && WEXITSTATUS(status) == 0 && text.find(expected) != std::string::npos) {
    std::printf("group: ok (SIGINT and SIGTERM to the guard's group, SIGUSR1 to the guard: each reached the "
                "program once)\n");
    return 0;
  }
  std::printf("group: FAIL expected the program to say '%.*s' and the guard to exit with status 0; the guard %s, "
              "output:\n%s",
              static_cast<int>(std::strlen(expected) - 1), expected,
              ended ? describe(status).c_str() : "was still running after 10 s", text.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--program") == 0) return program(std::atof(argv[2]));
  if (argc != 2) {
    std::fprintf(stderr, "usage: rank_guard_signals GUARD\n");
    return 2;
  }
  g_guard = argv[1];
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::perror("rank_guard_signals: /proc/self/exe");
    return 1;
  }
  self[n] = '\0';
  g_self = self;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int fork_result = check_fork();
  const int group_result = check_group();
  if (fork_result == 1 || group_result == 1) return 1;
  return fork_result == 77 ? 77 : 0;
}
