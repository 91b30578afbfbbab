// SPDX-License-Identifier: Apache-2.0
#pragma once

// Checkpoint files on disk. A write never leaves `path` half written: the
// bytes go to a temporary file in the same directory ("<path>.tmp.<pid>.<n>"),
// which is fsynced, then renamed over `path`, and the directory is fsynced so
// the rename itself survives a power loss. A crash at any point leaves
// either the previous checkpoint or the new one at `path` (and perhaps a
// stray temporary, which nothing reads). A read takes the whole file into
// memory, so it is validated before anything is restored.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/core/error.hpp"

#if defined(_WIN32)
#include <cstdio>
#include <filesystem>
#include <fstream>
#else
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace diloco::checkpoint {

namespace detail {

inline std::string errno_text(int e) { return std::strerror(e); }

inline std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

inline std::string temporary_name(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
#if defined(_WIN32)
  const long long pid = 0;
#else
  const long long pid = static_cast<long long>(::getpid());
#endif
  return diloco::detail::concat(path, ".tmp.", pid, ".", counter.fetch_add(1));
}

}  // namespace detail

#if defined(_WIN32)

inline std::string stage_file(const std::string& path, std::span<const std::byte> bytes) {
  const std::string temp = detail::temporary_name(path);
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  if (!out) {
    std::remove(temp.c_str());
    diloco::detail::raise<error>("checkpoint: cannot write the temporary file ", temp);
  }
  return temp;
}
inline void commit_file(const std::string& temp, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) diloco::detail::raise<error>("checkpoint: cannot rename ", temp, " to ", path, ": ", ec.message());
}
inline std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) diloco::detail::raise<error>("checkpoint: cannot open ", path);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

#else

/// Writes `bytes` to a new temporary file next to `path` and fsyncs it;
/// returns its name. commit_file() then puts it in place. (Two steps so a
/// test can stop between them, as a crash would.)
inline std::string stage_file(const std::string& path, std::span<const std::byte> bytes) {
  const std::string temp = detail::temporary_name(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    diloco::detail::raise<error>("checkpoint: cannot create the temporary file ", temp, ": ", detail::errno_text(e));
  }
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    diloco::detail::raise<error>("checkpoint: ", what, " ", temp, " failed: ", detail::errno_text(e));
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("writing");
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) fail("fsync of");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    diloco::detail::raise<error>("checkpoint: closing ", temp, " failed: ", detail::errno_text(e));
  }
  return temp;
}

/// Renames the staged file over `path` and fsyncs the directory.
inline void commit_file(const std::string& temp, const std::string& path) {
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    diloco::detail::raise<error>("checkpoint: cannot rename ", temp, " to ", path, ": ", detail::errno_text(e));
  }
  const std::string dir = detail::directory_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int e = errno;
    diloco::detail::raise<error>("checkpoint: cannot open directory ", dir, " to fsync the rename: ",
                                 detail::errno_text(e));
  }
  const int r = ::fsync(dfd);
  const int e = errno;
  ::close(dfd);
  if (r != 0) diloco::detail::raise<error>("checkpoint: fsync of directory ", dir, " failed: ", detail::errno_text(e));
}

/// The whole file in memory.
inline std::vector<std::byte> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    diloco::detail::raise<error>("checkpoint: cannot open ", path, ": ", detail::errno_text(e));
  }
  std::vector<std::byte> out;
  struct ::stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  std::byte chunk[1 << 16];
  for (;;) {
    const ::ssize_t r = ::read(fd, chunk, sizeof chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      diloco::detail::raise<error>("checkpoint: reading ", path, " failed: ", detail::errno_text(e));
    }
    if (r == 0) break;
    out.insert(out.end(), chunk, chunk + r);
  }
  ::close(fd);
  return out;
}

#endif

/// stage_file + commit_file: `path` holds the old bytes or the new ones,
/// never a mixture.
inline void write_file(const std::string& path, std::span<const std::byte> bytes) {
  commit_file(stage_file(path, bytes), path);
}

/// The rounds n of the `round-<n>.ckpt` files in `folder`, as
/// algorithm::save_round names them (none when the folder does not exist);
/// other names (temporaries of a save) are skipped. Unordered.
inline std::vector<std::uint64_t> saved_rounds(const std::filesystem::path& folder) {
  std::vector<std::uint64_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view head = "round-", tail = ".ckpt";
    if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back(std::stoull(digits));
  }
  return out;
}

namespace detail {

// A list of rounds as the text ranks exchange ("2 4 6"; empty for none),
// and back (sorted).
inline std::string rounds_text(const std::vector<std::uint64_t>& rounds) {
  std::string out;
  for (std::uint64_t n : rounds) {
    if (!out.empty()) out += ' ';
    out += std::to_string(n);
  }
  return out;
}

inline std::vector<std::uint64_t> parse_rounds(const std::string& text) {
  std::vector<std::uint64_t> list;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = std::min(text.find(' ', pos), text.size());
    list.push_back(std::stoull(text.substr(pos, end - pos)));
    pos = end + 1;
  }
  std::sort(list.begin(), list.end());
  return list;
}

// The rounds every list (rounds_text) holds, sorted.
inline std::vector<std::uint64_t> common_rounds(const std::vector<std::string>& texts) {
  std::vector<std::uint64_t> common = parse_rounds(texts.at(0));
  for (const std::string& text : texts) {
    const std::vector<std::uint64_t> list = parse_rounds(text);
    std::vector<std::uint64_t> both;
    std::set_intersection(common.begin(), common.end(), list.begin(), list.end(), std::back_inserter(both));
    common = std::move(both);
  }
  return common;
}

}  // namespace detail

}  // namespace diloco::checkpoint
