// Replay of captured bucket programs from C++: a table from a bucket's key (the
// concrete sizes its program was specialized to) to its phases, each a captured
// CUDA graph (a cudaGraphExec_t handle, launched with the driver's
// cuGraphLaunch on the caller's stream) or a host callback (a step that runs
// eagerly between graphs, or on a machine without CUDA the whole re-run of a
// piece). The driver library is opened with dlopen on the first graph launch,
// so the module links no CUDA library and builds and runs on CPU-only machines.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsgraph {

struct ReplayPhase {
    uintptr_t graph_exec = 0;  // a cudaGraphExec_t, or 0 for a host callback
    int32_t callback = -1;     // index into the caller's callbacks when graph_exec is 0
};

// The CUDA driver's cuGraphLaunch, resolved at run time. Throws
// std::runtime_error naming the library or symbol when it cannot be loaded.
using GraphLaunchFn = int (*)(void *exec, void *stream);
GraphLaunchFn cuda_graph_launch();

class ReplayTable {
public:
    // Registers (or replaces) the phases of the bucket `key`.
    void add(const std::vector<int64_t> &key, std::vector<ReplayPhase> phases);
    bool contains(const std::vector<int64_t> &key) const { return table_.count(key) != 0; }
    size_t size() const { return table_.size(); }

    // Runs the bucket's phases in order: graphs via cuGraphLaunch on `stream`,
    // callbacks through `call(index)`. Throws std::out_of_range naming the key
    // when no bucket is registered for it, std::runtime_error when a launch
    // fails (with the driver's error code).
    void launch(const std::vector<int64_t> &key, uintptr_t stream,
                const std::function<void(int32_t)> &call) const;

private:
    std::map<std::vector<int64_t>, std::vector<ReplayPhase>> table_;
};

std::string format_key(const std::vector<int64_t> &key);

}  // namespace dsgraph
