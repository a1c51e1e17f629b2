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
      "set_host_form_entry",
      [](const std::string& device, const std::string& op, const std::string& form, int num_hosts, int local_size,
         double alpha_us, double beta_us_per_byte) {
        try {
          set_host_form_entry({parse_device(device), parse_form_op(op), parse_host_form(form), num_hosts, local_size,
                               alpha_us, beta_us_per_byte});
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("device"), py::arg("op"), py::arg("form"), py::arg("num_hosts"), py::arg("local_size"),
      py::arg("alpha_us"), py::arg("beta_us_per_byte"),
      "Install the calibrated cost of one form (flat or hierarchical) of an op across hosts, for groups of "
      "num_hosts hosts of local_size ranks (engines/host_form_model.h).");
  m.def("clear_host_form_entries", &clear_host_form_entries, "Back to the built-in forms across hosts.");
  m.def("host_form_entries", []() {
    py::list out;
    for (const HostFormEntry& e : host_form_entries())
      out.append(py::make_tuple(e.on_device ? "cuda" : "cpu", op_name(e.op), host_form_name(e.form), e.num_hosts,
                                e.local_size, e.alpha_us, e.beta_us_per_byte));
    return out;
  });
  m.def(
      "calibrated_host_form",
      [](const std::string& device, const std::string& op, int num_hosts, int local_size,
         int64_t bytes) -> py::object {
        auto f = calibrated_host_form(parse_device(device), parse_form_op(op), num_hosts, local_size, bytes);
        if (!f) return py::none();
        return py::str(host_form_name(*f));
      },
      py::arg("device"), py::arg("op"), py::arg("num_hosts"), py::arg("local_size"), py::arg("bytes"),
      "The form the calibrated constants choose for `bytes` (pycoll-bench's count), or None where the engine's "
      "built-in rule decides.");
  m.def("host_form_digest", &host_form_digest,
        "Every installed form constant in a fixed order ('' when none): what the ranks of a group across hosts "
        "compare.");
}

}  // namespace pycoll
