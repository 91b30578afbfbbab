// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/comm/gloo.hpp"
#include "diloco/comm/nccl.hpp"
#include "diloco/comm/regrouped.hpp"

namespace diloco::comm {

/// The data_factory of elastic_nccl: rank 0 of a generation makes an NCCL unique id, and every
/// member creates its nccl communicator from it.
struct nccl_factory {
  using communicator = nccl;  ///< what it makes for each generation
  static constexpr std::string_view name = "nccl";  ///< names the communicator in store keys and messages

  /// Device, stream and agreement check of every generation's communicator;
  /// store_key and store_timeout are not used (the id travels under the
  /// generation's key, waited for up to the membership's timeout).
  nccl_options options{};

  /// A fresh NCCL unique id, as bytes (rank 0 of a generation).
  std::vector<char> make_id() {
    const ncclUniqueId id = nccl::make_unique_id();
    return {id.internal, id.internal + sizeof id.internal};
  }

  /// This member's nccl communicator for generation `g`, from rank 0's id; its timeout is the
  /// smaller of options.timeout and the membership's.
  nccl create(std::span<const char> id, const data_group& g) {
    nccl_options o = options;
    o.timeout = std::min(o.timeout, g.timeout);
    const std::string source =
        diloco::detail::concat("store key '", detail_regroup::id_key(g.generation, name), "'");
    return nccl(detail_nccl::unique_id_from(id, source), g.rank, g.size, std::move(o));
  }
};

/// An elastic device communicator: NCCL for the data, comm::gloo (options.elastic) for
/// the membership (comm/regrouped.hpp). A dead peer makes an NCCL operation
/// time out into comm_error; the survivors form the next generation through
/// the Gloo store, abort the old NCCL communicator (ncclCommAbort) and
/// create a new one from the id the new rank 0 publishes under the
/// generation's key. Needs the diloco::nccl and diloco::gloo targets.
///
/// ```
/// auto membership = diloco::comm::gloo::options_from_env();   // DILOCO_ELASTIC=1
/// diloco::comm::elastic_nccl comm(membership, {.options = {.device = local_rank}});
/// ```
///
/// Every NCCL operation and creation is bounded by the smaller of
/// options.timeout and the membership's timeout: recovery waits for the live
/// members within the membership's timeout, so a member whose NCCL operation
/// failed later would be dropped as if dead.
using elastic_nccl = regrouped<nccl_factory>;

static_assert(device_communicator<elastic_nccl> && async_device_communicator<elastic_nccl> &&
                  elastic_communicator<elastic_nccl>,
              "comm::elastic_nccl must be an elastic device communicator");
static_assert(!communicator<elastic_nccl>, "comm::elastic_nccl must not accept host memory");

}  // namespace diloco::comm
