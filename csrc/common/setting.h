// The settings registry: every PYCOLL_* variable that shipped code reads is declared once, as a
// static Setting next to the code that uses it, with its default, range, one-line doc, audience
// and whether every rank of a group must agree on it. Parsing, range errors, the agreement check
// (settings_agreement.h) and the settings tables of README.md and docs/settings.md all come from
// these declarations (pycollectives.settings() lists them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pycoll {

enum class Audience {
  User,       // a setting a user may need (algorithm, debug log, cost model, memory sizes)
  Developer,  // a tuning knob for measuring kernels; the defaults are what the decisions chose
};

struct SettingInfo {
  std::string name;
  std::string default_text;  // the default as the docs print it
  std::string range_text;    // "0..16384", "a path", ...
  std::string doc;
  std::string scope;         // which part reads it: "backend", "cpu engine", "cuda engine"
  bool ranks_agree = false;  // every rank of a group must use the same value
  Audience audience = Audience::User;
};

// An integer setting; byte sizes accept K/M/G suffixes when `bytes` is set.
class IntSetting {
 public:
  IntSetting(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* scope, bool ranks_agree,
             Audience audience, const char* doc, const char* default_text = nullptr, bool bytes = false,
             int64_t multiple_of = 1);
  // The variable's value now, or the declared default. A value that does not parse, lies outside
  // lo..hi or is not a multiple of multiple_of raises ValueError naming the setting and its range.
  int64_t get() const { return get_or(fallback_); }
  // As get(), with a default known only at run time (the docs say how it is chosen).
  int64_t get_or(int64_t fallback) const;
  bool is_set() const;
  const char* name() const { return name_; }

 private:
  const char* name_;
  int64_t fallback_, lo_, hi_, multiple_of_;
  bool bytes_;
};

// A text setting (a name from a fixed list, or a path); parsing is the caller's.
class TextSetting {
 public:
  TextSetting(const char* name, const char* fallback, const char* range_text, const char* scope, bool ranks_agree,
              Audience audience, const char* doc);
  std::string get() const;
  const char* name() const { return name_; }

 private:
  const char* name_;
  const char* fallback_;
};

// Every declared setting, sorted by name.
std::vector<SettingInfo> registered_settings();
// A setting's value now (parsed and range-checked, the default when unset), as text; raises
// ValueError for a bad value or an unknown name.
std::string read_setting(const std::string& name);

}  // namespace pycoll
