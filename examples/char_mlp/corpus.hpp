#pragma once

// Text for the demo: a built-in synthetic corpus (sentences from a small
// grammar with subject/verb/place preferences, so context helps predict the
// next character) or any text file, turned into character ids.

#include <array>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
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

// Character ids over a vocabulary built from the text.
struct dataset {
  std::vector<char> alphabet;
  std::vector<std::uint8_t> train, held_out;

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
  return make_dataset(synthetic_corpus(train_chars, seed), synthetic_corpus(train_chars / 8, seed ^ 0x5eedULL));
}

// A text file: the first 90% trains, the last 10% is held out.
inline dataset file_dataset(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open corpus file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.size() < 1000) throw std::runtime_error("corpus file '" + path + "' is too short (need 1000+ bytes)");
  const std::size_t cut = text.size() * 9 / 10;
  return make_dataset(text.substr(0, cut), text.substr(cut));
}

}  // namespace char_mlp
