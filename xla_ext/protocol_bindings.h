// The protocol's facts for Python: enums, error classes and the settings
// table, exported from their one definition in common.h and config.h.
#pragma once

#include <nanobind/nanobind.h>

#include "config.h"

namespace jaxcache {

void BindProtocol(nanobind::module_& m);
// A Config from a {field: value} dict (fields it lacks keep their defaults).
Config ConfigFromDict(const nanobind::dict& d);

}  // namespace jaxcache
