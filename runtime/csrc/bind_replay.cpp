// Bindings of the bucket replay table (graph_replay.h): phases come from
// Python as ints (cudaGraphExec_t handles) or callables (host steps).
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "bindings.h"
#include "graph_replay.h"

namespace dsgraph::bind {

namespace {

class PyReplayTable {
public:
    void add(const std::vector<int64_t> &key, const nb::list &phases) {
        std::vector<ReplayPhase> out;
        out.reserve(phases.size());
        for (nb::handle phase : phases) {
            if (nb::isinstance<nb::int_>(phase)) {
                uintptr_t exec = nb::cast<uintptr_t>(phase);
                if (exec == 0) throw nb::value_error("ReplayTable.add: a graph exec handle of 0");
                out.push_back({exec, -1});
            } else if (PyCallable_Check(phase.ptr())) {
                out.push_back({0, static_cast<int32_t>(callbacks_.size())});
                callbacks_.push_back(nb::borrow<nb::object>(phase));
            } else {
                throw nb::type_error("ReplayTable.add: a phase is a graph exec handle (int) or a callable");
            }
        }
        table_.add(key, std::move(out));
    }

    void launch(const std::vector<int64_t> &key, uintptr_t stream) const {
        table_.launch(key, stream, [this](int32_t i) { callbacks_[static_cast<size_t>(i)](); });
    }

    bool contains(const std::vector<int64_t> &key) const { return table_.contains(key); }
    size_t size() const { return table_.size(); }

    // The callbacks may refer back to the table's owner: the cyclic GC must see them.
    std::vector<nb::object> callbacks_;

private:
    ReplayTable table_;
};

int traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    for (const nb::object &o : nb::inst_ptr<PyReplayTable>(self)->callbacks_) Py_VISIT(o.ptr());
    return 0;
}

int clear(PyObject *self) {
    nb::inst_ptr<PyReplayTable>(self)->callbacks_.clear();
    return 0;
}

PyType_Slot gc_slots[] = {{Py_tp_traverse, reinterpret_cast<void *>(traverse)},
                          {Py_tp_clear, reinterpret_cast<void *>(clear)},
                          {0, nullptr}};

}  // namespace

void bind_replay(nb::module_ &m) {
    nb::class_<PyReplayTable>(m, "ReplayTable",
                              "Captured bucket programs by key, launched from C++ in one call per step.",
                              nb::type_slots(gc_slots))
        .def(nb::init<>())
        .def("add", &PyReplayTable::add, nb::arg("key"), nb::arg("phases"),
             "Register a bucket: its key (ints) and phases in order, each a cudaGraphExec_t handle (int) "
             "or a callable run on the host.")
        .def("launch", &PyReplayTable::launch, nb::arg("key"), nb::arg("stream") = 0,
             "Run the bucket's phases: graphs through cuGraphLaunch on `stream` (a CUstream handle; the "
             "driver is opened with dlopen on first use), callables in between; IndexError for an unknown "
             "bucket, RuntimeError naming the CUresult of a failed launch.")
        .def("__contains__", &PyReplayTable::contains, nb::arg("key"))
        .def("__len__", &PyReplayTable::size);
    m.def(
        "cuda_driver_available",
        []() {
            try {
                cuda_graph_launch();
                return true;
            } catch (const std::exception &) {
                return false;
            }
        },
        "Whether the CUDA driver's cuGraphLaunch can be loaded on this machine.");
}

}  // namespace dsgraph::bind
