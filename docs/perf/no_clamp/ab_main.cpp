// Alternates the two header versions' passes (ab_pass.cpp) in one process and prints the least and
// median ns per element of each, and whether they wrote the same bytes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
extern "C" double run_old(const char*, int, std::vector<unsigned char>*);
extern "C" double run_new(const char*, int, std::vector<unsigned char>*);
extern "C" double run_old_enc(const char*, int, std::vector<unsigned char>*);
extern "C" double run_new_enc(const char*, int, std::vector<unsigned char>*);
extern "C" double run_old_ct(const char*, int, std::vector<unsigned char>*);
extern "C" double run_new_ct(const char*, int, std::vector<unsigned char>*);
int main(int argc, char** argv) {
  const char* f = argc > 1 ? argv[1] : "int4";
  int which = argc > 2 ? std::atoi(argv[2]) : 0;
  int n = argc > 3 ? std::atoi(argv[3]) : 10;
  const bool enc = argc > 4;
  const bool ct = std::string(f) == "ct";
  auto fo = ct ? run_old_ct : enc ? run_old_enc : run_old; auto fn = ct ? run_new_ct : enc ? run_new_enc : run_new;
  std::vector<double> a, b;
  std::vector<unsigned char> oa, ob;
  for (int i = 0; i < n; ++i) { a.push_back(fo(f, which, &oa)); b.push_back(fn(f, which, &ob)); }
  std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
  std::printf("%s%s %s old min %.3f med %.3f | new min %.3f med %.3f | new/old med %.3f | same bytes: %s\n", enc ? "encode " : "reduce ", f, which ? "avx2" : "avx512",
              a[0], a[n / 2], b[0], b[n / 2], b[n / 2] / a[n / 2], oa == ob ? "yes" : "NO");
}
