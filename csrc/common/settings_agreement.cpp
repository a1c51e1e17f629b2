#include "common/settings_agreement.h"

#include <map>
#include <sstream>

namespace pycoll {

std::string encode_settings(const SettingList& settings) {
  std::string s;
  for (const auto& kv : settings) s += kv.first + "=" + kv.second + "\n";
  return s;
}

namespace {

std::map<std::string, std::string> decode(const std::string& encoded, std::vector<std::string>* order) {
  std::map<std::string, std::string> m;
  std::istringstream in(encoded);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq);
    if (m.emplace(name, line.substr(eq + 1)).second && order != nullptr) {
      bool seen = false;
      for (const auto& o : *order) seen = seen || o == name;
      if (!seen) order->push_back(name);
    }
  }
  return m;
}

}  // namespace

std::string settings_disagreement(const std::vector<std::string>& encoded_per_rank) {
  std::vector<std::string> order;  // first appearance over the ranks, for a stable message
  std::vector<std::map<std::string, std::string>> ranks;
  for (const auto& e : encoded_per_rank) ranks.push_back(decode(e, &order));
  std::ostringstream os;
  for (const auto& name : order) {
    auto value = [&](size_t r) {
      const auto it = ranks[r].find(name);
      return it == ranks[r].end() ? std::string("(unset)") : it->second;
    };
    bool same = true;
    for (size_t r = 1; r < ranks.size(); ++r) same = same && value(r) == value(0);
    if (same) continue;
    os << name << ":";
    for (size_t r = 0; r < ranks.size(); ++r) os << (r ? ", " : " ") << "rank " << r << " has " << value(r);
    os << "\n";
  }
  return os.str();
}

}  // namespace pycoll
