/* Preloaded into the ranks by tools/simnodes.sh --no-finalize: MPI_Finalize
 * skips MPI's own shutdown, so a job cannot hang there (MPICH 4.0.2 with
 * UCX 1.13 over TCP does in some runs across nodes: docs/testing.md,
 * "Across simulated nodes"), and MPI stays initialized until the process
 * exits. Through MPI's profiling interface: it defines MPI_Finalize,
 * libmpich's weak one is not called.
 *
 * It still tells the launcher that the rank has finalized (the PMI-1
 * "finalize" exchange on the descriptor PMI_FD names, as MPICH's own
 * MPI_Finalize ends): Hydra's proxy takes a rank whose PMI connection closes
 * without it as failed (exit status 1, its processes killed) whenever it
 * notices that close before the rank's output closes, which depends on
 * timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, s, n);
    if (w < 0) return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

int MPI_Finalize(void) {
  const char *env = getenv("PMI_FD");
  if (!env || !*env) return 0; /* not started by a PMI-1 launcher */
  const int fd = atoi(env);
  static const char cmd[] = "cmd=finalize\n";
  char line[256];
  size_t n = 0;
  if (write_all(fd, cmd, sizeof cmd - 1) == 0) {
    while (n < sizeof line - 1) { /* one line: the answer */
      const ssize_t r = read(fd, line + n, 1);
      if (r <= 0 || line[n] == '\n') break;
      ++n;
    }
  }
  line[n] = '\0';
  if (strstr(line, "cmd=finalize_ack") != line)
    fprintf(stderr, "simnodes: the launcher did not acknowledge this rank's PMI finalize (answer '%s')\n", line);
  shutdown(fd, SHUT_RDWR);
  close(fd);
  unsetenv("PMI_FD"); /* closed: nothing may use it now */
  return 0;
}
