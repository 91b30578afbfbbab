// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: `mute` cannot all-reduce, so it is not a
// diloco::communicator.
#include <diloco/diloco.hpp>

struct mute {
  int rank() const { return 0; }
  int size() const { return 1; }
};

using broken = diloco::algorithm<diloco::inner::sgd, diloco::outer::sgd, diloco::compress::none, mute>;
broken* instance = nullptr;
