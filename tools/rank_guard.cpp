// partita_rank_guard: names the rank of an MPI job that was lost (issue 35
// item 3, docs/testing.md "A rank that dies").
//
//   mpiexec.mpich -n 3 partita_rank_guard ./program args...
//
// The launcher starts the guard in place of each rank; the guard starts the
// program as its child (same environment, same open descriptors, so the
// program talks to the launcher as it would without the guard) and waits.
// When the program is killed by a signal that the guard did not pass on
// itself (SIGKILL from outside, a crash), the guard prints
//
//   partita: world rank 1 (pid 4242 on vm) was lost: killed by signal 9 (Killed)
//
// to stderr and then ends by the same signal, so the launcher sees what it
// would have seen. MPICH's Hydra names only a pid, and when it ends the
// other ranks in its clean-up it may name one of those instead; the guard
// of a rank ended by the launcher is itself ended (its child follows it
// through PR_SET_PDEATHSIG) or passes the launcher's signal on, and names
// nothing. A program that exits normally, with any status, is not "lost":
// the guard exits with its status.
//
// Signals. The program runs in a process group of its own, and every
// signal of kPassedOn that reaches the guard is passed on to it, once: a
// signal sent to the guard's pid, and one sent to the guard's process group
// (MPICH's Hydra signals a rank by killpg; `timeout` signals its child and
// its own group; a terminal's Ctrl-C reaches the foreground group), reach
// the program through the guard alone, never also directly, so the program
// receives each of them exactly once. SIGTSTP stops the program and then
// the guard, SIGCONT continues both; SIGKILL and SIGSTOP cannot be passed
// on: a guard ended by SIGKILL ends the program with it (PR_SET_PDEATHSIG),
// and SIGSTOP stops the guard alone. The passed-on signals are blocked
// from before the fork until the program's pid is recorded, so that one
// arriving in between waits and is passed on; the program starts with the
// guard's signal mask and default dispositions.
//
// The world rank comes from the launcher's environment: PMI_RANK (MPICH's
// Hydra), OMPI_COMM_WORLD_RANK (Open MPI), PMIX_RANK, SLURM_PROCID.
// No dependency but POSIX and Linux's prctl.
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_passed_on = 0;  // the guard was told to stop and passed it on

// Signals a launcher (or a user's Ctrl-C) sends to stop a rank: passed on to
// the program, which then ends as it would without the guard.
constexpr int kPassedOn[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};
// Job control, passed on too (the program is not in the guard's process
// group, so a group's SIGTSTP or SIGCONT would not reach it otherwise).
constexpr int kJobControl[] = {SIGTSTP, SIGCONT};

void pass_on(int sig) {
  const int saved = errno;
  g_passed_on = 1;
  if (g_child > 0) kill(static_cast<pid_t>(g_child), sig);
  errno = saved;
}

void pass_on_job_control(int sig) {
  const int saved = errno;
  if (g_child > 0) kill(static_cast<pid_t>(g_child), sig);
  if (sig == SIGTSTP) raise(SIGSTOP);  // the program stops, then the guard
  errno = saved;
}

const char* world_rank() {
  static const char* const kNames[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"};
  for (const char* name : kNames)
    if (const char* v = std::getenv(name)) return v;
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: partita_rank_guard PROGRAM [ARGS...]  (under mpiexec)\n");
    return 2;
  }
  const pid_t guard = getpid();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = pass_on;
  sigemptyset(&sa.sa_mask);
  for (int sig : kPassedOn) sigaction(sig, &sa, nullptr);
  sa.sa_handler = pass_on_job_control;
  for (int sig : kJobControl) sigaction(sig, &sa, nullptr);

  // A signal that arrives between the fork and the moment the guard knows
  // the program's pid must wait, not be taken and dropped: blocked until
  // g_child is set, then passed on.
  sigset_t blocked, mask;
  sigemptyset(&blocked);
  for (int sig : kPassedOn) sigaddset(&blocked, sig);
  for (int sig : kJobControl) sigaddset(&blocked, sig);
  sigprocmask(SIG_BLOCK, &blocked, &mask);

  const pid_t child = fork();
  if (child < 0) {
    std::perror("partita_rank_guard: fork");
    return 127;
  }
  if (child == 0) {
    // The program must not outlive its guard: a launcher that ends the
    // guard by SIGKILL ends the program with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != guard) _exit(127);  // the guard is already gone
    // A process group of its own: a signal to the guard's group reaches
    // the program only as the guard passes it on.
    setpgid(0, 0);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig : kPassedOn) sigaction(sig, &dfl, nullptr);
    for (int sig : kJobControl) sigaction(sig, &dfl, nullptr);
    sigprocmask(SIG_SETMASK, &mask, nullptr);
    execvp(argv[1], argv + 1);
    std::fprintf(stderr, "partita_rank_guard: cannot run %s: %s\n", argv[1], std::strerror(errno));
    _exit(127);
  }
  setpgid(child, child);  // as the child does, whichever runs first
  g_child = child;
  sigprocmask(SIG_SETMASK, &mask, nullptr);

  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      std::perror("partita_rank_guard: waitpid");
      return 127;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (!WIFSIGNALED(status)) return 1;
  const int sig = WTERMSIG(status);
  if (!g_passed_on) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    std::fprintf(stderr, "partita: world rank %s (pid %ld on %s) was lost: killed by signal %d (%s)\n",
                 world_rank(), static_cast<long>(child), host, sig, strsignal(sig));
    std::fflush(stderr);
  }
  // End as the program did, so the launcher reports the same status.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  signal(SIGABRT, SIG_DFL);
  raise(sig);
  return 128 + sig;
}
