#pragma once
/// @file
/// The job's key-value store over TCP (Boost.Asio): rank 0 serves it (store_server),
/// every rank, rank 0 included, is a client (store_client), which models the
/// rendezvous::store concept of store.hpp. Ranks publish their addresses in it and meet
/// at barriers; it carries a few hundred bytes per rank, not data.
///
/// This header includes its parts, which include one another only downwards:
/// - tcp_store_protocol.hpp: the wire protocol both sides share (its frames, limits and
///   parsers, and the protocol's description);
/// - tcp_store_table.hpp: the store's data and parked requests, as logic over requests;
/// - tcp_store_server.hpp: store_server and the Asio service that runs the table;
/// - tcp_store_client.hpp: store_client.

#include <qcoll/rendezvous/tcp_store_protocol.hpp>
#include <qcoll/rendezvous/tcp_store_table.hpp>
#include <qcoll/rendezvous/tcp_store_server.hpp>
#include <qcoll/rendezvous/tcp_store_client.hpp>
