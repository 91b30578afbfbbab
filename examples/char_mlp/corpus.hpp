// SPDX-License-Identifier: Apache-2.0
#pragma once

// Text for the demo, turned into character ids: by default the fortune
// cookies of Debian's `fortunes` package (about 2.5 MB of human-written
// English in topic files); any text file; or a built-in synthetic corpus
// (sentences from a small grammar with subject/verb/place preferences, so
// context helps predict the next character), which is also the fallback
// where the fortunes are not installed.

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace char_mlp {

// SplitMix64: a small, well-mixed generator; the demo's sampling is a pure
// function of (seed, step, index) so every method sees the same data.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline std::string synthetic_corpus(std::size_t chars, std::uint64_t seed) {
  static const std::array<const char*, 12> subjects{
      "the cat",     "a dog",      "the old man", "my sister",   "the baker",  "a small bird",
      "the farmer",  "our neighbor", "the queen", "a tired child", "the doctor", "his uncle"};
  static const std::array<const char*, 12> verbs{"sees",    "likes",   "chases",  "finds",  "watches", "helps",
                                                 "calls",   "follows", "paints",  "forgets", "carries", "brings"};
  static const std::array<const char*, 12> adjectives{"red",  "quiet", "broken", "golden", "heavy", "little",
                                                      "wet",  "bright", "strange", "green", "warm",  "empty"};
  static const std::array<const char*, 12> objects{"mouse", "ball",  "river", "friend", "market", "letter",
                                                   "moon",  "hat",   "bread", "window", "basket", "song"};
  static const std::array<const char*, 9> places{" in the garden", " at the market", " near the river",
                                                 " on the hill",   " by the door",   " after the rain",
                                                 " every morning", " at night",      ""};
  std::string out;
  out.reserve(chars + 128);
  std::uint64_t state = seed;
  auto next = [&](std::uint64_t n) { return (state = mix(state)) % n; };
  while (out.size() < chars) {
    const auto s = next(subjects.size());
    // Each subject prefers four verbs, each verb three objects and two
    // places, each object two adjectives: structure a model with context
    // can learn, with enough choice left to keep the entropy well above 0.
    const auto v = (s + next(4) * 3) % verbs.size();
    const auto o = (v * 5 + next(3)) % objects.size();
    const auto a = (o * 7 + next(2)) % adjectives.size();
    const auto p = next(3) == 0 ? places.size() - 1 : (v + next(2) * 4) % (places.size() - 1);
    out += subjects[s];
    out += ' ';
    out += verbs[v];
    out += next(2) == 0 ? " the " : " a ";
    if (next(3) != 0) {
      out += adjectives[a];
      out += ' ';
    }
    out += objects[o];
    out += places[p];
    out += next(6) == 0 ? "! " : ". ";
  }
  out.resize(chars);
  return out;
}

// A part of the training text that came from one source file.
struct text_file {
  std::string name;
  std::size_t begin = 0, end = 0;  // [begin, end) of dataset::train
};

// Character ids over a vocabulary built from the text.
struct dataset {
  std::vector<char> alphabet;
  std::vector<std::uint8_t> train, held_out;
  std::vector<text_file> files;  // the fortunes' topic files in `train`; empty for other corpora
  std::string source;    // what the text is, for the demo's header
  std::string fallback;  // why the synthetic corpus stands in for the fortunes; empty when it does not

  int vocab() const { return static_cast<int>(alphabet.size()); }
};

inline dataset make_dataset(const std::string& train_text, const std::string& held_out_text) {
  std::map<char, std::uint8_t> ids;
  for (char c : train_text + held_out_text) ids.emplace(c, 0);
  if (ids.size() > 255) throw std::runtime_error("corpus has more than 255 distinct bytes");
  dataset d;
  for (auto& [c, id] : ids) {
    id = static_cast<std::uint8_t>(d.alphabet.size());
    d.alphabet.push_back(c);
  }
  for (char c : train_text) d.train.push_back(ids[c]);
  for (char c : held_out_text) d.held_out.push_back(ids[c]);
  return d;
}

// The built-in corpus: training and held-out text from different seeds.
inline dataset synthetic_dataset(std::size_t train_chars, std::uint64_t seed) {
  auto d = make_dataset(synthetic_corpus(train_chars, seed), synthetic_corpus(train_chars / 8, seed ^ 0x5eedULL));
  d.source = "built-in synthetic";
  return d;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open corpus file '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A text file: the first 90% trains, the last 10% is held out.
inline dataset file_dataset(const std::string& path) {
  const std::string text = read_file(path);
  if (text.size() < 1000) throw std::runtime_error("corpus file '" + path + "' is too short (need 1000+ bytes)");
  const std::size_t cut = text.size() * 9 / 10;
  auto d = make_dataset(text.substr(0, cut), text.substr(cut));
  d.source = path + " (last 10% held out)";
  return d;
}

// Where Debian's `fortunes` package puts its topic files.
inline constexpr const char* default_fortunes_dir = "/usr/share/games/fortunes";

// One fortune file as plain text: the `%` lines between fortunes become
// blank lines; a backspace overstrike (nroff's "_\bX" underlining) keeps the
// character written last; tabs become spaces; other control bytes and the
// few non-ASCII bytes are dropped. What is left is printable ASCII and
// newlines, a vocabulary of under 100 symbols.
inline std::string clean_fortune_text(const std::string& raw) {
  std::string out;
  out.reserve(raw.size());
  std::size_t line_start = 0;  // in `out`
  for (const char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      if (out.size() == line_start + 1 && out[line_start] == '%') out.pop_back();  // a separator line
      out += '\n';
      line_start = out.size();
    } else if (c == '\b') {
      if (out.size() > line_start) out.pop_back();
    } else if (c == '\t') {
      out += ' ';
    } else if (c >= 32 && c < 127) {
      out += ch;
    }
  }
  return out;
}

// The topic files of a fortunes directory (regular files only: not the
// .dat indexes, the .u8 symlinks or the off/ directory), in name order.
inline std::vector<std::filesystem::path> fortune_files(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_regular_file(status) && it->path().extension() != ".dat") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The fortunes as a dataset: the last `held_out_fraction` of every topic
// file's characters (from the next line start) is held out, the rest
// trains, so both halves cover every topic. Returns an empty dataset with
// `fallback` saying why when the directory holds no usable text.
inline dataset fortunes_dataset(const std::string& dir, double held_out_fraction = 0.1) {
  dataset empty;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    empty.fallback = dir + " not found (Debian's `fortunes` package is not installed)";
    return empty;
  }
  const auto files = fortune_files(dir);
  std::string train, held_out;
  std::vector<text_file> parts;
  for (const auto& f : files) {
    const std::string text = clean_fortune_text(read_file(f));
    const auto tail = static_cast<std::size_t>(static_cast<double>(text.size()) * held_out_fraction);
    const std::size_t eol = text.find('\n', text.size() - tail);
    const std::size_t cut = eol == std::string::npos ? text.size() : eol + 1;
    parts.push_back({f.filename().string(), train.size(), train.size() + cut});
    train.append(text, 0, cut);
    held_out.append(text, cut);
  }
  if (train.size() < 10000 || held_out.size() < 1000) {
    empty.fallback = dir + " holds too little text (" + std::to_string(files.size()) + " topic files, " +
                     std::to_string(train.size() + held_out.size()) + " characters)";
    return empty;
  }
  auto d = make_dataset(train, held_out);
  d.files = std::move(parts);
  d.source = "Debian fortunes, " + std::to_string(files.size()) + " topic files in " + dir +
             " (last " + std::to_string(static_cast<int>(held_out_fraction * 100 + 0.5)) + "% of each held out)";
  return d;
}

}  // namespace char_mlp
