#include "bindings/host_form_bindings.h"

#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "engines/host_form_model.h"

namespace py = pybind11;

namespace pycoll {

namespace {

OpCode parse_form_op(const std::string& s) {
  if (s == "all_reduce" || s == "allreduce") return OpCode::AllReduce;
  if (s == "reduce_scatter") return OpCode::ReduceScatter;
  if (s == "all_gather" || s == "allgather") return OpCode::AllGather;
  throw py::value_error("the form across hosts is chosen for all_reduce, reduce_scatter and all_gather, not '" + s +
                        "'");
}

bool parse_device(const std::string& s) {
  if (s == "cpu") return false;
  if (s == "cuda") return true;
  throw py::value_error("device must be 'cpu' or 'cuda', got '" + s + "'");
}

}  // namespace

void register_host_forms(py::module_& m) {
  m.def(
      "set_host_form_table",
      [](const std::string& device, const std::string& op, int num_hosts, int local_size,
         const std::vector<std::pair<int64_t, std::string>>& steps, int64_t max_bytes) {
        try {
          HostFormTable t{parse_device(device), parse_form_op(op), num_hosts, local_size, {}, max_bytes};
          for (const auto& [from, form] : steps) t.steps.push_back({from, parse_host_form(form)});
          set_host_form_table(t);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("device"), py::arg("op"), py::arg("num_hosts"), py::arg("local_size"), py::arg("steps"),
      py::arg("max_bytes"),
      "Install which form (flat or hierarchical) of an op won where across hosts, for groups of num_hosts "
      "hosts of local_size ranks: [(from_bytes, form)], covering up to max_bytes (engines/host_form_model.h).");
  m.def("clear_host_form_tables", &clear_host_form_tables, "Back to the built-in forms across hosts.");
  m.def("host_form_tables", []() {
    py::list out;
    for (const HostFormTable& t : host_form_tables()) {
      py::list steps;
      for (const HostFormStep& s : t.steps) steps.append(py::make_tuple(s.from_bytes, host_form_name(s.form)));
      out.append(
          py::make_tuple(t.on_device ? "cuda" : "cpu", op_name(t.op), t.num_hosts, t.local_size, steps, t.max_bytes));
    }
    return out;
  });
  m.def(
      "host_form",
      [](const std::string& device, const std::string& op, int num_hosts, int local_size, int64_t bytes, bool builtin) {
        const bool d = parse_device(device);
        const OpCode o = parse_form_op(op);
        return std::string(host_form_name(builtin ? builtin_host_form(d, o, bytes)
                                                  : choose_host_form(d, o, num_hosts, local_size, bytes)));
      },
      py::arg("device"), py::arg("op"), py::arg("num_hosts"), py::arg("local_size"), py::arg("bytes"),
      py::arg("builtin") = false,
      "The form auto runs for `bytes` (pycoll-bench's count) in a group of num_hosts hosts of local_size ranks; "
      "builtin=True: without the calibrated tables.");
  m.def("host_form_digest", &host_form_digest,
        "Every installed table of forms across hosts in a fixed order ('' when none): what the ranks of a group "
        "across hosts compare.");
}

}  // namespace pycoll
