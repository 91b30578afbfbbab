// SPDX-License-Identifier: Apache-2.0
// Compiled with -std=c++17 and -DHEADER=<diloco/...>: each header a user
// includes directly must stop the compiler at once with one message saying
// that diloco needs C++20 (core/require_cxx20.hpp), not hundreds of errors.
#include HEADER

int main() { return 0; }
