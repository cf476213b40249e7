#pragma once
/// @file
/// Boost.Asio, as every qcoll header includes it. In a CUDA translation unit, nvcc
/// 13's front end cannot compile Boost 1.74 Asio's variable-template traits
/// (static_query_v and the like) once a socket is made (a `.cu` that makes one
/// fails without qcoll too); Asio's own switch makes it use class templates
/// instead, which nvcc compiles. A `.cu` that includes <boost/asio.hpp> before
/// qcoll's headers should define BOOST_ASIO_DISABLE_VARIABLE_TEMPLATES itself.

#if defined(__NVCC__) && !defined(BOOST_ASIO_DISABLE_VARIABLE_TEMPLATES)
#define BOOST_ASIO_DISABLE_VARIABLE_TEMPLATES
#endif
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio.hpp>
