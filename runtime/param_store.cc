// The params store of a stage.
#include "runtime/param_store.h"

namespace zero::runtime {

StatusOr<std::unique_ptr<ParamStore>> ParamStore::Create(const Context& context) {
  return context.config.stage == 3 ? CreateShardedParams(context) : CreateReplicatedParams(context);
}

}  // namespace zero::runtime
