// The launch layer's non-template code, compiled once for the programs that link the
// qcoll_launch library (qcoll's own examples, benchmarks and test workers):
// launch::detail::join_host and join_node — the store, the transports' joins and the
// Asio behind them — and launch::elastic_job's members. Those programs are built with
// QCOLL_LAUNCH_COMPILED and see these functions declared only.
#define QCOLL_LAUNCH_SOURCE
#include <qcoll/launch/elastic.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/launch/join_nodes.hpp>
