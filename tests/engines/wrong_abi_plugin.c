/* A plugin built against a future ABI: only the first member (abi_version) is ever read. */
#include "kvdiff/engine.h"

static const kvdiff_engine_api kApi = {999u, "future", "0", 0, 0, 0, 0, 0, 0,
                                       0,    0,        0,   0, 0, 0, 0, 0};

KVDIFF_ENGINE_EXPORT const kvdiff_engine_api* kvdiff_engine_entry(void) { return &kApi; }
