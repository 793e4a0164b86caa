// Configuration of the step scheduler: engine type, step limits, cache layout
// and the prefix cache's replay length. Plain data, validated once by
// validate_config(); the Python side builds it (runtime/scheduler.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsgraph {

enum class EngineType {
    kNormal,      // prefill and decode
    kPrompt,      // prefill only: a request finishes after its prompt and hands its caches off
    kCompletion,  // decode only: requests arrive with caches filled elsewhere (add_prefilled)
};

// How decode steps verify the drafts requests hold (speculative decoding).
enum class VerifyMode {
    kOff,         // requests hold no drafts: one decode row each
    kConfidence,  // the confidence planner chooses the drafts (needs a throughput curve)
    kFixed,       // every request verifies min(draft_len, drafts held)
};

struct SchedulerConfig {
    EngineType engine_type = EngineType::kNormal;
    int32_t max_num_seqs = 8;              // requests holding a state slot at once (and sequences per step)
    int32_t max_num_batched_tokens = 256;  // real rows per step
    int32_t max_model_len = 4096;          // prompt + output tokens
    int32_t page_size = 64;                // entries per page of a compressed cache
    std::vector<int32_t> ratios = {1, 2};  // compression ratios with a paged cache, increasing
    std::vector<int32_t> num_pages = {256, 256};  // pages per ratio
    int32_t num_slots = 8;                        // state slots (SWA rings + compressor state)
    std::vector<int64_t> buckets = {256};         // padded token counts of a step (BucketTable)
    int32_t lookback_len = 3;                     // Engram lookback tokens per sequence
    int32_t vocab_size = 0;                       // token ids must be < vocab_size; 0 skips the check
    bool enable_prefix_cache = true;
    // Tokens of a prefix hit recomputed to rebuild the SWA state, which is never
    // cached (spec 5.6 item 1): the sliding window for the bounded approximation,
    // window * num_layers for a result equal to a cold run.
    int32_t replay_tokens = 0;
    VerifyMode verify_mode = VerifyMode::kOff;
    // Drafts a request may hold; its verify rows write positions a..a+nextn, so nextn must stay below
    // the model's rollback room (models/deepseek_v41/step_io.py ROLLBACK_ROOM; Python checks it).
    int32_t nextn = 5;
    int32_t draft_len = 5;  // kFixed: drafts verified per request (0..nextn)
};

// Throws std::invalid_argument naming the first bad field, its value and the
// expected range.
void validate_config(const SchedulerConfig &config);

// Blocks of ratio r a sequence of max_model_len tokens can need: the width of
// block_table_r{r} (models/deepseek_v41/step_io.py CacheGeometry.pages_per_seq).
int32_t pages_per_seq(const SchedulerConfig &config, int32_t ratio);

// Pages of ratio r that hold the entries of the first `tokens` tokens (an entry
// exists once its group of r tokens is complete).
int32_t pages_needed(int64_t tokens, int32_t ratio, int32_t page_size);

std::string engine_type_name(EngineType type);
std::string verify_mode_name(VerifyMode mode);

}  // namespace dsgraph
