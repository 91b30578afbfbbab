// SPDX-License-Identifier: Apache-2.0
#pragma once

// Real processes for the multi-process communicator tests: copies of the
// running test binary started with environment variables (the ranks of a
// world), a private temporary directory, and a throwaway redis-server.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace harness {

using clock = std::chrono::steady_clock;

inline double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class temp_dir {
 public:
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "diloco-test-XXXXXX").string();
    if (mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::filesystem::rename(tmp, path);  // readers never see half a file
}

// Starts argv[0] with this process's environment plus `env` ("NAME=VALUE",
// overriding variables of the same name).
inline pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s(*e);
    merged[s.substr(0, s.find('='))] = s;
  }
  for (const auto& s : env) merged[s.substr(0, s.find('='))] = s;
  std::vector<std::string> env_strings;
  for (auto& [name, s] : merged) env_strings.push_back(s);
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env_strings) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, a.data(), e.data()) != 0)
    throw std::runtime_error("posix_spawn failed for " + argv[0]);
  return pid;
}

inline std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

struct exit_status {
  bool done = false;     // reaped
  bool exited = false;   // exited normally (code valid)
  int code = -1;
  int signal = 0;        // the signal that ended it, if any
  bool timed_out = false;  // still running at the deadline, killed by us
  clock::time_point at{};
};

// Child processes, reaped by wait_all or, at the latest, the destructor.
class processes {
 public:
  processes() = default;
  processes(const processes&) = delete;
  processes& operator=(const processes&) = delete;
  ~processes() {
    for (auto& p : procs_)
      if (!p.status.done) {
        ::kill(p.pid, SIGKILL);
        int st = 0;
        waitpid(p.pid, &st, 0);
      }
  }

  // Starts a copy of this test binary; returns its index.
  std::size_t start(const std::vector<std::string>& env) {
    procs_.push_back({spawn({self_exe()}, env), {}});
    return procs_.size() - 1;
  }

  void kill(std::size_t i, int sig = SIGKILL) { ::kill(procs_[i].pid, sig); }
  pid_t pid(std::size_t i) const { return procs_[i].pid; }

  // Polls until all have ended; the ones still running after `limit` are
  // killed and marked timed_out.
  void wait_all(std::chrono::milliseconds limit) {
    const auto deadline = clock::now() + limit;
    for (;;) {
      bool running = false;
      for (auto& p : procs_) {
        if (p.status.done) continue;
        int st = 0;
        const pid_t r = waitpid(p.pid, &st, WNOHANG);
        if (r == p.pid) {
          record(p, st);
        } else {
          running = true;
        }
      }
      if (!running) return;
      if (clock::now() >= deadline) {
        for (auto& p : procs_) {
          if (p.status.done) continue;
          ::kill(p.pid, SIGKILL);
          int st = 0;
          waitpid(p.pid, &st, 0);
          record(p, st);
          p.status.timed_out = true;
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  const exit_status& status(std::size_t i) const { return procs_[i].status; }
  std::size_t count() const { return procs_.size(); }

 private:
  struct proc {
    pid_t pid;
    exit_status status;
  };
  static void record(proc& p, int st) {
    p.status.done = true;
    p.status.at = clock::now();
    if (WIFEXITED(st)) {
      p.status.exited = true;
      p.status.code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      p.status.signal = WTERMSIG(st);
    }
  }
  std::vector<proc> procs_;
};

// The state letter of /proc/<pid>/stat (R, S, T for stopped, Z for a
// zombie); 'Z' when the process is gone. processes::wait_all reaps.
inline char proc_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || stat.size() < close + 3 ? 'Z' : stat[close + 2];
}

// Waits until `pred` holds or `limit` passes; whether it held.
template <class Pred>
bool wait_for(Pred pred, std::chrono::milliseconds limit) {
  const auto until = clock::now() + limit;
  while (!pred()) {
    if (clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// An environment variable of a rank program, or `fallback` when unset.
inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline std::string describe(const exit_status& s) {
  if (s.timed_out) return "still running at the deadline (killed)";
  if (s.exited) return "exited with code " + std::to_string(s.code);
  return "killed by signal " + std::to_string(s.signal);
}

// A TCP port nothing listens on right now.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("cannot find a free port");
  close(fd);
  return ntohs(a.sin_port);
}

inline bool accepts_connections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

inline std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(std::string(path ? path : "") + ":/usr/bin:/usr/sbin:/usr/local/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

// redis-server on a free loopback port, without persistence, stopped by
// the destructor. available() is false when redis-server is not installed.
class redis_server {
 public:
  redis_server() {
    const std::string bin = find_program("redis-server");
    if (bin.empty()) return;
    port_ = free_port();
    pid_ = spawn({bin, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                  "--dir", dir_.path().string(), "--loglevel", "warning"},
                 {});
    const auto deadline = clock::now() + std::chrono::seconds(10);
    while (!accepts_connections(port_)) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) throw std::runtime_error("redis-server exited at startup");
      if (clock::now() > deadline) throw std::runtime_error("redis-server did not start within 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;
  ~redis_server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);  // a stopped server would not take SIGTERM
      ::kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  bool available() const { return pid_ > 0; }
  void signal(int sig) const { ::kill(pid_, sig); }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  temp_dir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace harness
