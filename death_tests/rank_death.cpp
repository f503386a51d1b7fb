// A rank that dies (issue 35 item 3): one program, one mode per situation.
// World rank 1 (the victim) SIGKILLs itself, or throws, while the other
// ranks wait for it inside a partita operation:
//
//   collective  an AllSumReduce over the world (a collective primitive)
//   pipeline    in its stage's forward of microbatch 1 inside smp::step
//   smp_send    rank 0 is in smp::send (synchronous) to rank 1, the others
//               in smp::barrier
//   isend       a ring of Communicator isend/irecv of 1 MiB both ways, then wait
//   throw       as pipeline, but the victim's layer throws (user code)
//   stuck       as collective, but the victim neither dies nor joins: it
//               sleeps, and the waiting ranks' watchdog (PARTITA_WAIT_TIMEOUT,
//               set by the test) must end the job, whether the wait is a
//               blocking MPI call or partita's own loop (docs/mpi-runtime.md)
//   slow        as collective, but the victim joins 8 s late: alive and
//               reachable, so a peer check that probes it must not end
//               anyone (run with PARTITA_PEER_CHECK=2 across nodes)
//   early       nothing is lost: the victim finishes at once (its process
//               ends), and rank 0 waits 8 s for a message from rank 2; the
//               peer check (PARTITA_PEER_CHECK=2) must not take the
//               finished victim for a lost one
//
// With a second argument `cut` (run across simulated nodes with network
// namespaces, tools/simnodes.sh --netns), the victim does not die where it
// would: it sets its node's link down (`ip link set eth0 down`) and sleeps,
// alive and unreachable; the others' peer check (docs/mpi-runtime.md, "A
// lost node") must end them, naming it.
//
// Every rank prints "rank R is pid P" at start (Hydra names a process that
// died by its pid); every rank but the victim prints "rank R waits in MODE"
// just before the operation and "rank R finished MODE" if it ever returns.
// The victim prints nothing about its death, so what names it comes from
// the launcher or from partita. run_death.cmake launches it and judges the
// job: ended within 30 s, non-zero exit status, the lost rank named.
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/smp.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"

namespace {

using namespace partita;

constexpr int kVictim = 1;
std::string g_mode;
bool g_cut = false;

bool victim() { return mpi::world_rank() == kVictim; }

// The victim gives its peers time to reach their wait, then dies.
[[noreturn]] void die() {
  usleep(500 * 1000);
  if (g_cut) {
    // (Without the rank's preloads: under tools/sanitize.sh they hold the
    // sanitizer's runtime, which would check `ip` itself for leaks.)
    if (std::system("env -u LD_PRELOAD ip link set eth0 down") != 0)
      std::fprintf(stderr, "rank_death: could not cut the link\n");
    for (;;) sleep(60);  // alive, unreachable: its own peer check or the launcher ends it
  }
  raise(SIGKILL);
  std::abort();  // not reached
}

void say(const char* what) {
  std::printf("rank %d %s %s\n", mpi::world_rank(), what, g_mode.c_str());
  std::fflush(stdout);
}

// Passes its input on; on the victim, in microbatch 1, dies or throws.
struct FailingLayerImpl : torch::nn::Module {
  at::Tensor forward(at::Tensor x) {
    if (victim() && smp::microbatch() == 1) {
      if (g_mode == "throw") throw std::runtime_error("user code failed on purpose in its forward");
      die();
    }
    return x * 1.0;
  }
};
TORCH_MODULE(FailingLayer);

void collective() {
  nn::AllSumReduce layer(mpi::Partition::world().create_cartesian_topology_partition({mpi::world_size()}),
                         std::vector<int>{0});
  const at::Tensor x = at::full({1024}, mpi::world_rank(), at::kDouble);
  (void)layer(x);  // every rank once: the layer's plan is made and agreed
  if (victim()) {
    if (g_mode == "slow") {
      sleep(8);  // alive and reachable, only late: it joins below
    } else {
      if (g_mode != "stuck") die();
      sleep(60);  // never joins; the launcher ends it with the job
      std::abort();
    }
  }
  say("waits in");
  (void)layer(x);
}

void early() {
  const auto comm = mpi::Communicator::world().dup();
  if (victim()) return;
  const at::Tensor t = at::full({4}, 1.0, at::kDouble);
  if (mpi::world_rank() == 2) {
    sleep(8);
    auto s = comm.isend(t, 0, 9);
    (void)comm.wait(s);
  } else if (mpi::world_rank() == 0) {
    const at::Tensor in = at::empty({4}, at::kDouble);
    say("waits in");
    auto q = comm.irecv(in, 2, 9);
    (void)comm.wait(q);
  }
}

void pipeline() {
  const int n = mpi::world_size();
  smp::Config config;
  config.partitions(n);
  config.microbatches(2);
  config.pipeline("interleaved");
  config.ddp(false);
  smp::init(config);
  torch::manual_seed(1);
  torch::nn::Sequential seq;
  for (int i = 0; i < n; ++i) {
    seq->push_back(torch::nn::Linear(torch::nn::LinearOptions(4, 4)));
    if (i == kVictim) seq->push_back(FailingLayer());
  }
  seq->to(torch::kDouble);
  std::vector<int> split;  // one Linear per stage; the failing layer on the victim's stage
  for (int i = 1; i < n; ++i) split.push_back(i <= kVictim ? i : i + 1);
  smp::DistributedModel model(seq, split);
  smp::StepOptions o;
  o.microbatches(2);
  auto train = smp::step(
      [&model](at::Tensor x, at::Tensor y) {
        at::Tensor loss = torch::mse_loss(model(x), y);
        model.backward(loss);
        return loss;
      },
      o);
  const at::Tensor x = torch::randn({4, 4}, torch::kDouble), y = torch::randn({4, 4}, torch::kDouble);
  if (!victim()) say("waits in");
  (void)train(x, y);
}

void smp_send() {
  smp::Config config;
  config.partitions(1);
  config.ddp(true);
  smp::init(config);
  if (victim()) die();
  say("waits in");
  if (mpi::world_rank() == 0)
    smp::send(std::string("for rank 1"), kVictim, smp::WORLD_RANK);
  else
    smp::barrier();
}

void isend() {
  const auto comm = mpi::Communicator::world().dup();
  const int n = comm.size(), r = comm.rank();
  const at::Tensor t = at::full({1 << 17}, r, at::kDouble);  // 1 MiB: not sent eagerly
  const at::Tensor in = at::empty({1 << 17}, at::kDouble), back = at::empty({1 << 17}, at::kDouble);
  if (victim()) die();
  say("waits in");
  // Both ways round the ring, so that every rank receives from the victim:
  // a send may complete without its receiver (between nodes it does).
  auto s = comm.isend(t, (r + 1) % n, 7);
  auto s2 = comm.isend(t, (r + n - 1) % n, 8);
  auto q = comm.irecv(in, (r + n - 1) % n, 7);
  auto q2 = comm.irecv(back, (r + 1) % n, 8);
  (void)comm.wait(s);
  (void)comm.wait(s2);
  (void)comm.wait(q);
  (void)comm.wait(q2);
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  g_mode = argc > 1 ? argv[1] : "";
  g_cut = argc > 2 && std::string(argv[2]) == "cut";
  std::printf("rank %d is pid %d\n", mpi::world_rank(), static_cast<int>(getpid()));
  std::fflush(stdout);
  if (mpi::world_size() < 2) {
    std::fprintf(stderr, "rank_death: needs at least 2 ranks\n");
    return 2;
  }
  try {
    if (g_mode == "collective" || g_mode == "stuck" || g_mode == "slow") collective();
    else if (g_mode == "pipeline" || g_mode == "throw") pipeline();
    else if (g_mode == "smp_send") smp_send();
    else if (g_mode == "isend") isend();
    else if (g_mode == "early") early();
    else {
      std::fprintf(stderr, "rank_death: unknown mode '%s' (collective, pipeline, smp_send, isend, throw, stuck, slow, early)\n",
                   g_mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    // What a rank raised, as a program that lets it end main would show it.
    std::printf("rank %d raised: %s\n", mpi::world_rank(), e.what());
    std::fflush(stdout);
    return 1;
  }
  say("finished");
  return 0;
}
