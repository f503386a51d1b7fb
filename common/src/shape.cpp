#include "partita/shape.hpp"

#include <algorithm>
#include <sstream>

#include "partita/errors.hpp"

namespace partita {

int64_t volume(const Shape& shape) {
  int64_t v = 1;
  for (auto s : shape) v *= s;
  return v;
}

std::string shape_string(const Shape& shape) {
  if (shape.empty()) return "()";
  std::ostringstream os;
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  return os.str();
}

std::string list_string(const std::vector<int64_t>& values) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size(); ++i) os << (i ? "," : "") << values[i];
  return os.str();
}

std::string list_string(const Ranks& values) {
  return list_string(std::vector<int64_t>(values.begin(), values.end()));
}

std::string workers_string(const Ranks& workers) {
  if (workers.size() <= 32) return list_string(workers);
  const Ranks head(workers.begin(), workers.begin() + 16), tail(workers.end() - 4, workers.end());
  return list_string(head) + ",...," + list_string(tail) + " (" + std::to_string(workers.size()) + " workers)";
}

int64_t ravel(const Index& index, const Shape& shape) {
  if (index.size() != shape.size())
    throw Error("ravel: index [" + list_string(index) + "] does not fit shape " +
                shape_string(shape));
  int64_t r = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (index[d] < 0 || index[d] >= shape[d])
      throw Error("ravel: index [" + list_string(index) + "] outside shape " +
                  shape_string(shape));
    r = r * shape[d] + index[d];
  }
  return r;
}

Index unravel(int64_t rank, const Shape& shape) {
  if (rank < 0 || rank >= volume(shape))
    throw Error("unravel: rank " + std::to_string(rank) + " outside shape " +
                shape_string(shape));
  Index index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = rank % shape[d];
    rank /= shape[d];
  }
  return index;
}

int64_t local_length(int64_t n, int64_t p, int64_t i) {
  return n / p + (i < n % p ? 1 : 0);
}

int64_t local_start(int64_t n, int64_t p, int64_t i) {
  return i * (n / p) + std::min(i, n % p);
}

namespace {
int64_t parse_int(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw Error("cannot read '" + text + "' in '" + whole + "' as an integer");
  return v;
}
}  // namespace

Shape parse_shape(const std::string& text) {
  Shape shape;
  std::string item;
  std::string norm = text;
  std::replace(norm.begin(), norm.end(), 'x', ',');
  std::istringstream is(norm);
  while (std::getline(is, item, ',')) {
    const int64_t v = parse_int(item, text);
    if (v < 1) throw Error("shape '" + text + "': every extent must be >= 1");
    shape.push_back(v);
  }
  if (shape.empty()) throw Error("empty shape '" + text + "'");
  // A volume beyond 2^63 wraps where it is computed (and could equal a
  // rank count).
  int64_t n = 1;
  for (int64_t e : shape)
    if (__builtin_mul_overflow(n, e, &n)) throw Error("shape '" + text + "': its volume exceeds 2^63");
  return shape;
}

Ranks parse_ranks(const std::string& text) {
  // A rank (or rank count) beyond kMaxRanks, or a list longer than that,
  // is no world partita can be asked about: refused before it is held as
  // an int or expanded (a range of 2e9 would take gigabytes).
  auto value = [&](const std::string& item) {
    const int64_t v = parse_int(item, text);
    if (v < 0 || v > kMaxRanks)
      throw Error("'" + item + "' in '" + text + "' is not a rank from 0 to " + std::to_string(kMaxRanks));
    return static_cast<int>(v);
  };
  auto too_long = [&] {
    throw Error("rank list '" + text + "' holds more than " + std::to_string(kMaxRanks) + " ranks");
  };
  Ranks ranks;
  std::string item;
  std::istringstream is(text);
  while (std::getline(is, item, ',')) {
    const auto dash = item.find('-', 1);
    if (dash == std::string::npos) {
      ranks.push_back(value(item));
    } else {
      const int lo = value(item.substr(0, dash));
      const int hi = value(item.substr(dash + 1));
      if (hi < lo) throw Error("rank range '" + item + "' runs backwards");
      if (static_cast<int64_t>(ranks.size()) + (hi - lo + 1) > kMaxRanks) too_long();
      for (int r = lo; r <= hi; ++r) ranks.push_back(r);
    }
    if (static_cast<int64_t>(ranks.size()) > kMaxRanks) too_long();
  }
  if (ranks.empty()) throw Error("empty rank list '" + text + "'");
  return ranks;
}

}  // namespace partita
