#include "graph_replay.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <utility>

namespace dsgraph {

GraphLaunchFn cuda_graph_launch() {
    static std::once_flag once;
    static GraphLaunchFn fn = nullptr;
    static std::string error;
    std::call_once(once, [] {
        // libcuda.so.1 is the driver's soname (present wherever a driver is);
        // cudaGraphExec_t and CUgraphExec, cudaStream_t and CUstream are the
        // same handles, so torch's graph exec launches through the driver API.
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            const char *why = dlerror();
            error = std::string("dlopen(libcuda.so.1) failed: ") + (why ? why : "unknown error");
            return;
        }
        fn = reinterpret_cast<GraphLaunchFn>(dlsym(lib, "cuGraphLaunch"));
        if (fn == nullptr) error = "libcuda.so.1 has no symbol cuGraphLaunch";
    });
    if (fn == nullptr) throw std::runtime_error("graph replay: " + error);
    return fn;
}

std::string format_key(const std::vector<int64_t> &key) {
    std::string out = "(";
    for (size_t i = 0; i < key.size(); ++i) out += (i ? ", " : "") + std::to_string(key[i]);
    return out + ")";
}

void ReplayTable::add(const std::vector<int64_t> &key, std::vector<ReplayPhase> phases) {
    for (size_t i = 0; i < phases.size(); ++i) {
        if (phases[i].graph_exec == 0 && phases[i].callback < 0) {
            throw std::invalid_argument("graph replay: bucket " + format_key(key) + " phase " +
                                        std::to_string(i) + " has neither a graph nor a callback");
        }
    }
    table_[key] = std::move(phases);
}

void ReplayTable::launch(const std::vector<int64_t> &key, uintptr_t stream,
                         const std::function<void(int32_t)> &call) const {
    auto it = table_.find(key);
    if (it == table_.end()) {
        throw std::out_of_range("graph replay: no captured bucket " + format_key(key) + " (" +
                                std::to_string(table_.size()) + " registered)");
    }
    for (const ReplayPhase &phase : it->second) {
        if (phase.graph_exec == 0) {
            call(phase.callback);
            continue;
        }
        int rc = cuda_graph_launch()(reinterpret_cast<void *>(phase.graph_exec),
                                     reinterpret_cast<void *>(stream));
        if (rc != 0) {
            throw std::runtime_error("graph replay: cuGraphLaunch of bucket " + format_key(key) +
                                     " failed with CUresult " + std::to_string(rc));
        }
    }
}

}  // namespace dsgraph
