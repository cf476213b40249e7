#pragma once
/// @file
/// A 2-D grid drawn in ASCII, for grid_routing::draw() and whatever else wants to
/// show a grid: the layout of cells, links and hop arrows. What a cell shows is the
/// caller's business.

#include <qcoll/detail/check.hpp>
#include <qcoll/topologies/grid.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace qcoll::topologies {

/// A picture of a 2-D mesh or torus: rows a, b, … top to bottom (`*` after z),
/// columns 1, 2, … left to right, one character cell per node (blank until set),
/// `-` and `|` usable links, blank a broken one. hop() draws `<` `>` `^` `v` between
/// neighbours; wraparound hops along a row are drawn at the row's ends, those along a
/// column have no room and are left out.
///
///       1   2   3
///   a   # - # - #
///       |   |
///   b   A > #   X
class grid_drawing {
 public:
  /// @par Errors
  /// qcoll::error (invalid_argument) when g does not have two dimensions.
  explicit grid_drawing(const grid& g) : shape_(g.shape()) {
    if (shape_.dimensions() != 2)
      detail::throw_error(errc::invalid_argument, "grid_drawing: a grid of {} dimensions, not 2", shape_.dimensions());
    const std::size_t rows = shape_.extent(0), columns = shape_.extent(1);
    canvas_.assign(2 * rows, std::string(4 * columns + 4, ' '));
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string label = std::to_string(c + 1);
      canvas_[0].replace(4 + 4 * c, label.size(), label);
    }
    for (std::size_t r = 0; r < rows; ++r) canvas_[1 + 2 * r][0] = static_cast<char>(r < 26 ? 'a' + r : '*');
    for (rank_t v = 0; v < shape_.size(); ++v) {
      if (auto right = shape_.neighbour(v, 1, +1); right && *right > v && g.linked(v, *right))
        canvas_[1 + 2 * shape_.coordinate(v, 0)][6 + 4 * shape_.coordinate(v, 1)] = '-';
      if (auto down = shape_.neighbour(v, 0, +1); down && *down > v && g.linked(v, *down))
        canvas_[2 + 2 * shape_.coordinate(v, 0)][4 + 4 * shape_.coordinate(v, 1)] = '|';
    }
  }

  /// The cell of `node`.
  char& cell(rank_t node) { return canvas_[1 + 2 * shape_.coordinate(node, 0)][4 + 4 * shape_.coordinate(node, 1)]; }

  /// An arrow for a hop from `from` to its neighbour `to`, between their cells.
  void hop(rank_t from, rank_t to) {
    const std::size_t fr = shape_.coordinate(from, 0), fc = shape_.coordinate(from, 1);
    const std::size_t tr = shape_.coordinate(to, 0), tc = shape_.coordinate(to, 1);
    if (fr == tr) {
      const bool right = tc == fc + 1 || (fc + 1 == shape_.extent(1) && tc == 0);
      const bool wraps = (right && tc < fc) || (!right && tc > fc);
      const std::size_t column = wraps ? (right ? 4 * shape_.extent(1) + 2 : 2) : 4 + 4 * std::min(fc, tc) + 2;
      canvas_[1 + 2 * fr][column] = right ? '>' : '<';
    } else {
      const bool down = tr == fr + 1 || (fr + 1 == shape_.extent(0) && tr == 0);
      const bool wraps = (down && tr < fr) || (!down && tr > fr);
      if (wraps) return;  // no room above row a or below the last row
      canvas_[2 + 2 * std::min(fr, tr)][4 + 4 * fc] = down ? 'v' : '^';
    }
  }

  /// The picture, one line per text row, trailing blanks dropped.
  std::string text() const {
    std::string text;
    for (const std::string& line : canvas_) {
      const std::size_t end = line.find_last_not_of(' ');
      if (end != std::string::npos) text.append(line, 0, end + 1);
      text += '\n';
    }
    return text;
  }

 private:
  grid_shape shape_;
  std::vector<std::string> canvas_;
};

}  // namespace qcoll::topologies
