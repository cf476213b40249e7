#pragma once
/// @file
/// Umbrella header: the CPU parts of qcoll. Transports with extra dependencies
/// (TCP over Boost.Asio, CUDA peer) are included on their own.

#include <qcoll/version.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/adaptive_allreduce.hpp>
#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/grid_allreduce.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/reproducible_grid.hpp>
#include <qcoll/two_level_allreduce.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/lazy_update.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/topologies/fully_connected.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/router.hpp>
#include <qcoll/topologies/ring.hpp>
#include <qcoll/training/depth_pipeline.hpp>
#include <qcoll/transports/inproc.hpp>
