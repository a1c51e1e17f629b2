#include "common/setting.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>

namespace pycoll {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, SettingInfo> settings;
  std::map<std::string, std::function<std::string()>> readers;  // parse the value now, as text
};

Registry& registry() {
  static Registry r;  // function-local: registration runs during static initialisation
  return r;
}

void add(SettingInfo info, std::function<std::string()> read) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const std::string name = info.name;
  r.settings[name] = std::move(info);
  r.readers[name] = std::move(read);
}

const char* raw(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

}  // namespace

IntSetting::IntSetting(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* scope, bool ranks_agree,
                       Audience audience, const char* doc, const char* default_text, bool bytes, int64_t multiple_of)
    : name_(name), fallback_(fallback), lo_(lo), hi_(hi), multiple_of_(multiple_of), bytes_(bytes) {
  std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  if (multiple_of > 1) range += ", a multiple of " + std::to_string(multiple_of);
  if (bytes) range += " (K/M/G suffixes)";
  add(SettingInfo{name, default_text != nullptr ? default_text : std::to_string(fallback), range, doc, scope,
                  ranks_agree, audience},
      [this] { return std::to_string(get()); });
}

bool IntSetting::is_set() const { return raw(name_) != nullptr; }

int64_t IntSetting::get_or(int64_t fallback) const {
  const char* v = raw(name_);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  bool ok = end != v;
  if (ok && bytes_ && *end != '\0' && end[1] == '\0') {
    const char s = *end;
    const int shift = (s == 'k' || s == 'K') ? 10 : (s == 'm' || s == 'M') ? 20 : (s == 'g' || s == 'G') ? 30 : -1;
    ok = shift >= 0;
    if (ok) x <<= shift;
    ++end;
  }
  ok = ok && *end == '\0' && x >= lo_ && x <= hi_ && x % multiple_of_ == 0;
  TORCH_CHECK_VALUE(ok, "pycoll: ", name_, "=", v, " is not valid: it must be an integer in ", lo_, "..", hi_,
                    multiple_of_ > 1 ? ", a multiple of " + std::to_string(multiple_of_) : std::string(),
                    bytes_ ? " (K, M, G suffixes allowed)" : "");
  return x;
}

TextSetting::TextSetting(const char* name, const char* fallback, const char* range_text, const char* scope,
                         bool ranks_agree, Audience audience, const char* doc)
    : name_(name), fallback_(fallback) {
  add(SettingInfo{name, *fallback != '\0' ? fallback : "(unset)", range_text, doc, scope, ranks_agree, audience},
      [this] { return get(); });
}

std::string TextSetting::get() const {
  const char* v = raw(name_);
  return v != nullptr ? std::string(v) : std::string(fallback_);
}

std::vector<SettingInfo> registered_settings() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<SettingInfo> out;
  for (const auto& kv : r.settings) out.push_back(kv.second);
  return out;
}

std::string read_setting(const std::string& name) {
  std::function<std::string()> read;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.readers.find(name);
    TORCH_CHECK_VALUE(it != r.readers.end(), "pycoll: no setting named ", name);
    read = it->second;
  }
  return read();
}

}  // namespace pycoll
