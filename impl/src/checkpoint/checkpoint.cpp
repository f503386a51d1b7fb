// partita::checkpoint (checkpoint.hpp; docs/checkpoints.md).
//
// Every rank learns every rank's pieces (one all-gather of descriptions),
// so every check below runs on the same data everywhere and raises the same
// error on every rank. The data move through one collective MPI-IO call
// per rank: the file view is a struct of subarray types (one per piece, at
// its tensor's offset), the memory side a struct of the pieces' addresses.
#include "partita/checkpoint.hpp"

#include "agree.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "partita/json.hpp"

// A checkpoint's data is little-endian (the safetensors format); tensors
// are written and read as their bytes lie in memory.
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "partita's checkpoints write tensors' bytes as they are: a little-endian host is required"
#endif
#include "partita/mpi/runtime.hpp"
#include "partita/safetensors.hpp"
#include "partita/tiling.hpp"

namespace partita::checkpoint {

namespace fs = std::filesystem;

void detail::agree(const std::string& error, const std::string& dir) {
  const auto all = mpi::allgather_strings(error, mpi::world_comm());
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw CheckpointError(dir + ": rank " + std::to_string(r) + ": " + all[r]);
}

namespace {

using detail::agree;

constexpr const char* kDataFile = "model.safetensors";
constexpr const char* kManifest = "manifest.json";

std::string dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: return "";
  }
}

std::string clean(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// One rank's piece as every rank sees it.
struct Piece {
  int rank = 0;
  std::string name, dtype;
  Shape global, start, len;
  bool holds() const { return volume(len) > 0; }
};

json::Value describe(const Piece& p) { return {p.name, p.dtype, p.global, p.start, p.len}; }

Piece piece_of(const json::Value& v, int rank) {
  Piece p;
  p.rank = rank;
  p.name = v[0].get<std::string>();
  p.dtype = v[1].get<std::string>();
  p.global = v[2].get<Shape>();
  p.start = v[3].get<Shape>();
  p.len = v[4].get<Shape>();
  return p;
}

// This rank's pieces, checked on their own. Throws CheckpointError.
std::vector<Piece> local_pieces(const std::vector<Shard>& shards) {
  std::vector<Piece> out;
  std::set<std::string> names;
  for (const Shard& s : shards) {
    const std::string what = "\"" + s.name + "\"";
    if (s.name.empty() || s.name == "__metadata__") throw CheckpointError("a tensor may not be named " + what);
    if (!names.insert(s.name).second) throw CheckpointError(what + " is passed twice by one rank");
    try {
      (void)json::Value(s.name).dump();
    } catch (const std::exception&) {
      throw CheckpointError("a tensor name is not valid UTF-8");
    }
    if (!s.local.defined()) continue;  // holds nothing
    if (s.local.device().type() != c10::DeviceType::CPU || s.local.layout() != c10::kStrided)
      throw CheckpointError(what + ": only dense CPU tensors are saved and loaded");
    Piece p;
    p.rank = mpi::world_rank();
    p.name = s.name;
    p.dtype = dtype_of(s.local.scalar_type());
    if (p.dtype.empty())
      throw CheckpointError(what + ": safetensors has no dtype for " + std::string(c10::toString(s.local.scalar_type())));
    p.global = s.global;
    p.start = s.start;
    p.len = Shape(s.local.sizes().begin(), s.local.sizes().end());
    if (p.start.size() != p.global.size() || p.len.size() != p.global.size())
      throw CheckpointError(what + ": a " + std::to_string(p.len.size()) + "-dimensional piece starting at " +
                            shape_string(p.start) + " of a global shape " + shape_string(p.global));
    for (size_t d = 0; d < p.global.size(); ++d)
      if (p.global[d] < 0 || p.start[d] < 0 || p.start[d] > p.global[d] - p.len[d])  // (never overflows)
        throw CheckpointError(what + ": the piece " + shape_string(p.len) + " at " + shape_string(p.start) +
                              " is not inside the global shape " + shape_string(p.global));
    // MPI-IO's subarray types count in int: refused here, before anything
    // is written or read, with the tensor's name.
    for (int64_t extent : p.global)
      if (extent > INT_MAX)
        throw CheckpointError(what + ": the global shape " + shape_string(p.global) +
                              " has a dimension above MPI's count limit (INT_MAX = " + std::to_string(INT_MAX) + ")");
    int64_t bytes = s.local.element_size();
    for (int64_t extent : p.global)
      if (__builtin_mul_overflow(bytes, extent, &bytes))
        throw CheckpointError(what + ": the global shape " + shape_string(p.global) + " holds more than 2^63 bytes");
    if (volume(p.len) > INT_MAX)
      throw CheckpointError(what + ": the piece " + shape_string(p.len) + " holds " + std::to_string(volume(p.len)) +
                            " elements, above MPI's count limit (INT_MAX = " + std::to_string(INT_MAX) + ")");
    out.push_back(p);
  }
  return out;
}

// Every rank's pieces and counters (or, where a rank failed on its own,
// every rank raises that rank's message: the lowest failing rank's). The
// counters are merged; one name with two values is refused.
std::vector<Piece> gather_pieces(const std::vector<Shard>& shards, std::map<std::string, int64_t>* counters,
                                 const std::string& dir) {
  json::Value mine = {{"pieces", json::Value::array()}, {"counters", json::Value::object()}};
  std::string error;
  try {
    for (const Piece& p : local_pieces(shards)) mine["pieces"].push_back(describe(p));
    if (counters)
      for (const auto& [k, v] : *counters) mine["counters"][k] = v;
    (void)mine.dump();  // a counter's name that is not UTF-8 fails here, on its own rank
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string text = error.empty() ? mine.dump() : "!" + error;
  const auto all = mpi::allgather_strings(text, mpi::world_comm());
  std::vector<Piece> out;
  std::map<std::string, std::pair<int64_t, size_t>> merged;  // value, first rank
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == '!')
      throw CheckpointError(dir + ": rank " + std::to_string(r) + ": " + all[r].substr(1));
    const json::Value v = json::parse(all[r], "pieces");
    for (const auto& p : v["pieces"]) out.push_back(piece_of(p, static_cast<int>(r)));
    for (const auto& [k, c] : v["counters"].items()) {
      const auto [it, fresh] = merged.try_emplace(k, c.get<int64_t>(), r);
      if (!fresh && it->second.first != c.get<int64_t>())
        throw CheckpointError(dir + ": the counter \"" + k + "\" is " + std::to_string(it->second.first) + " on rank " +
                              std::to_string(it->second.second) + " and " + c.dump() + " on rank " + std::to_string(r));
    }
  }
  if (counters) {
    counters->clear();
    for (const auto& [k, v] : merged) (*counters)[k] = v.first;
  }
  return out;
}

std::string mpi_error(int code, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  return what + ": " + std::string(text, n);
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + p.string() + " to flush it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot flush " + p.string() + ": " + std::strerror(errno));
}

// rename(2) replaces an empty directory at `to`; RENAME_NOREPLACE refuses
// anything there. A file system without it (EINVAL) gets rename(2), which
// still refuses a directory that is not empty. 0 or the errno.
int rename_no_replace(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

// A piece's place in the file and in memory, for the MPI-IO types.
struct Span {
  int64_t offset;  // the tensor's first byte in the file
  int64_t element;
  Shape global, start, len;
  void* data;
};

int as_int(int64_t v, const std::string& what) {
  if (v > INT_MAX) throw CheckpointError(what + " has " + std::to_string(v) + " elements, more than MPI's INT_MAX");
  return static_cast<int>(v);
}

struct Types {
  MPI_Datatype file = MPI_BYTE, memory = MPI_BYTE;
  std::vector<MPI_Datatype> owned;
  int count = 0;
  ~Types() {
    for (auto& t : owned) MPI_Type_free(&t);
  }
};

// The file view and the memory type of `transfers` (sorted by offset).
void build_types(const std::vector<Span>& transfers, Types& types, const std::string& what) {
  if (transfers.empty()) return;
  std::vector<int> ones(transfers.size(), 1), counts;
  std::vector<MPI_Aint> file_at, memory_at;
  std::vector<MPI_Datatype> file_types, memory_types;
  for (const Span& t : transfers) {
    MPI_Datatype element, box;
    MPI_Type_contiguous(static_cast<int>(t.element), MPI_BYTE, &element);
    types.owned.push_back(element);
    if (t.global.empty()) {
      box = element;
    } else {
      std::vector<int> sizes, subsizes, starts;
      for (size_t d = 0; d < t.global.size(); ++d) {
        sizes.push_back(as_int(t.global[d], what));
        subsizes.push_back(static_cast<int>(t.len[d]));
        starts.push_back(static_cast<int>(t.start[d]));
      }
      MPI_Type_create_subarray(static_cast<int>(sizes.size()), sizes.data(), subsizes.data(), starts.data(),
                               MPI_ORDER_C, element, &box);
      types.owned.push_back(box);
    }
    file_types.push_back(box);
    file_at.push_back(static_cast<MPI_Aint>(t.offset));
    MPI_Aint address;
    MPI_Get_address(t.data, &address);
    memory_at.push_back(address);
    memory_types.push_back(element);
    counts.push_back(as_int(volume(t.len), what));
  }
  const int n = static_cast<int>(transfers.size());
  MPI_Type_create_struct(n, ones.data(), file_at.data(), file_types.data(), &types.file);
  types.owned.push_back(types.file);
  MPI_Type_create_struct(n, counts.data(), memory_at.data(), memory_types.data(), &types.memory);
  types.owned.push_back(types.memory);
  MPI_Type_commit(&types.file);
  MPI_Type_commit(&types.memory);
  types.count = 1;
}

// One read or write of `transfers` through `path`, collective over the world.
std::string move_data(const std::string& path, std::vector<Span> transfers, bool write, const std::string& dir) {
  std::sort(transfers.begin(), transfers.end(), [](const Span& a, const Span& b) { return a.offset < b.offset; });
  std::string error;
  Types types;
  try {
    build_types(transfers, types, dir);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, dir);
  // Writes: one collective write through the world. ROMIO aggregates the
  // pieces of columns into large contiguous writes (collective buffering),
  // which costs nothing where every rank has its core; where ranks share
  // cores (the yield waiting policy on some rank, docs/mpi-runtime.md) its
  // aggregators poll for each other's data without yielding, which took a
  // 4-rank save on 2 cores from 1.0 s to 2.0 s, so there each rank writes
  // its own pieces (docs/checkpoints.md, "Speed and memory").
  // Reads: each rank opens the file on its own and reads its pieces
  // straight into its tensors. ROMIO's collective buffering and data sieving
  // would read the file through an aggregator's buffer (ten times slower
  // from the page cache), and a collective open on ranks that share cores
  // waits on MPICH's polling (45 ms of a 4-rank load on 2 cores).
  MPI_Info info;
  MPI_Info_create(&info);
  if (write) {
    if (!mpi::all_true(mpi::wait_policy() != mpi::WaitPolicy::Yield, mpi::world_comm()))
      MPI_Info_set(info, "romio_cb_write", "disable");
  } else {
    MPI_Info_set(info, "romio_cb_read", "disable");
    MPI_Info_set(info, "romio_ds_read", "disable");
  }
  MPI_File fh;
  int rc = MPI_File_open(write ? mpi::world_comm() : MPI_COMM_SELF, path.c_str(),
                         write ? MPI_MODE_WRONLY : MPI_MODE_RDONLY, info, &fh);
  MPI_Info_free(&info);
  try {
    agree(rc == MPI_SUCCESS ? "" : mpi_error(rc, "cannot open " + path), dir);
  } catch (const CheckpointError&) {
    if (rc == MPI_SUCCESS) MPI_File_close(&fh);  // opened here, not on another rank
    throw;
  }
  if (rc == MPI_SUCCESS) rc = MPI_File_set_view(fh, 0, MPI_BYTE, types.file, "native", MPI_INFO_NULL);
  if (rc == MPI_SUCCESS) {
    MPI_Status status;
    rc = write ? MPI_File_write_all(fh, MPI_BOTTOM, types.count, types.memory, &status)
               : MPI_File_read(fh, MPI_BOTTOM, types.count, types.memory, &status);
    if (rc == MPI_SUCCESS && types.count) {
      int got = 0;
      MPI_Get_count(&status, types.memory, &got);
      if (got != types.count) error = std::string(write ? "wrote" : "read") + " less than its pieces from " + path;
    }
    if (rc == MPI_SUCCESS && write) rc = MPI_File_sync(fh);
  }
  if (rc != MPI_SUCCESS && error.empty()) error = mpi_error(rc, std::string(write ? "writing " : "reading ") + path);
  const int closed = MPI_File_close(&fh);
  if (closed != MPI_SUCCESS && error.empty()) error = mpi_error(closed, "closing " + path);
  return error;
}

// What rank 0 read of a checkpoint, the same on every rank.
struct Read {
  json::Value manifest;
  safetensors::Header header;
  Contents contents;
};

// At most `limit` bytes from the start of p (never more than it holds).
std::string read_file(const fs::path& p, int64_t limit) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw CheckpointError("cannot open " + p.string());
  std::string s;
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (!ec) limit = std::min<int64_t>(limit, static_cast<int64_t>(size));
  s.resize(static_cast<size_t>(limit));
  in.read(s.data(), limit);
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// `what`, beginning with "FILE: " unless it does already.
std::string naming(const std::string& file, const std::string& what) {
  return what.rfind(file + ":", 0) == 0 ? what : file + ": " + what;
}

// Rank 0 reads the manifest and the file's header; every rank parses
// them (so every rank raises the same error).
Read read_checkpoint(const std::string& dir) {
  // Rank 0's bytes travel as they are (they need not be valid UTF-8):
  // "!" and an error, or the file's size, the manifest and the header,
  // each after its length in 20 decimal digits.
  std::string sent;
  if (mpi::world_rank() == 0) {
    auto field = [](const std::string& v) {
      char n[21];
      std::snprintf(n, sizeof n, "%020zu", v.size());
      return std::string(n) + v;
    };
    try {
      const fs::path d(dir);
      if (!fs::is_directory(d)) throw CheckpointError("no such checkpoint directory");
      if (!fs::exists(d / kManifest)) throw CheckpointError("no " + std::string(kManifest));
      const std::string manifest = read_file(d / kManifest, 1 << 26);
      const fs::path data = d / kDataFile;
      if (!fs::exists(data)) throw CheckpointError("no " + std::string(kDataFile));
      const auto size = static_cast<int64_t>(fs::file_size(data));
      const std::string first8 = read_file(data, 8);
      const int64_t n = safetensors::header_length(first8, size, kDataFile);
      sent = field(std::to_string(size)) + field(manifest) + field(read_file(data, 8 + n).substr(8));
    } catch (const std::exception& e) {
      sent = "!" + std::string(e.what());
    }
  }
  const std::string got = mpi::allgather_strings(sent, mpi::world_comm())[0];
  Read r;
  try {
    if (!got.empty() && got[0] == '!') throw CheckpointError(got.substr(1));
    std::vector<std::string> fields;
    for (size_t at = 0; at < got.size() && fields.size() < 3;) {
      const size_t n = std::stoull(got.substr(at, 20));
      fields.push_back(got.substr(at + 20, n));
      at += 20 + n;
    }
    const int64_t size = std::stoll(fields.at(0));
    r.manifest = json::parse(fields.at(1), kManifest);
    const json::Value& m = r.manifest;
    if (!m.is_object() || m.value("format", "") != "partita checkpoint")
      throw CheckpointError(std::string(kManifest) + " is not a partita checkpoint's manifest");
    if (!m.contains("version") || !m["version"].is_number_integer() || m["version"].get<int64_t>() != kFormatVersion)
      throw CheckpointError(std::string(kManifest) + ": format version " + (m.contains("version") ? m["version"].dump() : "missing") +
                            "; this build reads version " + std::to_string(kFormatVersion) + " only");
    try {
      r.header = safetensors::parse_header(fields.at(2), size, kDataFile);
    } catch (const std::exception& e) {  // the data file's, whatever raised it
      throw CheckpointError(naming(kDataFile, e.what()));
    }
    // The manifest's tensors must be the file's.
    std::map<std::string, const safetensors::Entry*> in_file;
    for (const auto& e : r.header.tensors) in_file[e.name] = &e;
    std::set<std::string> listed;
    for (const auto& t : m.at("tensors")) {
      Contents::Tensor c{t.at("name").get<std::string>(), t.at("dtype").get<std::string>(), t.at("shape").get<Shape>()};
      const auto it = in_file.find(c.name);
      if (it == in_file.end())
        throw CheckpointError(std::string(kManifest) + " lists \"" + c.name + "\", which " + kDataFile + " does not hold");
      if (it->second->dtype != c.dtype || it->second->shape != c.shape)
        throw CheckpointError("\"" + c.name + "\" is " + c.dtype + " " + shape_string(c.shape) + " in " + kManifest +
                              " but " + it->second->dtype + " " + shape_string(it->second->shape) + " in " + kDataFile);
      listed.insert(c.name);
      r.contents.tensors.push_back(c);
    }
    for (const auto& e : r.header.tensors)
      if (!listed.count(e.name))
        throw CheckpointError(std::string(kDataFile) + " holds \"" + e.name + "\", which " + kManifest + " does not list");
    for (const auto& [k, v] : m.at("counters").items()) r.contents.info.counters[k] = v.get<int64_t>();
    r.contents.info.layout = m.value("layout", "");
    r.contents.saved_by = m.value("world_size", 0);
  } catch (const CheckpointError& e) {
    throw CheckpointError(dir + ": " + e.what());
  } catch (const std::exception& e) {
    // The manifest's: json::parse names it already; nlohmann's own errors
    // (a field missing or of another type) do not.
    throw CheckpointError(dir + ": " + naming(kManifest, e.what()));
  }
  return r;
}

// The tests of a rank lost in the middle of a save (docs/checkpoints.md,
// "Atomic"): PARTITA_CHECKPOINT_KILL="R:NAME" ends world rank R with
// SIGKILL as it is about to write its data of a checkpoint whose directory
// is named NAME (the others have made the temporary directory and wait).
void die_if_asked(const fs::path& dir) {
  const char* v = std::getenv("PARTITA_CHECKPOINT_KILL");
  if (!v) return;
  const std::string s(v);
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return;
  if (std::to_string(mpi::world_rank()) == s.substr(0, colon) && dir.filename() == s.substr(colon + 1)) std::raise(SIGKILL);
}

// The temporary directories of saves of `final_dir`: DIR.partial-HOST-PID,
// HOST and PID being those of the saving job's rank 0. Each save has its own,
// so two saves of one name at once (two jobs) never write into one
// directory; the first to rename wins and the other raises.
const char kPartial[] = ".partial-";

std::string host_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

fs::path temporary_dir(const fs::path& final_dir) {
  return final_dir.string() + kPartial + host_name() + "-" + std::to_string(getpid());
}

// Removes the temporary directories of earlier saves of `final_dir` whose
// rank 0 ran on this host and is gone (a job killed in the middle of a
// save). Another host's, or a living process's, are left alone: they may be
// a save in progress.
void sweep_dead_saves(const fs::path& final_dir) {
  const fs::path parent = final_dir.has_parent_path() ? final_dir.parent_path() : fs::path(".");
  const std::string prefix = final_dir.filename().string() + kPartial + host_name() + "-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

Shard whole(std::string name, const at::Tensor& t) {
  return Shard{std::move(name), t, Shape(t.sizes().begin(), t.sizes().end()), Shape(static_cast<size_t>(t.dim()), 0)};
}

Shard block(std::string name, const at::Tensor& local, const Shape& global, const mpi::Partition& P) {
  Shard s{std::move(name), local, global, Shape(global.size(), 0)};
  if (P.is_null() || !P.active()) {
    s.local = at::Tensor();
    return s;
  }
  if (P.shape().size() > global.size())  // as partita::distribute refuses it
    throw CheckpointError("\"" + s.name + "\": the partition " + shape_string(P.shape()) + " has more dimensions than the " +
                          std::to_string(global.size()) + "-dimensional global shape " + shape_string(global));
  const Shape grid = padded_shape(P.shape(), global.size());
  const Index at_ = unravel(P.rank(), grid);
  for (size_t d = 0; d < global.size(); ++d) s.start[d] = local_start(global[d], grid[d], at_[d]);
  return s;
}

void save(const std::string& dir_in, const std::vector<Shard>& shards, const Info& info) {
  const std::string dir = clean(dir_in);
  std::map<std::string, int64_t> counters = info.counters;
  const std::vector<Piece> pieces = gather_pieces(shards, &counters, dir);

  // The global tensors: each name's dtype and shape, and who writes what.
  struct Global {
    std::string dtype;
    Shape shape;
    std::vector<const Piece*> boxes;  // distinct, each written by its lowest holder
  };
  std::map<std::string, Global> globals;
  for (const Piece& p : pieces) {
    auto [it, fresh] = globals.try_emplace(p.name, Global{p.dtype, p.global, {}});
    Global& g = it->second;
    if (!fresh && (g.dtype != p.dtype || g.shape != p.global))
      throw CheckpointError(dir + ": \"" + p.name + "\" is " + g.dtype + " " + shape_string(g.shape) + " on one rank and " +
                            p.dtype + " " + shape_string(p.global) + " on rank " + std::to_string(p.rank));
    if (!p.holds()) continue;
    bool same = false;
    for (const Piece* q : g.boxes) {
      if (q->start == p.start && q->len == p.len) {
        same = true;
        break;
      }
      if (!intersect(Box{q->start, q->len}, Box{p.start, p.len}).empty())
        throw CheckpointError(dir + ": \"" + p.name + "\": rank " + std::to_string(q->rank) + "'s piece " +
                              box_string(Box{q->start, q->len}) + " and rank " + std::to_string(p.rank) + "'s " +
                              box_string(Box{p.start, p.len}) + " overlap without being the same piece");
    }
    if (!same) g.boxes.push_back(&p);
  }
  std::vector<safetensors::Entry> entries;
  for (auto& [name, g] : globals) {
    int64_t covered = 0;
    for (const Piece* q : g.boxes) covered += volume(q->len);
    if (covered != volume(g.shape))
      throw CheckpointError(dir + ": \"" + name + "\": the pieces cover " + std::to_string(covered) + " of the " +
                            std::to_string(volume(g.shape)) + " elements of " + shape_string(g.shape));
    entries.push_back(safetensors::Entry{name, g.dtype, g.shape, 0, 0});
  }
  const std::string prefix = safetensors::format_header(entries, {{"format", "pt"}, {"partita_checkpoint", std::to_string(kFormatVersion)}});
  const int64_t data_start = static_cast<int64_t>(prefix.size());
  // (Every rank computes the same header: every rank refuses alike.)
  if (data_start - 8 > safetensors::kMaxHeaderBytes)
    throw CheckpointError(dir + ": the header would hold " + std::to_string(data_start - 8) + " bytes, above the " +
                          std::to_string(safetensors::kMaxHeaderBytes) +
                          " a load reads (fewer tensors, or shorter names); nothing was written");

  // The directory, under this save's temporary name (rank 0's, sent to
  // every rank with the verdict: "!" and the error, or the name).
  const fs::path final_dir(dir);
  fs::path partial;
  std::string sent;
  if (mpi::world_rank() == 0) {
    bool made = false;  // rank 0 made `partial`
    try {
      if (fs::exists(final_dir)) throw CheckpointError("already exists (a checkpoint is never overwritten)");
      sweep_dead_saves(final_dir);
      partial = temporary_dir(final_dir);
      if (final_dir.has_parent_path()) fs::create_directories(final_dir.parent_path());
      // Only this process can own this name; one left by an earlier job
      // whose rank 0 had this process's number is not a save in progress.
      fs::remove_all(partial);
      if (!fs::create_directory(partial)) throw CheckpointError("cannot make " + partial.string());
      made = true;
      std::ofstream out(partial / kDataFile, std::ios::binary);
      out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
      out.close();
      if (!out) throw CheckpointError("cannot write " + (partial / kDataFile).string());
      sent = partial.string();
    } catch (const std::exception& e) {
      sent = std::string("!") + e.what();
      std::error_code ignored;
      if (made) fs::remove_all(partial, ignored);
    }
  }
  {
    const std::string got = mpi::allgather_strings(sent, mpi::world_comm())[0];
    if (got.empty() || got[0] == '!') throw CheckpointError(dir + ": rank 0: " + (got.empty() ? "no temporary directory" : got.substr(1)));
    partial = got;
  }
  std::string error;

  // From here on, a failure removes the temporary directory: the disk
  // holds what it held before the save (and a temporary directory only
  // where a rank died).
  try {
    // Each rank's pieces that it writes.
    std::map<std::string, int64_t> offset_of;
    for (const auto& e : entries) offset_of[e.name] = data_start + e.begin;
    std::vector<Span> mine;
    const int me = mpi::world_rank();
    std::vector<at::Tensor> keep;  // contiguous copies of non-contiguous pieces
    std::string local_error;       // a copy that failed on this rank alone
    try {
      for (const Shard& s : shards) {
        if (!s.local.defined() || s.local.numel() == 0) continue;
        const Global& g = globals.at(s.name);
        bool writer = false;
        for (const Piece* q : g.boxes) writer |= q->rank == me && q->start == s.start;
        if (!writer) continue;
        keep.push_back(s.local.detach().contiguous());
        mine.push_back(Span{offset_of.at(s.name), static_cast<int64_t>(keep.back().element_size()), g.shape, s.start,
                            Shape(s.local.sizes().begin(), s.local.sizes().end()), keep.back().data_ptr()});
      }
    } catch (const std::exception& e) {
      local_error = e.what();
    }
    agree(local_error, dir);
    die_if_asked(final_dir);
    agree(move_data((partial / kDataFile).string(), mine, /*write=*/true, dir), dir);

    // The manifest, then one rename makes the checkpoint visible.
    if (me == 0) {
      try {
        json::Value m = json::Value::object();
        m["format"] = "partita checkpoint";
        m["version"] = kFormatVersion;
        m["file"] = kDataFile;
        m["world_size"] = mpi::world_size();
        m["layout"] = info.layout;
        m["counters"] = json::Value::object();
        for (const auto& [k, v] : counters) m["counters"][k] = v;
        m["tensors"] = json::Value::array();
        for (const auto& e : entries) m["tensors"].push_back({{"name", e.name}, {"dtype", e.dtype}, {"shape", e.shape}});
        {
          std::ofstream out(partial / kManifest);
          out << m.dump(1) << "\n";
          out.close();
          if (!out) throw CheckpointError("cannot write " + (partial / kManifest).string());
        }
        fsync_path(partial / kManifest);
        fsync_path(partial);
        // Not over anything there: a save of the same name by another job
        // that finished first, or a directory made empty meanwhile, stays
        // (an empty one only where the file system has RENAME_NOREPLACE).
        if (const int rc = rename_no_replace(partial, final_dir))
          throw CheckpointError(rc == EEXIST || rc == ENOTEMPTY || fs::exists(final_dir)
                                    ? "already exists: another save of it finished first (a checkpoint is never overwritten)"
                                    : "renaming " + partial.string() + ": " + std::strerror(rc));
        const fs::path parent = final_dir.has_parent_path() ? final_dir.parent_path() : fs::path(".");
        fsync_path(parent);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    agree(error, dir);
  } catch (...) {
    if (mpi::world_rank() == 0) {
      std::error_code ignored;
      fs::remove_all(partial, ignored);
    }
    throw;
  }
}

Contents contents(const std::string& dir) { return read_checkpoint(clean(dir)).contents; }

Info load(const std::string& dir_in, const std::vector<Shard>& shards, const LoadOptions& options) {
  const std::string dir = clean(dir_in);
  const Read r = read_checkpoint(dir);
  const std::vector<Piece> pieces = gather_pieces(shards, nullptr, dir);
  std::map<std::string, const safetensors::Entry*> in_file;
  for (const auto& e : r.header.tensors) in_file[e.name] = &e;
  std::set<std::string> asked;
  for (const Piece& p : pieces) {
    const std::string what = dir + ": \"" + p.name + "\"";
    const auto it = in_file.find(p.name);
    if (it == in_file.end())
      throw CheckpointError(what + " (asked for by rank " + std::to_string(p.rank) + ") is not in the checkpoint");
    const safetensors::Entry& e = *it->second;
    if (e.dtype != p.dtype)
      throw CheckpointError(what + " is " + e.dtype + " in the checkpoint, " + p.dtype + " on rank " +
                            std::to_string(p.rank) + " (a checkpoint is never cast)");
    if (e.shape != p.global)
      throw CheckpointError(what + " has the global shape " + shape_string(e.shape) + " in the checkpoint, " +
                            shape_string(p.global) + " on rank " + std::to_string(p.rank));
    asked.insert(p.name);
  }
  if (!options.partial)
    for (const auto& e : r.header.tensors)
      if (!asked.count(e.name) &&
          (options.unread_prefix.empty() || e.name.compare(0, options.unread_prefix.size(), options.unread_prefix) != 0))
        throw CheckpointError(dir + ": the checkpoint holds \"" + e.name +
                              "\", which no rank asked for");

  std::vector<Span> mine;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (staging, destination)
  std::string local_error;  // a staging tensor that failed on this rank alone
  try {
    for (const Shard& s : shards) {
      if (!s.local.defined() || s.local.numel() == 0) continue;
      const safetensors::Entry& e = *in_file.at(s.name);
      at::Tensor into = s.local;
      // (A stride of 0, as expand makes: the staged copy could not be
      // written back, on this rank alone, after the read.)
      if (at::has_internal_overlap(into) == at::MemOverlap::Yes)
        throw CheckpointError("\"" + s.name + "\": the tensor to load into has elements that overlap in memory " +
                              "(a stride of 0, as expand makes); load into a tensor of distinct elements");
      if (!into.is_contiguous()) {
        into = at::empty(s.local.sizes(), s.local.options().requires_grad(false));
        copy_back.emplace_back(into, s.local);
      }
      mine.push_back(Span{r.header.data_start + e.begin, static_cast<int64_t>(into.element_size()), e.shape, s.start,
                          Shape(s.local.sizes().begin(), s.local.sizes().end()), into.data_ptr()});
    }
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  agree(local_error, dir);
  agree(move_data((fs::path(dir) / kDataFile).string(), mine, /*write=*/false, dir), dir);
  at::NoGradGuard no_grad;
  for (auto& [staging, destination] : copy_back) destination.copy_(staging);
  return r.contents.info;
}

}  // namespace partita::checkpoint
