#include "step_plan.h"

#include <algorithm>

namespace dsgraph {
namespace {

void add_rows(StepPlan &plan, const Chunk &c, int32_t seq) {
    const Request &r = *c.request;
    for (int32_t p = c.start; p < c.end; ++p) {
        const int32_t token = r.token_at(p);
        plan.token_ids.push_back(is_unresolved(token) ? 0 : token);
        plan.token_src.push_back(is_unresolved(token) ? unresolved_row(token) : -1);
        plan.positions.push_back(p);
        plan.seq_ids.push_back(seq);
        plan.is_replay.push_back(p < r.replay_end ? 1 : 0);
    }
    plan.verify_start.push_back(static_cast<int32_t>(plan.sample_rows.size()));
    plan.verify_len.push_back(c.sample ? 1 + c.drafts : 0);
    if (c.sample) {
        const int32_t last = static_cast<int32_t>(plan.token_ids.size()) - 1;
        for (int32_t row = last - c.drafts; row <= last; ++row) {
            plan.sample_rows.push_back(row);
            plan.sample_rids.push_back(r.rid);
        }
    }
}

void add_sequence(StepPlan &plan, const Chunk &c) {
    const Request &r = *c.request;
    plan.seq_slot.push_back(r.slot);
    plan.seq_start.push_back(c.start);
    plan.seq_end.push_back(c.end);
    plan.seq_window_start.push_back(r.window_start);
    plan.seq_rids.push_back(r.rid);
    for (int32_t i = 0; i < plan.lookback_len; ++i) {
        const int32_t token = i < c.start ? r.tokens[static_cast<size_t>(c.start - 1 - i)] : -1;
        plan.lookback.push_back(is_unresolved(token) ? 0 : token);
        plan.lookback_src.push_back(is_unresolved(token) ? unresolved_row(token) : -1);
    }
    for (size_t k = 0; k < plan.ratios.size(); ++k) {
        const std::vector<int32_t> &pages = r.pages[k];
        std::vector<int32_t> &table = plan.block_tables[k];
        table.insert(table.end(), pages.begin(), pages.end());
        table.insert(table.end(), static_cast<size_t>(plan.table_widths[k]) - pages.size(), -1);
    }
}

}  // namespace

StepPlan build_plan(const std::vector<Chunk> &chunks, const SchedulerConfig &config,
                    const BucketTable &buckets) {
    StepPlan plan;
    plan.lookback_len = config.lookback_len;
    plan.ratios = config.ratios;
    for (const int32_t ratio : config.ratios) {
        plan.table_widths.push_back(pages_per_seq(config, ratio));
    }
    plan.block_tables.resize(config.ratios.size());
    for (size_t s = 0; s < chunks.size(); ++s) {
        add_rows(plan, chunks[s], static_cast<int32_t>(s));
        add_sequence(plan, chunks[s]);
        plan.num_verify_drafts += chunks[s].drafts;
    }
    plan.num_tokens = static_cast<int32_t>(plan.token_ids.size());
    if (plan.num_tokens == 0) {
        return plan;
    }
    plan.bucket = static_cast<int32_t>(buckets.choose(plan.num_tokens));
    const size_t rows = static_cast<size_t>(plan.bucket);
    // Padding rows: seq_ids -1 makes every op skip them (no cache write, zero output).
    plan.token_ids.resize(rows, 0);
    plan.token_src.resize(rows, -1);
    plan.positions.resize(rows, 0);
    plan.seq_ids.resize(rows, -1);
    plan.is_replay.resize(rows, 0);
    return plan;
}

}  // namespace dsgraph
