#include "protocol_bindings.h"

#include <nanobind/stl/string.h>

#include <cctype>
#include <deque>
#include <string>

#include "common.h"
#include "point_to_point.h"

namespace nb = nanobind;

namespace jaxcache {
namespace {

// Enum member names are the runtime's own names in upper case (DType.FLOAT32,
// Kind.ALLREDUCE); nanobind keeps the pointer, so the strings live here.
const char* MemberName(const char* name) {
  static std::deque<std::string> names;
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return names.emplace_back(std::move(upper)).c_str();
}

template <typename E>
void BindEnum(nb::module_& m, const char* name, const char* doc, int count, const char* (*name_of)(E)) {
  nb::enum_<E> e(m, name, doc, nb::is_arithmetic());
  for (int i = 0; i < count; ++i) e.value(MemberName(name_of(static_cast<E>(i))), static_cast<E>(i));
}

// (field, type, default, variable, minimum, scope) for every setting.
nb::list SettingsTable() {
  const Config defaults;
  nb::list table;
#define JAXCACHE_SETTING_ROW(name, type, default_value, setting_type, variable, minimum, scope)   \
  table.append(nb::make_tuple(#name, SettingType::setting_type, defaults.name, variable,        \
                              static_cast<double>(minimum), SettingScope::scope));
  JAXCACHE_SETTINGS(JAXCACHE_SETTING_ROW)
#undef JAXCACHE_SETTING_ROW
  return table;
}

// {field: Horovod's variable} for the settings that have one.
nb::dict HorovodAliases() {
  nb::dict aliases;
#define JAXCACHE_HOROVOD_ALIAS(name, variable) \
  static_cast<void>(&Config::name);            \
  aliases[#name] = variable;
  JAXCACHE_HOROVOD_ALIASES(JAXCACHE_HOROVOD_ALIAS)
#undef JAXCACHE_HOROVOD_ALIAS
  return aliases;
}

}  // namespace

Config ConfigFromDict(const nb::dict& d) {
  Config c;
#define JAXCACHE_SETTING_READ(name, type, ...) \
  if (d.contains(#name)) c.name = nb::cast<type>(d[#name]);
  JAXCACHE_SETTINGS(JAXCACHE_SETTING_READ)
#undef JAXCACHE_SETTING_READ
  return c;
}

void BindProtocol(nb::module_& m) {
  BindEnum<DType>(m, "DType", "Element types, by NumPy name (ml_dtypes' for bfloat16).", kNumDTypes,
                  &DTypeName);
  BindEnum<ReduceOp>(m, "ReduceOp", "Reduction operators.", kNumReduceOps, &ReduceOpName);
  BindEnum<Kind>(m, "Kind", "Collective kinds.", kNumKinds, &KindName);
  BindEnum<Device>(m, "Device", "Where a request's tensors live.", kNumDevices, &DeviceName);
  BindEnum<ErrorKind>(m, "ErrorKind", "Why a request failed.", kNumErrorKinds, &ErrorKindName);
  BindEnum<SettingType>(m, "SettingType", "How a setting's variable is read.", kNumSettingTypes, &SettingTypeName);
  BindEnum<SettingScope>(m, "SettingScope", "Whose value of a setting a rank uses.",
                         kNumSettingScopes, &SettingScopeName);
  m.def("error_class_name", [](ErrorKind k) { return std::string(ErrorClassName(k)); }, nb::arg("kind"),
        "The jaxcache.errors class a request failing with `kind` raises ('' for NONE).");
  // Point-to-point wildcards and limits (MPI's values: mpi4py's MPI.ANY_SOURCE
  // and MPI.ANY_TAG are the same numbers when both use this MPI).
  m.attr("ANY_SOURCE") = kAnySource;
  m.attr("ANY_TAG") = kAnyTag;
  m.attr("P2P_INLINE_BYTES") = kP2PInlineBytes;
  m.attr("P2P_MAX_DIMS") = kP2PMaxDims;
  m.def("element_size", [](DType d) { return ElementSize(d); }, nb::arg("dtype"));
  m.def("settings_table", &SettingsTable,
        "Every runtime setting: (field, SettingType, default, variable, minimum, SettingScope).");
  m.def("horovod_aliases", &HorovodAliases,
        "{field: HOROVOD_* variable} read when the setting's JAXCACHE_* variable is unset.");
}

}  // namespace jaxcache
