// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: `not_an_optimizer` lacks options/validate/make_update, so
// naming it as the inner optimizer violates diloco::inner_optimizer.
#include <diloco/diloco.hpp>

struct not_an_optimizer {
  float lr = 0.1f;
};

using broken = diloco::algorithm<not_an_optimizer, diloco::outer::nesterov, diloco::compress::none,
                                 diloco::comm::threads>;
broken* instance = nullptr;
