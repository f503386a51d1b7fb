// LibTorch's own C++ collectives as a third line beside partita and raw MPI
// (issue 34 item 5): c10d::ProcessGroupGloo over a FileStore, on the same
// ranks and bytes, timed in the same loop (bench/paired.hpp). Built only
// where Gloo's headers are found (Debian's libgloo-dev); without them
// `gloo_available()` is false and the benchmarks run without the line.
// Kept out of paired.hpp so that only gloo_peer.cpp reads c10d's headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace partita::bench {

bool gloo_available();
// What the JSON context says the peer is ("c10d::ProcessGroupGloo ...").
std::string gloo_description(const std::string& call);

// Each blocks until the collective is done on this rank (Work::wait).
void gloo_allreduce(at::Tensor& t);
void gloo_broadcast(at::Tensor& t, int root);
void gloo_reduce(at::Tensor& t, int root);
void gloo_allgather(std::vector<at::Tensor>& out, at::Tensor& in);

}  // namespace partita::bench
