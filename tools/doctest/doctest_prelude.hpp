// What every fragment of the documentation may use without including it:
// LibTorch and every public header of partita (its doctests compile the
// fragments after this header; tools/doctest/extract.py).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "partita/checkpoint.hpp"
#include "partita/distribute.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/buffer_cache.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/functional.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/attention.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/vocab_parallel.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/reduce_scatter.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/options.hpp"
#include "partita/smp.hpp"
#include "partita/smp/checkpoint.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/schedule.hpp"
#include "partita/smp/step.hpp"
#include "partita/smp/tensor_parallel.hpp"
#include "partita/testing/checks.hpp"
#include "partita/testing/lockstep.hpp"
