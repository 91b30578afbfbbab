// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the training text is split over the workers (--shards):
//   iid      every worker draws from the whole text: sample `id` starts at
//            a position that is a function of (seed, id) only, so the split
//            over workers does not change the data (the demo's default);
//   by-file  every worker draws only from its own topic files of the
//            fortunes (whole files, balanced by size: the largest first to
//            the worker with the least text), so workers see different
//            kinds of text: the non-iid case DiLoCo's papers warn about.
//            Corpora without topic files are cut into equal contiguous
//            chunks instead.
// A sample is a window of `window` characters (the context and its target)
// that lies within one file.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <diloco/core/error.hpp>

#include "corpus.hpp"

namespace char_mlp {

enum class shard_mode { iid, by_file };

inline const std::vector<std::string> shard_mode_names{"iid", "by-file"};

inline const char* name_of(shard_mode m) { return m == shard_mode::iid ? "iid" : "by-file"; }

inline shard_mode parse_shard_mode(const std::string& s) {
  if (s == "iid") return shard_mode::iid;
  if (s == "by-file") return shard_mode::by_file;
  throw diloco::config_error("unknown shard mode '" + s + "' (expected iid or by-file)");
}

class shard_plan {
 public:
  shard_plan(const dataset& d, shard_mode mode, int workers, std::size_t window) : mode_(mode) {
    if (d.train.size() < window) throw diloco::config_error("shards: the training text is shorter than one sample");
    iid_starts_ = d.train.size() - window + 1;
    if (mode == shard_mode::iid) return;
    if (workers < 1) throw diloco::config_error("shards: need at least one worker");
    std::vector<text_file> files = d.files;
    if (files.empty()) {  // no topic files: equal contiguous chunks
      for (int w = 0; w < workers; ++w)
        files.push_back({"chunk " + std::to_string(w), d.train.size() * static_cast<std::size_t>(w) / workers,
                         d.train.size() * static_cast<std::size_t>(w + 1) / workers});
    }
    if (files.size() < static_cast<std::size_t>(workers))
      throw diloco::config_error("--shards by-file: " + std::to_string(files.size()) + " topic files for " +
                                  std::to_string(workers) + " workers (need at least one file per worker)");
    // Largest file first, to the worker with the least text so far.
    std::vector<std::size_t> order(files.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return files[a].end - files[a].begin > files[b].end - files[b].begin;
    });
    shards_.resize(static_cast<std::size_t>(workers));
    for (const std::size_t f : order) {
      auto& least = *std::min_element(shards_.begin(), shards_.end(),
                                      [](const shard& a, const shard& b) { return a.chars < b.chars; });
      least.files.push_back(files[f]);
      least.chars += files[f].end - files[f].begin;
    }
    for (std::size_t w = 0; w < shards_.size(); ++w) {
      auto& s = shards_[w];
      std::sort(s.files.begin(), s.files.end(), [](const text_file& a, const text_file& b) { return a.begin < b.begin; });
      for (const auto& f : s.files) {
        const std::size_t len = f.end - f.begin;
        s.cumulative.push_back(s.starts += len >= window ? len - window + 1 : 0);
      }
      if (s.starts == 0)
        throw diloco::config_error("--shards by-file: worker " + std::to_string(w) +
                                    "'s files are all shorter than one sample");
    }
  }

  shard_mode mode() const { return mode_; }

  // The first character of sample `id` of worker `w`.
  std::size_t position(int w, std::uint64_t id, std::uint64_t seed) const {
    const std::uint64_t draw = mix(seed ^ mix(id));
    if (mode_ == shard_mode::iid) return static_cast<std::size_t>(draw % iid_starts_);
    const auto& s = shards_[static_cast<std::size_t>(w) % shards_.size()];
    std::size_t u = static_cast<std::size_t>(draw % s.starts);
    const auto f = static_cast<std::size_t>(std::upper_bound(s.cumulative.begin(), s.cumulative.end(), u) -
                                            s.cumulative.begin());
    if (f > 0) u -= s.cumulative[f - 1];
    return s.files[f].begin + u;
  }

  // One line per worker: its characters and files (by-file), or one line (iid).
  std::string describe() const {
    if (mode_ == shard_mode::iid) return "shards: iid (every worker samples the whole training text)\n";
    std::string out = "shards: by-file (each worker samples its own topic files only)\n";
    for (std::size_t w = 0; w < shards_.size(); ++w) {
      out += "  worker " + std::to_string(w) + ": " + std::to_string(shards_[w].chars) + " characters:";
      for (const auto& f : shards_[w].files) out += " " + f.name;
      out += "\n";
    }
    return out;
  }

 private:
  struct shard {
    std::vector<text_file> files;
    std::vector<std::size_t> cumulative;  // sample starts in files [0, i]
    std::size_t starts = 0, chars = 0;
  };
  shard_mode mode_;
  std::size_t iid_starts_ = 0;
  std::vector<shard> shards_;
};

}  // namespace char_mlp
