// The plan of one step: the flat-batch inputs of the model step (layout of
// models/deepseek_v41/step_io.py) padded to a bucket, plus what the runtime
// needs around it (request ids, sampled rows, replay marks).
#pragma once

#include <cstdint>
#include <vector>

#include "buckets.h"
#include "request.h"
#include "scheduler_config.h"

namespace dsgraph {

struct StepPlan {
    int64_t step = 0;        // 1 for the first plan of a scheduler
    int32_t bucket = 0;      // padded rows; 0 for an empty plan
    int32_t num_tokens = 0;  // real rows, the first num_tokens of every row array
    int32_t num_decode = 0;  // sequences fed one decode row
    int32_t lookback_len = 0;
    // [bucket] per row; padding rows have seq_ids -1, token 0, position 0.
    std::vector<int32_t> token_ids, positions, seq_ids;
    // [bucket] 1 where the row recomputes cache entries a prefix hit already holds:
    // the compressed-cache writes of these rows must be skipped (they rebuild SWA state only).
    std::vector<int32_t> is_replay;
    // [seqs] per sequence.
    std::vector<int32_t> seq_slot, seq_start, seq_end;
    // First position whose SWA key the sequence holds (its replay start after a prefix hit, else 0):
    // attention reads no SWA key below it.
    std::vector<int32_t> seq_window_start;
    std::vector<int64_t> seq_rids;
    std::vector<int32_t> lookback;  // [seqs, lookback_len], most recent first, -1 before position 0
    // Overlapped scheduling: where a token of this plan is a sample of the previous step still on the
    // device, token_ids / lookback hold 0 and token_src [bucket] / lookback_src [seqs, lookback_len]
    // hold its sample row in that step (-1 elsewhere); the runtime copies it in on the device.
    std::vector<int32_t> token_src, lookback_src;
    std::vector<int32_t> ratios;
    std::vector<int32_t> table_widths;               // per ratio: pages_per_seq
    std::vector<std::vector<int32_t>> block_tables;  // per ratio: [seqs, width], -1 = unallocated
    // [outs] the rows whose logits are sampled (each sequence's last row when it
    // reaches the request's newest token; every row of a verify sequence), and their request ids.
    std::vector<int32_t> sample_rows;
    std::vector<int64_t> sample_rids;
    // [seqs] sequence s owns sample rows verify_start[s] .. verify_start[s] + verify_len[s] - 1 (indices
    // into sample_rows): 0 rows for a prefill chunk that samples nothing, 1 for a plain decode row or
    // a prompt's last chunk, 1 + k for a verify sequence [newest token, d_0 .. d_{k-1}] (the layout of
    // ops/spec_sampling.py spec_verify).
    std::vector<int32_t> verify_start, verify_len;
    // The verification planner's choice: drafts verified in total, the tokens it expects the verify
    // sequences to emit (N + the sum of the chosen cumulative acceptance probabilities; N without
    // confidences) and the curve's predicted step time (0 without a curve).
    int32_t num_verify_drafts = 0;
    double expected_tokens = 0;
    double predicted_ms = 0;
    std::vector<int64_t> preempted;  // requests preempted while planning this step

    int32_t num_seqs() const { return static_cast<int32_t>(seq_rids.size()); }
};

// One sequence of a step: rows for positions start..end-1 of a request. A
// verify sequence's last `drafts` rows hold the request's drafts.
struct Chunk {
    const Request *request;
    int32_t start;
    int32_t end;
    bool sample;
    int32_t drafts = 0;
};

// Fills the plan's arrays for these chunks (step, num_decode and preempted are
// the caller's). An empty chunk list gives an empty plan (bucket 0).
StepPlan build_plan(const std::vector<Chunk> &chunks, const SchedulerConfig &config,
                    const BucketTable &buckets);

}  // namespace dsgraph
