// Bindings of the scheduler: EngineType, SchedulerConfig, Allocation and
// Scheduler. schedule() and update() run without the GIL; Python addresses
// ratios by value.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "bindings.h"
#include "scheduler.h"

namespace dsgraph::bind {
namespace {

using namespace nb::literals;
using Event = std::tuple<int64_t, int32_t, bool, std::optional<std::string>>;
using DraftsIn = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using ConfIn = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Optional arrays of a commit (None: not given). The spans point into the caller's arrays, which the
// arguments keep alive for the whole call.
struct CommitArgs {
    TokensIn sampled;
    std::optional<TokensIn> num_emitted;
    std::optional<DraftsIn> drafts;
    std::optional<TokensIn> draft_lengths;
    std::optional<ConfIn> confidence;

    StepCommit view() const {
        StepCommit c{span_of(sampled), {}, {}, {}, {}};
        if (num_emitted) {
            c.num_emitted = span_of(*num_emitted);
        }
        if (drafts) {
            c.drafts = {drafts->data(), drafts->shape(0) * drafts->shape(1)};
        }
        if (draft_lengths) {
            c.draft_lengths = span_of(*draft_lengths);
        }
        if (confidence) {
            c.confidence = {confidence->data(), confidence->shape(0) * confidence->shape(1)};
        }
        return c;
    }
};

size_t ratio_index(const Scheduler &s, int32_t ratio) {
    const std::vector<int32_t> &ratios = s.config().ratios;
    for (size_t i = 0; i < ratios.size(); ++i) {
        if (ratios[i] == ratio) {
            return i;
        }
    }
    throw std::invalid_argument("Scheduler: ratio " + std::to_string(ratio) + " has no paged cache");
}

StopParams stop_params(int32_t max_tokens, int32_t eos_id, bool ignore_eos, std::vector<int32_t> stop_ids) {
    return StopParams{max_tokens, eos_id, ignore_eos, std::move(stop_ids)};
}

std::vector<Event> to_events(std::vector<StepEvent> &events) {
    std::vector<Event> out;
    for (StepEvent &e : events) {
        std::optional<std::string> reason;
        if (e.finished) {
            reason = std::move(e.reason);
        }
        out.emplace_back(e.rid, e.token, e.finished, std::move(reason));
    }
    return out;
}

std::vector<Event> update(Scheduler &s, const CommitArgs &args) {
    std::vector<StepEvent> events;
    {
        nb::gil_scoped_release release;
        events = s.update(args.view());
    }
    return to_events(events);
}

// The engine's one crossing per step: commit the step that ran (emitted tokens and the next drafts),
// then plan the next one (the verification planner runs inside schedule()).
std::pair<std::vector<Event>, StepPlan> advance(Scheduler &s, const CommitArgs &args) {
    std::vector<StepEvent> events;
    StepPlan plan;
    {
        nb::gil_scoped_release release;
        events = s.update(args.view());
        plan = s.schedule();
    }
    return {to_events(events), std::move(plan)};
}

// Overlapped steps: resolve the step awaiting its tokens, commit the plan in flight ahead of its tokens,
// plan the next one; one crossing.
std::pair<std::vector<Event>, StepPlan> advance_ahead(Scheduler &s, const TokensIn &sampled) {
    std::pair<std::vector<StepEvent>, StepPlan> out;
    {
        nb::gil_scoped_release release;
        out = s.advance_ahead(span_of(sampled));
    }
    return {to_events(out.first), std::move(out.second)};
}

std::vector<Event> resolve(Scheduler &s, const TokensIn &sampled) {
    std::vector<StepEvent> events;
    {
        nb::gil_scoped_release release;
        events = s.resolve(span_of(sampled));
    }
    return to_events(events);
}

template <typename F>
auto with_commit(F f) {
    return [f](Scheduler &s, const TokensIn &sampled, std::optional<TokensIn> num_emitted,
               std::optional<DraftsIn> drafts, std::optional<TokensIn> draft_lengths,
               std::optional<ConfIn> confidence) {
        return f(s, CommitArgs{sampled, num_emitted, drafts, draft_lengths, confidence});
    };
}

void bind_config(nb::module_ &m) {
    nb::enum_<EngineType>(m, "EngineType",
                          "NORMAL: prefill and decode; PROMPT: prefill only; COMPLETION: decode only.")
        .value("NORMAL", EngineType::kNormal)
        .value("PROMPT", EngineType::kPrompt)
        .value("COMPLETION", EngineType::kCompletion);
    nb::enum_<VerifyMode>(m, "VerifyMode",
                          "OFF: no drafts; CONFIDENCE: the confidence planner chooses the verified drafts; "
                          "FIXED: min(draft_len, drafts held) per request.")
        .value("OFF", VerifyMode::kOff)
        .value("CONFIDENCE", VerifyMode::kConfidence)
        .value("FIXED", VerifyMode::kFixed);
    nb::class_<SchedulerConfig>(m, "SchedulerConfig", "Scheduler settings; runtime/scheduler.py builds it.")
        .def(nb::init<>())
        .def_rw("engine_type", &SchedulerConfig::engine_type)
        .def_rw("max_num_seqs", &SchedulerConfig::max_num_seqs)
        .def_rw("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens)
        .def_rw("max_model_len", &SchedulerConfig::max_model_len)
        .def_rw("page_size", &SchedulerConfig::page_size)
        .def_rw("ratios", &SchedulerConfig::ratios)
        .def_rw("num_pages", &SchedulerConfig::num_pages)
        .def_rw("num_slots", &SchedulerConfig::num_slots)
        .def_rw("buckets", &SchedulerConfig::buckets)
        .def_rw("lookback_len", &SchedulerConfig::lookback_len)
        .def_rw("vocab_size", &SchedulerConfig::vocab_size)
        .def_rw("enable_prefix_cache", &SchedulerConfig::enable_prefix_cache)
        .def_rw("replay_tokens", &SchedulerConfig::replay_tokens)
        .def_rw("verify_mode", &SchedulerConfig::verify_mode)
        .def_rw("nextn", &SchedulerConfig::nextn)
        .def_rw("draft_len", &SchedulerConfig::draft_len);
    nb::class_<Allocation>(m, "Allocation",
                           "A request's state slot and pages, holding its first num_cached tokens.")
        .def_ro("rid", &Allocation::rid)
        .def_ro("slot", &Allocation::slot)
        .def_ro("pages", &Allocation::pages, "Pages per ratio (ascending ratios), in sequence order.")
        .def_ro("num_cached", &Allocation::num_cached)
        .def_ro("tokens", &Allocation::tokens, "Prompt then output tokens.");
}

void bind_requests(nb::class_<Scheduler> &c) {
    c.def(
         "add_request",
         [](Scheduler &s, int64_t rid, const TokensIn &prompt, int32_t max_tokens, int32_t eos_id,
            bool ignore_eos, std::vector<int32_t> stop_token_ids, bool use_prefix_cache, int32_t max_chunk) {
             s.add_request(rid, span_of(prompt),
                           stop_params(max_tokens, eos_id, ignore_eos, std::move(stop_token_ids)),
                           use_prefix_cache, max_chunk);
         },
         "rid"_a, "prompt"_a.noconvert(), "max_tokens"_a, "eos_id"_a = -1, "ignore_eos"_a = false,
         "stop_token_ids"_a = std::vector<int32_t>(), "use_prefix_cache"_a = true, "max_chunk"_a = 0,
         "Queue a request; ValueError names the bad field (prompt too long, token id < 0, max_tokens < 1, "
         "...). use_prefix_cache=False: it neither reads nor fills the prefix cache. max_chunk > 0: no "
         "step prefills more than that many of its tokens.")
        .def(
            "add_prefilled",
            [](Scheduler &s, int64_t rid, const TokensIn &prompt, const TokensIn &output, int32_t max_tokens,
               int32_t eos_id, bool ignore_eos, std::vector<int32_t> stop_token_ids) {
                return s.add_prefilled(
                    rid, span_of(prompt), span_of(output),
                    stop_params(max_tokens, eos_id, ignore_eos, std::move(stop_token_ids)));
            },
            "rid"_a, "prompt"_a.noconvert(), "output"_a.noconvert(), "max_tokens"_a, "eos_id"_a = -1,
            "ignore_eos"_a = false, "stop_token_ids"_a = std::vector<int32_t>(),
            "Admit a request whose caches (all tokens but the newest) are filled elsewhere; returns where to "
            "fill "
            "them. RuntimeError when there is no room (see can_add_prefilled).")
        .def("can_add_prefilled", &Scheduler::can_add_prefilled, "num_tokens"_a)
        .def("abort", &Scheduler::abort, "rid"_a,
             "Finish with reason 'abort' (reported by the next update()).")
        .def("preempt", &Scheduler::preempt, "rid"_a,
             "Preempt a request holding a slot now (recompute later).")
        .def("schedule", &Scheduler::schedule, nb::call_guard<nb::gil_scoped_release>(),
             "Plan the next step (one call per step, then update()).")
        .def("update", with_commit(&update), "sampled"_a.noconvert(),
             "num_emitted"_a.noconvert() = nb::none(),
             "drafts"_a.noconvert() = nb::none(), "draft_lengths"_a.noconvert() = nb::none(),
             "confidence"_a.noconvert() = nb::none(),
             "Commit the step: int32 sampled [sample rows]; optional int32 num_emitted [seqs] (default one "
             "per sampling sequence), the next drafts int32 [seqs, nextn] with int32 draft_lengths [seqs] "
             "and float64 confidence [seqs, nextn]. Returns (rid, token, finished, reason) per emitted "
             "token, after pending aborts (token -1). ValueError names the bad entry; nothing changes then.")
        .def("advance", with_commit(&advance), "sampled"_a.noconvert(),
             "num_emitted"_a.noconvert() = nb::none(), "drafts"_a.noconvert() = nb::none(),
             "draft_lengths"_a.noconvert() = nb::none(), "confidence"_a.noconvert() = nb::none(),
             "update(...) then schedule() in one call: (events of the committed step, the next plan).")
        .def("advance_ahead", &advance_ahead, "sampled"_a.noconvert(),
             "Overlapped step: resolve(sampled) the step awaiting its tokens (none: sampled empty, pending "
             "aborts returned), commit the plan in flight before its tokens are known (commit_ahead), plan "
             "the next step: (events of the resolved step, the next plan).")
        .def("commit_ahead", &Scheduler::commit_ahead, nb::call_guard<nb::gil_scoped_release>(),
             "Commit the plan in flight with its sampled tokens still unknown (resolve() gives them).")
        .def("resolve", &resolve, "sampled"_a.noconvert(),
             "int32 tokens of the step commit_ahead() committed, one per sample row: (rid, token, finished, "
             "reason) per emitted token, after pending aborts (token -1).")
        .def_prop_ro("has_unresolved", &Scheduler::has_unresolved)
        .def_prop_ro("done_step", &Scheduler::done_step,
                     "Every step up to this one has run and is committed with its tokens.")
        .def("drafts_of", &Scheduler::drafts_of, "rid"_a, "The drafts a request holds now.")
        .def("allocation", &Scheduler::allocation, "rid"_a)
        .def("handoff", &Scheduler::handoff, "rid"_a,
             "A PROMPT engine's finished request: its slot and pages.")
        .def("release_handoff", &Scheduler::release_handoff, "rid"_a)
        .def(
            "prefix_pages",
            [](const Scheduler &s, const TokensIn &prompt) { return s.prefix_pages(span_of(prompt)); },
            "prompt"_a.noconvert(), "Per ratio: the pages of the prompt's leading full pages cached now.")
        .def(
            "import_prefix",
            [](Scheduler &s, const TokensIn &prompt, std::vector<int32_t> counts) {
                return s.import_prefix(span_of(prompt), counts);
            },
            "prompt"_a.noconvert(), "counts"_a,
            "Cache the first counts[i] pages of ratio i's chain of the prompt (store import): per ratio, a "
            "fresh page to fill with the block's bytes, or -1 where cached already; a ratio stops at the "
            "first page it cannot get.");
}

void bind_stats(nb::class_<Scheduler> &c) {
    c.def_prop_ro("num_waiting", &Scheduler::num_waiting)
        .def_prop_ro("num_running", &Scheduler::num_running)
        .def_prop_ro("num_handoff", &Scheduler::num_handoff)
        .def_prop_ro("num_requests", &Scheduler::num_requests)
        .def_prop_ro("has_unfinished", &Scheduler::has_unfinished)
        .def_prop_ro("num_preemptions", &Scheduler::num_preemptions)
        .def_prop_ro("num_replayed_tokens", &Scheduler::num_replayed_tokens)
        .def_prop_ro("prefix_lookup_tokens", [](const Scheduler &s) { return s.cache().lookup_tokens(); })
        .def_prop_ro("prefix_hit_tokens", [](const Scheduler &s) { return s.cache().hit_tokens(); })
        .def_prop_ro("num_free_slots", [](const Scheduler &s) { return s.slots().num_free(); })
        .def(
            "num_free_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().pool(ratio_index(s, r)).num_free(); },
            "ratio"_a)
        .def(
            "num_used_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().pool(ratio_index(s, r)).num_used(); },
            "ratio"_a, "Pages with a reference: held by requests or by the prefix cache.")
        .def(
            "num_cached_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().num_cached(ratio_index(s, r)); }, "ratio"_a)
        .def(
            "num_idle_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().num_idle(ratio_index(s, r)); }, "ratio"_a,
            "Cached pages no request uses (evictable).")
        .def(
            "num_evicted_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().num_evicted(ratio_index(s, r)); }, "ratio"_a,
            "Idle cached pages evicted so far to serve allocations.")
        .def(
            "cached_pages",
            [](const Scheduler &s, int32_t r) { return s.cache().cached_pages(ratio_index(s, r)); },
            "ratio"_a)
        .def(
            "page_refcounts",
            [](const Scheduler &s, int32_t r) {
                return to_numpy(s.cache().pool(ratio_index(s, r)).refcounts());
            },
            "ratio"_a, "Reference count of every page of the ratio (a copy).");
}

}  // namespace

void bind_scheduler(nb::module_ &m) {
    bind_config(m);
    nb::class_<Scheduler> c(m, "Scheduler",
                            "Continuous-batching step scheduler (see runtime/csrc/scheduler.h).");
    c.def(nb::init<SchedulerConfig, std::shared_ptr<ThroughputCurve>>(), "config"_a, "curve"_a = nb::none(),
          "curve: the confidence planner's throughput curve, shared (observe() on it corrects the planner); "
          "required when config.verify_mode is CONFIDENCE.")
        .def_prop_ro("config", &Scheduler::config)
        .def_prop_rw("draft_ms", &Scheduler::draft_ms, &Scheduler::set_draft_ms,
                     "The draft pass (ms) a drafting plan pays on top of its verify step, every depth alike "
                     "(reads the deepest pass's cost); a plan verifying nothing pays none.")
        .def_prop_rw("draft_depth_ms", &Scheduler::draft_depth_ms, &Scheduler::set_draft_depth_ms,
                     "The draft pass (ms) by depth: entry D - 1 for a pass drafting D tokens per request.");
    bind_requests(c);
    bind_stats(c);
}

}  // namespace dsgraph::bind
